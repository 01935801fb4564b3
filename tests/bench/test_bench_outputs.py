"""What ``specpipe bench`` writes for production questions: percentiles marked when too few requests
back them, the machine's facts, the GenAI-Perf profile export, exact-length synthetic prompts and the
Triton request of ``--ignore-eos``."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
from pathlib import Path

import pytest
from tiny_engine import tiny_tokenizer

import specpipe
from specpipe.bench.backend_base import Sampling
from specpipe.bench.backends import TritonBackend
from specpipe.bench.endpoints import Endpoint
from specpipe.bench.export import profile_export
from specpipe.bench.machine import machine_facts
from specpipe.bench.records import LevelResult, RequestRecord
from specpipe.bench.report import to_json, write_results
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.stats import MIN_REQUESTS, Distribution
from specpipe.bench.synthetic import synthetic_prompts
from specpipe.bench.table import comparison_table
from specpipe.client.llm import GenerationResult
from specpipe.client.request import build_inputs
from specpipe.errors import SpecpipeError


def _records(name: str, count: int, rate: float | None = None) -> list[RequestRecord]:
    return [
        RequestRecord(
            deployment=name,
            concurrency=1,
            index=i,
            prompt_id=f"p{i % 2}",
            start_s=0.5 * i,
            latency_s=0.4,
            ttft_s=0.1,
            output_tokens=4,
            text="abcd",
            chunk_times_s=[0.1, 0.2, 0.3],
            chunk_texts=["a", "bc", "d"],
        )
        for i in range(count)
    ]


def _run(count: int) -> BenchRun:
    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=(1,), max_tokens=4, num_requests=count))
    run.levels = [
        LevelResult("baseline", 1, records=_records("baseline", count), origin_unix_ns=1_700_000_000_000_000_000)
    ]
    run.deployments = [{"name": "baseline", "kind": "triton", "address": "127.0.0.1:8001"}]
    run.prompts = {"p0": "first prompt", "p1": "second prompt"}
    return run


def test_percentiles_need_their_requests():
    assert MIN_REQUESTS == {"p50": 10, "p90": 20, "p99": 100}
    assert Distribution.of(range(9)).thin == ("p50", "p90", "p99")
    assert Distribution.of(range(12)).thin == ("p90", "p99")
    assert Distribution.of(range(20)).thin == ("p99",)
    assert Distribution.of(range(100)).thin == ()
    assert Distribution.of([]).thin == ()


def _table_text(run: BenchRun) -> str:
    from rich.console import Console

    console = Console(record=True, width=260)
    console.print(comparison_table(run))
    return console.export_text()


def test_thin_percentiles_are_marked_in_the_table_and_flagged_in_the_json():
    thin = _run(12)
    text = _table_text(thin)
    assert "100 / 100* / 100*" in text  # TTFT p50 / p90 / p99 of 12 requests
    assert "*: from fewer requests than the percentile needs (p50 10, p90 20, p99 100)" in " ".join(text.split())
    aggregate = json.loads(json.dumps(to_json(thin)))["results"][0]["aggregate"]
    assert aggregate["ttft_ms"]["thin"] == ["p90", "p99"] and aggregate["e2e_ms"]["thin"] == ["p90", "p99"]
    enough = _run(100)
    assert "*" not in _table_text(enough) and to_json(enough)["results"][0]["aggregate"]["ttft_ms"]["thin"] == ()


def test_bench_json_records_the_machine():
    facts = machine_facts()
    assert facts["cpu_logical_cores"] == os.cpu_count()
    assert facts["python"] == platform.python_version()
    assert facts["packages"]["specpipe"] == specpipe.__version__ and facts["packages"]["torch"]
    assert facts["memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert isinstance(facts["gpus"], list) and facts["os"] == platform.platform()
    here = Path(specpipe.__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    if head.returncode == 0:
        assert facts["git"]["commit"] == head.stdout.strip()
    assert to_json(_run(2))["machine"] == facts


def test_profile_export_has_genai_perf_request_records(tmp_path):
    run = _run(3)
    paths = write_results(run, tmp_path)
    data = json.loads(paths["profile_export-baseline.json"].read_text())
    assert data == profile_export(run, run.deployments[0])
    assert data["service_kind"] == "triton" and data["endpoint"] == "127.0.0.1:8001"
    (experiment,) = data["experiments"]
    assert experiment["experiment"] == {"mode": "concurrency", "value": 1}
    origin = 1_700_000_000_000_000_000
    for i, request in enumerate(experiment["requests"]):
        sent = origin + round(0.5 * i * 1e9)
        assert request["timestamp"] == sent
        assert request["request_inputs"] == {
            "text_input": ["first prompt", "second prompt"][i % 2],
            "max_tokens": 4,
            "stream": True,
        }
        # TTFT 0.1 s, then the pieces at 0.2 and 0.3 s, and the final (empty) response at the latency, 0.4 s
        assert request["response_timestamps"] == [
            sent + 100_000_000,
            sent + 200_000_000,
            sent + 300_000_000,
            sent + 400_000_000,
        ]
        assert [o["text_output"] for o in request["response_outputs"]] == ["a", "bc", "d", ""]
    rate = _run(2)
    rate.levels[0].request_rate = 2.5
    rate.levels[0].records.append(RequestRecord("baseline", 1, 9, "p0", 0.0, 0.1, error="boom"))
    (experiment,) = profile_export(rate, rate.deployments[0])["experiments"]
    assert experiment["experiment"] == {"mode": "request_rate", "value": 2.5} and len(experiment["requests"]) == 2


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    tiny_tokenizer().save_pretrained(root)
    return root


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_synthetic_prompts_have_exactly_the_length(tokenizer_dir, length):
    tokenizer = tiny_tokenizer()
    prompts = synthetic_prompts(length, str(tokenizer_dir), 6)
    assert [len(tokenizer.encode(p.text, add_special_tokens=False)) for p in prompts] == [length] * 6
    assert len({p.text for p in prompts}) == 6 and [p.id for p in prompts] == [f"synthetic-{i}" for i in range(6)]


def test_synthetic_prompts_need_a_loadable_tokenizer(tmp_path):
    with pytest.raises(SpecpipeError, match="pass --tokenizer"):
        synthetic_prompts(8, str(tmp_path / "missing"), 2)


class _CapturingClient:
    def __init__(self):
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return GenerationResult(
            text="x", chunks=["x"], chunk_times_s=[0.01], ttft_s=0.01, latency_s=0.02, perf={"num_output_tokens": 1}
        )


def _triton_send(sampling: Sampling, seed=None):
    backend = TritonBackend(Endpoint("b", "triton", "127.0.0.1:1", "ensemble", None), sampling=sampling)
    backend.client = _CapturingClient()
    asyncio.run(backend.send("hello", 8, seed=seed))
    return backend.client.requests[0]


def test_triton_ignore_eos_sends_min_tokens_of_max_tokens_and_sampling_fields():
    request = _triton_send(Sampling(temperature=0.5, top_p=0.8, ignore_eos=True), seed=17)
    assert (request.min_tokens, request.end_id, request.temperature, request.top_p, request.seed) == (
        8,
        None,
        0.5,
        0.8,
        17,
    )
    tensors = {t.name(): t for t in build_inputs(request, batched=True)}
    assert tensors["min_tokens"].datatype() == "INT32" and tensors["seed"].datatype() == "UINT64"
    greedy = _triton_send(Sampling())
    assert (greedy.min_tokens, greedy.temperature, greedy.top_p, greedy.seed) == (None, None, None, None)
