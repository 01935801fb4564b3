"""Cold start (model load times from Triton's log, warm-up of both runtimes' repositories), the bench's
first-request TTFT, the memory of a local server's process tree, and the plot's lines or bars."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from specpipe.bench.process_memory import is_local_host, local_server_pid, tree_memory
from specpipe.bench.records import LevelResult, RequestRecord
from specpipe.bench.report import plot_figure
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.table import first_ttft_line
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.serve.cold_start import ColdStart, model_load_times
from specpipe.triton.config import read_config
from specpipe.triton.warmup_config import WARMUP_DIR, add_engine_warmup
from specpipe.triton.writer import Repository, write_repository

LOG = """\
I1130 22:16:57.364212 17157 model_lifecycle.cc:472] "loading: postprocessing:1"
I1130 22:16:57.364314 17157 model_lifecycle.cc:472] "loading: tensorrt_llm:1"
I1130 22:17:36.805734 17157 model_lifecycle.cc:839] "successfully loaded 'postprocessing'"
I1130 22:17:47.817973 17157 tensorrt_llm_cpu.py:156] "specpipe CPU engine 'x' loaded from /e"
I1130 22:17:47.818250 17157 model_lifecycle.cc:839] "successfully loaded 'tensorrt_llm'"
I1130 22:17:47.818714 17157 model_lifecycle.cc:472] "loading: ensemble:1"
I1130 22:17:47.819176 17157 model_lifecycle.cc:839] "successfully loaded 'ensemble'"
I1130 22:17:48.000000 17157 model_lifecycle.cc:472] "loading: broken:1"
"""


def test_model_load_times_from_the_triton_log():
    times = model_load_times(LOG)
    assert list(times) == ["postprocessing", "tensorrt_llm", "ensemble"]  # 'broken' never finished loading
    assert times["postprocessing"] == pytest.approx(39.441, abs=1e-3)
    assert times["tensorrt_llm"] == pytest.approx(50.454, abs=1e-3)
    line = ColdStart(52.3, times).summary()
    assert line.startswith("ready in 52.3 s (model load: tensorrt_llm 50.5 s, postprocessing 39.4 s")


def test_tensorrtllm_models_get_a_model_warmup_with_its_data_files(tmp_path):
    config = mc.ModelConfig(name="tensorrt_llm", backend="tensorrtllm", max_batch_size=4)
    files = add_engine_warmup(config)
    root = write_repository(tmp_path / "repo", Repository({"tensorrt_llm": config}, {}, files))
    back = read_config(root / "tensorrt_llm" / "config.pbtxt")
    (warmup,) = back.model_warmup
    assert warmup.batch_size == 1 and set(warmup.inputs) == {"input_ids", "input_lengths", "request_output_len"}
    values = {}
    for name, spec in warmup.inputs.items():
        assert spec.data_type == mc.TYPE_INT32
        data = np.frombuffer((root / "tensorrt_llm" / WARMUP_DIR / spec.input_data_file).read_bytes(), dtype="<i4")
        assert list(spec.dims) == [data.size]
        values[name] = data
    assert values["input_lengths"].tolist() == [values["input_ids"].size] and values["request_output_len"][0] >= 1


def test_cpu_warm_up_runs_the_engine_and_leaves_it_serving(tmp_path, single_thread):
    from tiny_engine import make_tiny_engine

    from specpipe.generation.api import SamplingParams
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.triton.models.warmup import warm_up_deployment

    engine, _ = load_engine(make_tiny_engine(tmp_path, method="ngram", max_draft_len=3, max_position_embeddings=64))
    prompt, params = [5, 6, 7, 8], SamplingParams(max_tokens=6)
    before = generate_all(solo_scheduler(engine), prompt, params)[0]
    lines = []
    seconds = warm_up_deployment(engine, lines.append, lengths=(4, 200), max_tokens=4)  # 200 is capped to the context
    assert seconds > 0 and len(lines) == 1 and "warmed up" in lines[0]
    assert generate_all(solo_scheduler(engine), prompt, params)[0] == before


def test_local_server_memory_is_its_process_tree():
    assert is_local_host("localhost") and is_local_host("127.0.0.1") and is_local_host("[::1]")
    assert not is_local_host("10.1.2.3") and not is_local_host("example.com")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert local_server_pid(f"localhost:{port}") == os.getpid()
    assert local_server_pid("example.com:8001") is None
    assert tree_memory(os.getpid()) > 10 * 2**20


def _run(concurrencies: list[int]) -> BenchRun:
    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=tuple(concurrencies)))
    run.deployments = [
        {"name": "baseline", "first_request": {"ttft_ms": 812.4, "latency_ms": 4000.0, "error": None}},
        {"name": "eagle", "first_request": {"ttft_ms": 990.0, "latency_ms": 3000.0, "error": None}},
    ]
    for name in ("baseline", "eagle"):
        for c in concurrencies:
            records = [
                RequestRecord(name, c, i, "p", start_s=0.0, latency_s=2.0, ttft_s=0.1 * c, output_tokens=64)
                for i in range(c)
            ]
            run.levels.append(LevelResult(name, c, records=records, memory_peak_bytes=2**30, memory_kind="process"))
    return run


def test_first_request_ttft_is_reported_apart_from_the_steady_state():
    assert first_ttft_line(_run([1])) == "first request TTFT ms (table: steady state): baseline 812, eagle 990"


@pytest.mark.parametrize("concurrencies, bars", [([1], True), ([1, 4], False)])
def test_plot_draws_lines_against_concurrency_or_bars_for_one_level(concurrencies, bars):
    figure = plot_figure(_run(concurrencies))
    for ax in figure.axes:
        assert (len(ax.patches) == 2) is bars
        assert (len(ax.lines) == 2) is (not bars)
