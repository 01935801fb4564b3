"""``specpipe bench --input-len/--output-len/--ignore-eos`` and ``--request-rate`` against a real tiny CPU
deployment (a real Triton server): exact prompt and answer lengths, open-loop arrivals, seeds."""

import json

import pytest
from click.testing import CliRunner
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.cli import main
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e

INPUT_LEN, OUTPUT_LEN = 12, 48


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lengths")
    # seed 2: greedy answers of this random model meet its EOS early for some synthetic prompts
    engine = make_tiny_engine(root / "engines", "tiny", method="ngram", seed=2, max_position_embeddings=128)
    running = LocalTritonServer(
        package_engine(engine, root / "repo"),
        free_port(),
        free_port(),
        free_port(),
        log_path=root / "server.log",
        ready_timeout_s=300,
    )
    running.start()
    try:
        running.wait_ready(300)
        yield running
    finally:
        running.stop()


def _bench(server, out, *extra, metrics="none"):
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--url",
            f"baseline={server.grpc_url}",
            "--metrics",
            f"baseline={metrics}",
            "--input-len",
            str(INPUT_LEN),
            "--output-len",
            str(OUTPUT_LEN),
            "--num-requests",
            "8",
            "--warmup",
            "0",
            "--out",
            str(out),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / "bench.json").read_text())


def test_ignore_eos_gives_exactly_output_len_tokens_for_prompts_of_input_len(server, tmp_path):
    plain = _bench(server, tmp_path / "plain", "--concurrency", "2")
    assert all(r["input_tokens"] == INPUT_LEN for r in plain["records"])  # the server's own count of the prompt
    assert min(r["output_tokens"] for r in plain["records"]) < OUTPUT_LEN  # without it, EOS ends some answers

    exact = _bench(server, tmp_path / "exact", "--concurrency", "2", "--ignore-eos")
    assert exact["settings"]["ignore_eos"] is True and exact["settings"]["prompts"] == f"synthetic {INPUT_LEN} tokens"
    assert [(r["input_tokens"], r["output_tokens"], r["output_tokens_source"]) for r in exact["records"]] == [
        (INPUT_LEN, OUTPUT_LEN, "server")
    ] * 8


def test_open_loop_sampled_run_on_a_real_server(server, tmp_path):
    data = _bench(
        server,
        tmp_path / "rate",
        "--request-rate",
        "4",
        "--max-concurrency",
        "2",
        "--ignore-eos",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "7",
    )
    (result,) = data["results"]
    assert (result["request_rate"], result["concurrency"]) == (4.0, 2)  # offered
    achieved = result["aggregate"]["request_throughput"]
    assert achieved == pytest.approx(8 / result["aggregate"]["duration_s"]) and 0 < achieved
    records = data["records"]
    assert [r["seed"] for r in records] == [7 + i for i in range(8)]
    assert all(r["output_tokens"] == OUTPUT_LEN and r["scheduled_s"] <= r["start_s"] for r in records)
    assert len({r["text"] for r in records}) > 1
    export = json.loads((tmp_path / "rate" / "profile_export-baseline.json").read_text())
    (experiment,) = export["experiments"]
    assert experiment["experiment"] == {"mode": "request_rate", "value": 4.0} and len(experiment["requests"]) == 8
    assert all(q["response_timestamps"][0] > q["timestamp"] for q in experiment["requests"])


def test_per_position_acceptance_from_the_cpu_models_counters(server, tmp_path):
    data = _bench(server, tmp_path / "counted", "--concurrency", "1", "--ignore-eos", metrics=server.metrics_url)
    (result,) = data["results"]
    counters, agg = result["counters"], result["aggregate"]
    assert counters["source"] == "specpipe-triton" and counters["drafts"] > 0
    # the counters' accepted tokens are the perf outputs' over the same requests
    assert counters["accepted_draft_tokens"] == sum(r["accepted_draft_tokens"] for r in data["records"])
    by_position = agg["acceptance_by_position"]
    assert by_position and all(0.0 <= a <= 1.0 for a in by_position)
    assert by_position == sorted(by_position, reverse=True)  # accepting position k needs every position before it
    accepted = sum(float(v) for v in counters["accepted_per_position"].values())
    assert accepted == counters["accepted_draft_tokens"]
    # the mean accepted length from the forwards the deployment counted (no end id: generated = sent)
    records = data["records"]
    assert all(r["target_forwards"] + r["accepted_draft_tokens"] == r["output_tokens"] for r in records)
    assert agg["accepted_length_source"] == "target forwards"
    forwards = sum(r["target_forwards"] - 1 for r in records)
    assert agg["mean_accepted_length"] == pytest.approx(
        (forwards + sum(r["accepted_draft_tokens"] for r in records)) / forwards
    )
