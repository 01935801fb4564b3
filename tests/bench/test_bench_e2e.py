"""A short real ``specpipe bench`` against CPU deployments of tiny engines (real Triton servers)."""

import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.bench.endpoints import parse_endpoints
from specpipe.bench.prompts import load_prompts
from specpipe.bench.report import write_results
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.cli import main
from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e

PROMPTS = ["The quick brown fox", "Countries and their capitals: France - Paris,", "1 2 3 4 5 6"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "short.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def _serve(root, name, method):
    engine = make_tiny_engine(root / "engines", name, method=method)
    repo = package_engine(engine, root / "repo" / name)
    return LocalTritonServer(
        repo, free_port(), free_port(), free_port(), log_path=root / f"{name}.log", ready_timeout_s=300
    )


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    running = {"baseline": _serve(root, "baseline", "none"), "ngram": _serve(root, "ngram", "ngram")}
    for server in running.values():
        server.start()
    try:
        for server in running.values():
            server.wait_ready(300)
            _wait_for_memory_figure(server.metrics_url)
        yield running
    finally:
        for server in running.values():
            server.stop()


def _wait_for_memory_figure(url, timeout_s=60):
    """Triton fills its CPU memory gauge at its first metrics poll (every 2 s by default). Its metrics
    port already answers: ``wait_ready`` waits for it."""
    import urllib.request

    from specpipe.bench.metrics import memory_used, parse_samples

    deadline = time.monotonic() + timeout_s
    while memory_used(parse_samples(urllib.request.urlopen(url, timeout=5).read().decode())) is None:
        assert time.monotonic() < deadline, f"no memory figure at {url}"
        time.sleep(0.5)


def _plain(url, prompt):
    """Non-streamed greedy text and perf outputs of one request."""

    async def go():
        async with LLMClient(url) as client:
            return await client.generate(GenerationRequest(prompt, max_tokens=MAX_TOKENS))

    return run_sync(go())


def test_bench_table_json_csv_and_plot_are_consistent(servers, prompts_file, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--url",
            f"baseline={servers['baseline'].grpc_url}",
            "--url",
            f"ngram={servers['ngram'].grpc_url}",
            "--metrics",
            f"baseline={servers['baseline'].metrics_url}",
            "--metrics",
            f"ngram={servers['ngram'].metrics_url}",
            "--prompts",
            str(prompts_file),
            "--concurrency",
            "1,2",
            "--num-requests",
            "3",
            "--max-tokens",
            str(MAX_TOKENS),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith("│ baseline") or line.startswith("│ ngram")]
    assert len(table) == 4 and "speed-up" in result.output and table[0].count("1.00x") == 1

    data = json.loads((out / "bench.json").read_text())
    assert data["incomplete"] is False and [d["name"] for d in data["deployments"]] == ["baseline", "ngram"]
    assert all(d["first_request"]["ttft_ms"] > 0 for d in data["deployments"])  # the first request, apart
    expected = {name: {p: _plain(servers[name].grpc_url, p) for p in PROMPTS} for name in servers}
    for record in data["records"]:
        assert record["error"] is None
        assert 0 < record["ttft_s"] <= record["latency_s"]
        assert record["output_tokens_source"] == "server" and 1 <= record["output_tokens"] <= MAX_TOKENS
        assert 1 <= record["chunks"] <= record["output_tokens"]
        plain = expected[record["deployment"]][PROMPTS[int(record["prompt_id"][1:])]]
        assert record["text"] == plain.text  # greedy: the streamed text is the whole answer
        assert record["output_tokens"] == plain.perf["num_output_tokens"]  # and its token count is the server's
        if record["deployment"] == "baseline":
            assert (
                record["draft_tokens"] == 0
                and record["acceptance_rate"] is None
                and record["mean_accepted_length"] in (None, 1.0)
            )
        else:
            assert 0 <= record["accepted_draft_tokens"] <= record["draft_tokens"]
            assert record["acceptance_rate"] is None or 0.0 <= record["acceptance_rate"] <= 1.0

    results = {(r["deployment"], r["concurrency"]): r for r in data["results"]}
    assert sorted(results) == [("baseline", 1), ("baseline", 2), ("ngram", 1), ("ngram", 2)]
    for (name, concurrency), entry in results.items():
        agg = entry["aggregate"]
        records = [r for r in data["records"] if r["deployment"] == name and r["concurrency"] == concurrency]
        assert agg["completed"] == 3 and agg["errors"] == 0 and len(records) == 3
        assert agg["output_tokens"] == sum(r["output_tokens"] for r in records)
        window = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
        assert agg["output_token_throughput"] == pytest.approx(agg["output_tokens"] / window)
        assert agg["ttft_ms"]["p50"] <= agg["e2e_ms"]["p50"] and agg["ttft_ms"]["max"] <= agg["e2e_ms"]["max"]
        # a local server: its own process tree (tritonserver + Python stubs), not the host's memory in use
        assert entry["memory_kind"] == "process" and 2**20 < entry["memory_peak_bytes"] < _host_used_bytes()
        if name == "ngram":
            assert agg["acceptance_rate"] is None or 0.0 <= agg["acceptance_rate"] <= 1.0
            assert agg["mean_accepted_length"] >= 1.0
            base = results["baseline", concurrency]["aggregate"]["output_token_throughput"]
            assert entry["speedup_vs_baseline"] == pytest.approx(agg["output_token_throughput"] / base)
        else:
            assert entry["speedup_vs_baseline"] == 1.0 and agg["mean_accepted_length"] == 1.0

    csv_lines = (out / "bench.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("deployment,concurrency,")
    from matplotlib.image import imread

    image = imread(out / "bench.png")
    assert image.shape[0] >= 400 and image.shape[1] >= 1000 and image.std() > 0.05


def test_bench_refuses_bad_deployments_clearly(servers, prompts_file, tmp_path):
    runner = CliRunner()
    base = [
        "bench",
        "--prompts",
        str(prompts_file),
        "--num-requests",
        "1",
        "--max-tokens",
        "2",
        "--out",
        str(tmp_path / "none"),
    ]
    cases = [
        (["--url", f"gone=localhost:{free_port()}"], "cannot reach deployment 'gone' at localhost:"),
        (
            ["--url", f"pre={servers['ngram'].grpc_url}", "--model", "preprocessing"],
            "model 'preprocessing' of deployment 'pre' is not a TensorRT-LLM-style ensemble (no text_input, max_tokens, stream, text_output)",
        ),
        (
            ["--url", f"x={servers['ngram'].grpc_url}", "--model", "nope"],
            "has no ready model 'nope' (models: ensemble, postprocessing",
        ),
        (
            ["--url", f"grpc=openai://{servers['ngram'].grpc_url}/v1"],
            f"deployment 'grpc' (--url grpc=openai://...): {servers['ngram'].grpc_url} answers HTTP/2 as gRPC servers do",
        ),
        (
            ["--url", f"metrics={servers['ngram'].metrics_url.split('/')[2]}"],
            "answers plain HTTP, not gRPC (it is Triton's HTTP or metrics port",
        ),
    ]
    for args, message in cases:
        result = runner.invoke(main, base + args)
        assert result.exit_code == 1 and message in result.output, result.output
    result = runner.invoke(main, base + ["--url", f"x={servers['ngram'].grpc_url}", "--concurrency", "0"])
    assert result.exit_code == 2 and "'--concurrency': must list positive integers" in result.output, result.output
    assert not (tmp_path / "none").exists()  # nothing was measured, nothing written


def test_openai_deployment_in_the_same_table(servers, prompts_file, tmp_path):
    from specpipe.openai.http_server import GatewayServer
    from specpipe.openai.server import Gateway

    with GatewayServer(Gateway(servers["ngram"].grpc_url, "tiny-ngram"), free_port()) as gateway:
        endpoint = gateway.url.replace("http://", "openai://")
        result = CliRunner().invoke(
            main,
            [
                "bench",
                "--url",
                f"baseline={servers['baseline'].grpc_url}",
                "--url",
                f"gw={endpoint}",
                "--prompts",
                str(prompts_file),
                "--concurrency",
                "1",
                "--num-requests",
                "3",
                "--max-tokens",
                str(MAX_TOKENS),
                "--out",
                str(tmp_path),
            ],
        )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    gw = [r for r in data["records"] if r["deployment"] == "gw"]
    assert len(gw) == 3 and all(r["output_tokens_source"] == "usage" and r["error"] is None for r in gw)
    plain = {p: _plain(servers["ngram"].grpc_url, p) for p in PROMPTS}
    for record in gw:
        expected = plain[PROMPTS[int(record["prompt_id"][1:])]]
        assert record["text"] == expected.text and record["output_tokens"] == expected.perf["num_output_tokens"]
    entry = [r for r in data["results"] if r["deployment"] == "gw"][0]
    assert entry["counters"]["source"] == "specpipe" and entry["counters"]["requests"] == 3
    assert entry["aggregate"]["acceptance_source"] == "server counters"
    assert entry["counters"]["output_tokens"] == sum(r["output_tokens"] for r in gw)
    assert [d["kind"] for d in data["deployments"]] == ["triton", "openai"] and data["deployments"][1][
        "model"
    ] == "tiny-ngram"


def test_server_dying_mid_run_keeps_partial_results(prompts_file, tmp_path):
    server = _serve(tmp_path, "doomed", "ngram")
    prompts, label = load_prompts(str(prompts_file))
    settings = BenchSettings(
        prompts=label, concurrencies=(1, 2), max_tokens=MAX_TOKENS, num_requests=400, warmup=0, timeout_s=60
    )
    run = BenchRun(settings=settings)
    with server:

        def crash() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (run.levels and len(run.levels[0].records) >= 2):
                time.sleep(0.05)
            os.killpg(server.process.pid, signal.SIGKILL)  # the server and its backend stubs, as in a crash

        killer = threading.Thread(target=crash)
        killer.start()
        import asyncio

        asyncio.run(run_bench(parse_endpoints([f"doomed={server.grpc_url}"]), prompts, settings, run))
        killer.join()
    assert run.incomplete and "the server stopped answering" in run.reasons[0] and "were not run" in run.reasons[0]
    assert len(run.levels) == 1 and run.levels[0].incomplete  # concurrency 2 never started
    records = run.levels[0].records
    assert 2 <= len(records) < 400 and records[-1].error is not None and records[0].error is None
    data = json.loads(write_results(run, tmp_path / "out")["bench.json"].read_text())
    assert data["incomplete"] is True and data["results"][0]["incomplete"] is True
    assert data["results"][0]["aggregate"]["completed"] >= 2 and (tmp_path / "out" / "bench.png").is_file()


def _host_used_bytes() -> int:
    import psutil

    memory = psutil.virtual_memory()
    return memory.total - memory.available
