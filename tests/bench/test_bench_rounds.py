"""``specpipe bench --rounds``: deployments take turns within each load level, so a machine whose speed
drifts during the run slows every deployment alike and the speed-ups stay fair."""

from __future__ import annotations

import asyncio

import pytest

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.prompts import Prompt
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.bench.stats import level_aggregate
from specpipe.client.llm import GenerationResult

PROMPTS = [Prompt(f"p{i}", f"prompt {i}") for i in range(3)]


class DriftingMachine:
    """Every request served makes the next one slower: a machine whose speed drifts over the run."""

    def __init__(self, step_s: float = 0.004, drift: float = 0.05):
        self.served, self.step_s, self.drift = 0, step_s, drift

    async def serve(self, tokens: int) -> float:
        seconds = self.step_s * tokens * (1.0 + self.drift * self.served)
        self.served += 1
        await asyncio.sleep(seconds)
        return seconds


class FakeBackend:
    """A deployment of ``tokens_per_step`` tokens per step on the shared machine (same interface as
    :mod:`specpipe.bench.backends`)."""

    def __init__(self, name: str, machine: DriftingMachine, tokens_per_step: float = 1.0):
        self.endpoint = Endpoint(name, "triton", f"fake-{name}:1", "ensemble", None)
        self.machine, self.tokens_per_step, self.prompts_seen = machine, tokens_per_step, []

    async def open(self):
        pass

    async def close(self):
        pass

    async def preflight(self) -> dict:
        return {}

    async def alive(self) -> bool:
        return True

    async def send(self, text: str, max_tokens: int):
        self.prompts_seen.append(text)
        seconds = await self.machine.serve(round(max_tokens / self.tokens_per_step))
        result = GenerationResult(
            text="x" * max_tokens, chunks=["x" * max_tokens], chunk_times_s=[seconds], ttft_s=seconds, latency_s=seconds
        )
        return result, max_tokens, "server"


def _bench(rounds: int, num_requests: int = 8, concurrencies=(1, 2)):
    machine = DriftingMachine()
    backends = [FakeBackend("baseline", machine), FakeBackend("same", machine)]
    settings = BenchSettings(
        prompts="fake",
        concurrencies=tuple(concurrencies),
        max_tokens=8,
        num_requests=num_requests,
        warmup=0,
        rounds=rounds,
    )
    run = BenchRun(settings=settings)
    asyncio.run(run_bench([b.endpoint for b in backends], PROMPTS, settings, run, backends=backends))
    return run, backends


def _speedup(run: BenchRun, concurrency: int) -> float:
    rate = {
        lv.deployment: level_aggregate(lv).output_token_throughput for lv in run.levels if lv.concurrency == concurrency
    }
    return rate["same"] / rate["baseline"]


def test_one_after_another_a_drifting_machine_favours_the_first_deployment():
    run, _ = _bench(rounds=1)
    assert _speedup(run, 1) < 0.8  # two identical deployments, and yet


@pytest.mark.parametrize("rounds", [4, 8])
def test_in_rounds_identical_deployments_measure_alike(rounds):
    run, backends = _bench(rounds=rounds)
    assert [(lv.deployment, lv.concurrency) for lv in run.levels] == [
        ("baseline", 1),
        ("same", 1),
        ("baseline", 2),
        ("same", 2),
    ]
    assert 0.9 < _speedup(run, 1) < 1.1 and 0.9 < _speedup(run, 2) < 1.1
    for level in run.levels:  # every level complete, its requests numbered on across rounds, prompts in order
        assert [r.index for r in level.records] == list(range(8)) and not level.incomplete
        assert [r.prompt_id for r in level.records] == [f"p{i % 3}" for i in range(8)]
        starts = sorted(r.start_s for r in level.records)
        assert starts[0] >= 0 and all(r.end_s <= max(x.end_s for x in level.records) for r in level.records)
    assert backends[0].prompts_seen == backends[1].prompts_seen


def test_round_plans_split_requests_and_durations():
    settings = BenchSettings(prompts="fake", concurrencies=(1, 8), num_requests=10, rounds=4)
    assert [p.num_requests for p in settings.round_plans(1)] == [3, 3, 2, 2]
    few = BenchSettings(prompts="fake", concurrencies=(1,), num_requests=2, rounds=4)
    assert [p.num_requests for p in few.round_plans(1)] == [1, 1]
    # every round keeps the level's concurrency busy: at most requests // concurrency rounds
    assert [p.num_requests for p in settings.round_plans(4)] == [5, 5]
    assert [p.num_requests for p in settings.round_plans(8)] == [10]
    assert [p.num_requests for p in BenchSettings(prompts="fake", concurrencies=(4,), rounds=4).round_plans(4)] == [
        4
    ] * 4
    timed = BenchSettings(prompts="fake", concurrencies=(4,), duration_s=60.0, rounds=3)
    assert [(p.duration_s, p.num_requests, p.concurrency) for p in timed.round_plans(4)] == [(20.0, None, 4)] * 3


def test_a_multi_line_error_becomes_one_readable_line():
    from specpipe.bench.load import one_line

    error = '<AioRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "failed to connect"\n>'
    assert (
        one_line(error)
        == '<AioRpcError of RPC that terminated with: status = StatusCode.UNAVAILABLE details = "failed to connect" >'
    )
    assert len(one_line("x " * 500)) == 300 and one_line("x " * 500).endswith("...")


class DyingBackend(FakeBackend):
    """Answers ``lives`` requests, then its server is gone."""

    def __init__(self, name: str, machine: DriftingMachine, lives: int):
        super().__init__(name, machine)
        self.lives = lives

    async def alive(self) -> bool:
        return self.lives > 0

    async def send(self, text: str, max_tokens: int):
        self.lives -= 1
        if self.lives < 0:
            await asyncio.sleep(0.05)
            return (
                GenerationResult(
                    latency_s=0.05, error="<AioRpcError of RPC that terminated with:\n\tstatus = UNAVAILABLE\n>"
                ),
                None,
                "server",
            )
        return await super().send(text, max_tokens)


def test_a_server_dying_in_rounds_leaves_its_level_incomplete_and_no_speed_up():
    from specpipe.bench.report import rows

    machine = DriftingMachine()
    backends = [DyingBackend("baseline", machine, lives=5), FakeBackend("same", machine)]
    settings = BenchSettings(prompts="fake", concurrencies=(1, 2), max_tokens=8, num_requests=8, warmup=0, rounds=4)
    run = BenchRun(settings=settings)
    asyncio.run(run_bench([b.endpoint for b in backends], PROMPTS, settings, run, backends=backends))
    dead = [lv for lv in run.levels if lv.deployment == "baseline"]
    assert len(dead) == 1 and dead[0].incomplete and "status = UNAVAILABLE" in dead[0].reason
    assert run.incomplete and any("baseline" in reason for reason in run.reasons)
    same = [lv for lv in run.levels if lv.deployment == "same"]
    assert [lv.concurrency for lv in same] == [1, 2] and all(len(lv.records) == 8 for lv in same)
    assert all(row["speedup"] is None for row in rows(run))  # no baseline to compare with


def _level(name, records):
    from specpipe.bench.records import LevelResult

    return LevelResult(deployment=name, concurrency=1, records=records)


def _record(tokens=None, error=None):
    from specpipe.bench.records import RequestRecord

    return RequestRecord(
        deployment="d",
        concurrency=1,
        index=0,
        prompt_id="p",
        start_s=0.0,
        latency_s=0.1,
        output_tokens=tokens,
        error=error,
    )


@pytest.mark.parametrize("chat", [False, True])
def test_levels_that_measured_nothing_make_the_run_incomplete(chat):
    """A table of zeros is not a measurement: no request sent, every request failed, or every answer
    empty each mark their level and the run incomplete (so ``specpipe bench`` exits 1), naming why."""
    from specpipe.bench.job import mark_unmeasured
    from specpipe.bench.runner import BenchRun, BenchSettings

    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=(1,), chat=chat))
    run.levels = [
        _level("good", [_record(12), _record(0)]),
        _level("none", []),
        _level("failed", [_record(error="DEADLINE_EXCEEDED: timed out\nmore"), _record(error="x")]),
        _level("empty", [_record(0), _record(0)]),
    ]
    mark_unmeasured(run)
    assert [level.incomplete for level in run.levels] == [False, True, True, True]
    assert run.incomplete and len(run.reasons) == 3
    assert "none @ concurrency 1: no request was sent" in run.reasons[0]
    assert (
        "failed @ concurrency 1: all 2 requests failed; first error: DEADLINE_EXCEEDED: timed out more"
        == run.reasons[1]
    )
    assert run.reasons[2].startswith("empty @ concurrency 1: every answer was empty (0 output tokens)")
    assert ("needs --chat" in run.reasons[2]) is (not chat)
