"""The control rule (specpipe.bench.noise) on recorded levels: quiet runs keep their figures, a control that
differs by more than the noise allows (or a deployment whose rounds fell apart) turns figures into 'busy'."""

from __future__ import annotations

import asyncio
import csv
import json
import math

import pytest
from bench_levels import TOKENS, level

from specpipe.bench.noise import BUSY, CONTROL, NOISE, OK, QUIET, UNCHECKED, assess, round_ratios, round_throughputs
from specpipe.bench.records import LevelResult
from specpipe.bench.report import rows, write_results
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.bench.table import comparison_table


def quiet_levels(concurrency: int = 1) -> list[LevelResult]:
    return [
        level("baseline", [2.0] * 4, concurrency),
        level("ngram", [1.6] * 4, concurrency),
        level("control", [2.04] * 4, concurrency),
        level("medusa", [1.98] * 4, concurrency),
    ]


def test_per_round_throughput_is_paired_with_the_baseline_round():
    base, slow = level("baseline", [2.0, 1.0]), level("x", [4.0, 1.0])
    assert round_throughputs(base) == pytest.approx({0: 50.0, 1: 100.0})
    assert round_ratios(slow, base) == pytest.approx([0.5, 1.0])


def test_a_quiet_run_keeps_every_figure_and_marks_those_within_the_control_spread():
    report = assess(quiet_levels(), "baseline", "control")
    found = report.levels[1]
    assert found.verdict == QUIET and not report.busy and report.messages() == []
    assert found.control_ratio == pytest.approx(2.0 / 2.04)
    assert found.spreads["ngram"] == pytest.approx(1.0)
    assert report.figure("ngram", 1, 1.25) == OK
    assert report.figure("medusa", 1, 2.0 / 1.98) == NOISE  # 1.01x: closer to 1 than the control's 0.98x
    assert report.figure("control", 1, found.control_ratio) == CONTROL and report.figure("baseline", 1, 1.0) == OK


def test_a_control_beyond_ten_percent_makes_the_level_busy():
    levels = quiet_levels()
    levels[2] = level("control", [2.0, 2.0, 6.0, 2.0])  # a busy stretch during the control's third turn
    report = assess(levels, "baseline", "control")
    found = report.levels[1]
    assert found.verdict == BUSY and report.busy
    assert found.control_ratio == pytest.approx(8 / 12)
    assert found.spreads["control"] == pytest.approx(3.0)  # within the spread limit: the ratio alone decides
    assert set(found.busy) == {"ngram", "control", "medusa"}
    assert report.figure("ngram", 1, 1.25) == BUSY and report.figure("medusa", 1, 1.01) == BUSY
    (message,) = report.messages()
    assert "concurrency 1: the machine was too busy" in message and "measured 0.67x the baseline" in message


@pytest.mark.parametrize("ratio, busy", [(1.09, False), (1 / 1.09, False), (1.11, True), (1 / 1.11, True)])
def test_the_bound_is_ten_percent_either_way(ratio, busy):
    levels = [level("baseline", [2.0] * 4), level("control", [2.0 / ratio] * 4)]
    assert (assess(levels, "baseline", "control").levels[1].verdict == BUSY) is busy


def test_a_deployment_whose_rounds_fell_apart_is_busy_alone():
    levels = quiet_levels()
    levels[1] = level("ngram", [1.6, 1.6, 9.0, 1.6])  # 0.58x over the level: what one-after-another printed as a result
    report = assess(levels, "baseline", "control")
    found = report.levels[1]
    assert found.verdict == QUIET and report.busy and found.busy == ("ngram",)
    assert found.spreads["ngram"] == pytest.approx(9.0 / 1.6)
    assert report.figure("ngram", 1, 0.58) == BUSY and report.figure("medusa", 1, 2.0 / 1.98) == NOISE
    (message,) = report.messages()
    assert "busy during ngram's turns" in message and "0.22-1.25x the baseline's" in message


def test_a_control_whose_rounds_fell_apart_makes_the_level_busy():
    levels = quiet_levels()
    levels[2] = level("control", [1.0, 1.0, 5.0, 1.0])  # 1.00x over the level, yet one round at a fifth of the others
    found = assess(levels, "baseline", "control").levels[1]
    assert found.control_ratio == pytest.approx(1.0) and found.spreads["control"] == pytest.approx(5.0)
    assert found.verdict == BUSY and set(found.busy) == {"ngram", "control", "medusa"}


def test_without_a_control_there_is_no_verdict():
    report = assess(quiet_levels()[:2], "baseline", None)
    assert report.levels == {} and not report.busy and report.figure("ngram", 1, 0.1) is None


def test_a_missing_control_leaves_the_figures_unchecked():
    levels = [lv for lv in quiet_levels() if lv.deployment != "control"]
    report = assess(levels, "baseline", "control")
    assert report.levels[1].verdict == UNCHECKED and not report.busy
    assert report.figure("ngram", 1, 1.25) == UNCHECKED
    assert report.messages() == ["concurrency 1: speed-ups unchecked, no control to compare (control: not measured)"]


def test_a_failed_level_is_unchecked_at_its_concurrency_only():
    levels = quiet_levels(1) + quiet_levels(4)
    failed = next(lv for lv in levels if lv.deployment == "control" and lv.concurrency == 4)
    failed.incomplete, failed.reason = True, "the server stopped answering during the run (UNAVAILABLE)"
    report = assess(levels, "baseline", "control")
    assert report.levels[1].verdict == QUIET and report.levels[4].verdict == UNCHECKED
    assert "control: incomplete (the server stopped answering during the run (UNAVAILABLE))" in report.messages()[0]
    dead_baseline = quiet_levels(1)
    dead_baseline[0].records = []
    assert assess(dead_baseline, "baseline", "control").levels[1].verdict == UNCHECKED


def test_a_run_in_one_round_is_judged_by_the_control_ratio_alone():
    levels = [
        level("baseline", [2.0], per_round=8),
        level("control", [2.6], per_round=8),
        level("ngram", [1.0], per_round=8),
    ]
    found = assess(levels, "baseline", "control").levels[1]
    assert found.spreads == {} and found.verdict == BUSY and found.control_ratio == pytest.approx(2.0 / 2.6)


def busy_run() -> BenchRun:
    run = BenchRun(
        settings=BenchSettings(
            prompts="chat", concurrencies=(1,), max_tokens=TOKENS, num_requests=8, rounds=4, control="control"
        )
    )
    run.levels = quiet_levels()
    run.levels[2] = level("control", [2.0, 2.0, 6.0, 2.0])
    run.deployments = [{"name": lv.deployment, "kind": "triton"} for lv in run.levels]
    return run


def test_files_keep_the_raw_figures_marked_busy(tmp_path):
    paths = write_results(busy_run(), tmp_path)
    data = json.loads(paths["bench.json"].read_text())
    results = {r["deployment"]: r for r in data["results"]}
    assert results["ngram"]["verdict"] == BUSY and results["ngram"]["speedup_vs_baseline"] == pytest.approx(1.25)
    assert results["control"]["verdict"] == CONTROL and results["baseline"]["verdict"] == BUSY
    assert data["noise"]["busy"] is True and data["noise"]["levels"][0]["verdict"] == BUSY
    assert data["noise"]["levels"][0]["control_ratio"] == pytest.approx(8 / 12) and data["noise"]["busy_ratio"] == 1.10
    assert [r["round"] for r in data["records"][:8]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {r["deployment"]: r["verdict"] for r in csv.DictReader(paths["bench.csv"].open())}["ngram"] == BUSY
    assert list(csv.DictReader(paths["requests.csv"].open()))[2]["round"] == "1"


def test_the_table_shows_busy_instead_of_a_speed_up():
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(comparison_table(busy_run()))
    text = console.export_text()
    ngram = next(line for line in text.splitlines() if "│ ngram" in line)
    assert "busy" in ngram and "1.25x" not in ngram
    assert "control/baseline tok/s: 0.67x @1" in " ".join(text.split()) and "too busy" in text
    quiet = busy_run()
    quiet.levels = quiet_levels()
    console = Console(record=True, width=250)
    console.print(comparison_table(quiet))
    lines = console.export_text().splitlines()
    assert "1.25x" in next(line for line in lines if "│ ngram" in line)
    assert "~1.01x" in next(line for line in lines if "│ medusa" in line)
    assert all(row["verdict"] in (OK, NOISE, CONTROL) for row in rows(quiet))


class HogMachine:
    """Requests take ``step_s`` a token, ``slowdown`` times that while the hog runs (a process pinning the CPU)."""

    def __init__(self, step_s: float = 0.004, slowdown: float = 6.0):
        self.step_s, self.slowdown, self.hog = step_s, slowdown, False

    async def serve(self, tokens: int) -> float:
        seconds = self.step_s * tokens * (self.slowdown if self.hog else 1.0)
        await asyncio.sleep(seconds)
        return seconds


class Deployment:
    """A fake deployment producing ``speed`` times the baseline's tokens per step; starts the hog during
    its turn in the rounds listed in ``hog_rounds`` (counted by its own calls of ``send``)."""

    def __init__(self, name, machine, speed=1.0, hog_rounds=(), per_round=2):
        from specpipe.bench.endpoints import Endpoint

        self.endpoint = Endpoint(name, "triton", f"fake-{name}:1", "ensemble", None)
        self.machine, self.speed, self.hog_rounds, self.per_round, self.sent = machine, speed, hog_rounds, per_round, 0

    async def open(self): ...
    async def close(self): ...
    async def preflight(self):
        return {}

    async def alive(self):
        return True

    async def send(self, text, max_tokens):
        from specpipe.client.llm import GenerationResult

        self.machine.hog = (self.sent // self.per_round) in self.hog_rounds
        self.sent += 1
        seconds = await self.machine.serve(round(max_tokens / self.speed))
        self.machine.hog = False
        return (
            GenerationResult(text="x", chunks=["x"], chunk_times_s=[seconds], ttft_s=seconds / 10, latency_s=seconds),
            max_tokens,
            "server",
        )


def _measure(backends, rounds=4):
    from specpipe.bench.prompts import Prompt

    settings = BenchSettings(
        prompts="fake", concurrencies=(1,), max_tokens=16, num_requests=8, warmup=0, rounds=rounds, control="control"
    )
    run = BenchRun(settings=settings)
    asyncio.run(run_bench([b.endpoint for b in backends], [Prompt("p", "x")], settings, run, backends=backends))
    return run


def test_rounds_stamp_each_record_and_a_hog_in_one_turn_shows_as_busy():
    machine = HogMachine()
    quiet = _measure(
        [Deployment("baseline", machine), Deployment("fast", machine, 1.3), Deployment("control", machine)]
    )
    assert [r.round for r in quiet.levels[0].records] == [0, 0, 1, 1, 2, 2, 3, 3]
    speedups = {r["level"].deployment: (r["speedup"], r["verdict"]) for r in rows(quiet)}
    assert speedups["fast"][0] == pytest.approx(1.3, rel=0.08) and speedups["fast"][1] == OK
    hogged = _measure(
        [
            Deployment("baseline", machine),
            Deployment("fast", machine, 1.3, hog_rounds=(2,)),
            Deployment("control", machine),
        ]
    )
    fast = next(r for r in rows(hogged) if r["level"].deployment == "fast")
    assert fast["speedup"] < 0.75 and fast["verdict"] == BUSY  # one-after-another printed this as a result
    hogged_control = _measure(
        [
            Deployment("baseline", machine),
            Deployment("fast", machine, 1.3),
            Deployment("control", machine, hog_rounds=(1,)),
        ]
    )
    assert all(r["verdict"] in (BUSY, CONTROL) for r in rows(hogged_control))
    assert math.isclose(
        next(r for r in rows(hogged_control) if r["level"].deployment == "fast")["speedup"], 1.3, rel_tol=0.08
    )


def test_the_readme_table_marks_busy_gains(tmp_path):
    from specpipe.bench.markdown import throughput_table

    table = throughput_table(json.loads(write_results(busy_run(), tmp_path)["bench.json"].read_text()))
    ngram = next(line for line in table.splitlines() if line.startswith("| ngram"))
    assert ngram == "| ngram | 62.5 (busy) |"
