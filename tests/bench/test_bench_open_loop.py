"""``specpipe bench --request-rate``: Poisson arrivals sent on schedule (open loop), the ``--max-concurrency``
cap, per-request seeds, and the offered / achieved rates in the report."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from click.testing import CliRunner

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.load import LoadPlan, arrival_times, run_level
from specpipe.bench.prompts import Prompt
from specpipe.bench.records import LevelResult
from specpipe.bench.report import plot_figure, to_json
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.bench.stats import level_aggregate
from specpipe.bench.table import comparison_table
from specpipe.cli import main
from specpipe.client.llm import GenerationResult

PROMPTS = [Prompt(f"p{i}", f"prompt {i}") for i in range(3)]


class SlowBackend:
    """Answers every request after ``service_s`` seconds; counts requests in flight and keeps the seeds."""

    def __init__(self, service_s: float = 0.2, name: str = "baseline"):
        self.endpoint = Endpoint(name, "triton", "fake:1", "ensemble", None)
        self.service_s, self.in_flight, self.most_in_flight, self.seeds, self.sent_at = service_s, 0, 0, [], []

    async def open(self):
        pass

    async def close(self):
        pass

    async def preflight(self) -> dict:
        return {}

    async def alive(self) -> bool:
        return True

    async def send(self, text: str, max_tokens: int, seed: int | None = None):
        self.seeds.append(seed)
        self.sent_at.append(time.perf_counter())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.service_s)
        self.in_flight -= 1
        result = GenerationResult(
            text="ab",
            chunks=["a", "b"],
            chunk_times_s=[self.service_s / 2, self.service_s],
            ttft_s=self.service_s / 2,
            latency_s=self.service_s,
        )
        return result, 2, "server"


def test_arrivals_are_poisson_at_the_rate_and_seeded():
    times = list(arrival_times(4.0, seed=7, count=20000))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)  # exponential: mean 1/R ...
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.05)  # ... and standard deviation 1/R
    assert list(arrival_times(4.0, seed=7, count=50)) == times[:50]
    assert list(arrival_times(4.0, seed=8, count=50)) != times[:50]
    timed = list(arrival_times(4.0, seed=7, duration_s=10.0))
    assert timed == [t for t in times if t < 10.0]


def _level(plan: LoadPlan, backend: SlowBackend) -> LevelResult:
    level = LevelResult("baseline", plan.concurrency, request_rate=plan.request_rate)
    return asyncio.run(run_level(backend, PROMPTS, plan, level))


def test_open_loop_sends_on_schedule_whatever_is_in_flight():
    backend = SlowBackend(service_s=0.3)
    plan = LoadPlan(concurrency=0, max_tokens=2, num_requests=12, request_rate=40.0, arrival_seed=3)
    level = _level(plan, backend)
    schedule = list(arrival_times(40.0, seed=3, count=12))
    assert [r.index for r in level.records] == list(range(12))
    assert [r.scheduled_s for r in level.records] == pytest.approx(schedule)
    assert all(0 <= r.start_s - r.scheduled_s < 0.05 for r in level.records)  # sent at its arrival, not later
    assert backend.most_in_flight >= 5  # 40 req/s x 0.3 s: a closed loop of 1 would never overlap
    assert level.request_rate == 40.0 and level.origin_unix_ns > 0
    agg = level_aggregate(level)
    assert agg.request_throughput == pytest.approx(12 / (max(r.end_s for r in level.records)), rel=0.01)


def test_max_concurrency_caps_open_loop_and_arrivals_wait():
    backend = SlowBackend(service_s=0.1)
    level = _level(LoadPlan(concurrency=2, max_tokens=2, num_requests=8, request_rate=100.0), backend)
    assert backend.most_in_flight == 2
    late = [r.start_s - r.scheduled_s for r in level.records]
    assert max(late) > 0.2  # 8 arrivals in ~0.08 s through 2 slots of 0.1 s: the last waits ~0.3 s
    assert all(r.concurrency == 2 for r in level.records)


def test_timed_open_loop_ends_arrivals_at_the_duration():
    backend = SlowBackend(service_s=0.05)
    level = _level(LoadPlan(concurrency=0, max_tokens=2, duration_s=0.5, request_rate=30.0, arrival_seed=1), backend)
    assert len(level.records) == len(list(arrival_times(30.0, seed=1, duration_s=0.5)))
    assert max(r.scheduled_s for r in level.records) < 0.5


def _run(settings: BenchSettings, backend: SlowBackend) -> BenchRun:
    run = BenchRun(settings=settings)
    endpoint = backend.endpoint
    return asyncio.run(run_bench([endpoint], PROMPTS, settings, run, backends=[backend]))


def test_rates_are_levels_with_offered_and_achieved_rates_in_the_report():
    settings = BenchSettings(
        prompts="chat",
        concurrencies=(1,),
        max_tokens=2,
        num_requests=6,
        warmup=0,
        request_rates=(5.0, 50.0),
        max_concurrency=4,
        seed=11,
    )
    run = _run(settings, SlowBackend(service_s=0.05))
    assert [(level.concurrency, level.request_rate) for level in run.levels] == [(4, 5.0), (4, 50.0)]
    data = to_json(run)
    assert [(r["request_rate"], r["concurrency"]) for r in data["results"]] == [(5.0, 4), (50.0, 4)]
    for result, level in zip(data["results"], run.levels):
        duration = max(r.end_s for r in level.records) - min(r.start_s for r in level.records)
        assert result["aggregate"]["request_throughput"] == pytest.approx(6 / duration)
    slow, fast = (r["aggregate"]["request_throughput"] for r in data["results"])
    assert slow < 6.5 < 10 < fast  # 6 arrivals at 5/s take about a second; at 50/s about 0.1 s + service
    from rich.console import Console

    console = Console(record=True, width=260)
    console.print(comparison_table(run))
    text = console.export_text()
    assert "offered req/s" in text and "max conc." in text and "5.00" in text and "50.00" in text
    throughput_axes = plot_figure(run).axes[0]
    assert throughput_axes.get_xlabel() == "offered request rate, requests/s"
    assert [t.get_text() for t in throughput_axes.get_xticklabels()] == ["5", "50"]


def test_a_request_seed_is_the_base_seed_plus_its_index_when_sampling():
    sampled = BenchSettings(
        prompts="chat", concurrencies=(2,), max_tokens=2, num_requests=5, warmup=0, temperature=0.8, seed=100
    )
    backend = SlowBackend(service_s=0.01)
    run = _run(sampled, backend)
    assert sorted(backend.seeds) == [100, 101, 102, 103, 104]
    assert [(r.index, r.seed) for r in run.levels[0].records] == [(i, 100 + i) for i in range(5)]
    greedy = BenchSettings(prompts="chat", concurrencies=(2,), max_tokens=2, num_requests=3, warmup=0, seed=100)
    backend = SlowBackend(service_s=0.01)
    run = _run(greedy, backend)
    assert backend.seeds == [None] * 3 and all(r.seed is None for r in run.levels[0].records)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--request-rate", "1", "--concurrency", "2"], "not both"),
        (["--max-concurrency", "2"], "--max-concurrency caps open-loop load"),
        (["--request-rate", "0"], "request rates above 0"),
        (["--request-rate", "nan"], "request rates above 0"),
        (["--input-len", "8", "--chat"], "drop --chat"),
        (["--output-len", "8", "--max-tokens", "4"], "--max-tokens or --output-len"),
        (["--top-p", "0"], "--top-p"),
    ],
)
def test_contradictory_load_options_are_refused(args, message, tmp_path):
    result = CliRunner().invoke(main, ["bench", "--url", "baseline=127.0.0.1:1", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "o").exists()
