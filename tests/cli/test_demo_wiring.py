"""``specpipe demo`` without servers: which servers it starts (the control included), the benchmark's turns and
settings, and the closing summary, which fits an 80-column terminal with whole cells."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from bench_levels import level
from rich.console import Console

from specpipe.bench.runner import BenchRun
from specpipe.client.validate import Check, RequestFigures, ValidationReport
from specpipe.demo import (
    CONTROL_NAME,
    DemoRequest,
    bench_endpoints,
    bench_settings,
    busy_lines,
    server_plan,
    summary_table,
)


def test_the_control_serves_the_baseline_repository_on_its_own_ports():
    plan = server_plan(DemoRequest())
    assert plan == [
        ("none", "none", 8101),
        ("ngram", "ngram", 8104),
        ("smollm2-draft", "smollm2-draft", 8107),
        ("medusa", "medusa", 8110),
        ("eagle", "eagle", 8113),
        (CONTROL_NAME, "none", 8116),
    ]
    assert server_plan(DemoRequest(drafts=("none", "eagle", "eagle"), bench_requests=0)) == [
        ("none", "none", 8101),
        ("eagle", "eagle", 8104),
    ]


def _servers(names):
    return {
        name: SimpleNamespace(
            grpc_url=f"localhost:{9001 + 3 * i}", metrics_url=f"http://localhost:{9002 + 3 * i}/metrics"
        )
        for i, name in enumerate(names)
    }


def test_the_control_takes_its_turn_between_the_speculative_deployments():
    servers = _servers(["none", "ngram", "smollm2-draft", "medusa", "eagle", CONTROL_NAME])
    endpoints = bench_endpoints(servers)
    assert [e.name for e in endpoints] == ["baseline", "ngram", "smollm2-draft", CONTROL_NAME, "medusa", "eagle"]
    control = endpoints[3]
    assert (control.address, control.metrics_url, control.kind) == (
        "localhost:9016",
        "http://localhost:9017/metrics",
        "triton",
    )
    assert [e.name for e in bench_endpoints(_servers(["none", "eagle", CONTROL_NAME]))] == [
        "baseline",
        "eagle",
        CONTROL_NAME,
    ]
    assert [e.name for e in bench_endpoints(_servers(["none", CONTROL_NAME]))] == ["baseline", CONTROL_NAME]


def test_the_benchmark_takes_turns_with_more_requests():
    settings = bench_settings(DemoRequest())
    assert (settings.rounds, settings.control, settings.baseline, settings.num_requests) == (
        4,
        CONTROL_NAME,
        "baseline",
        8,
    )
    assert [p.num_requests for p in settings.round_plans(1)] == [2, 2, 2, 2]
    assert [p.num_requests for p in settings.round_plans(4)] == [4, 4]  # two full batches: the level still takes turns
    assert (settings.max_tokens, settings.chat, settings.prompts) == (128, True, "chat")
    assert bench_settings(DemoRequest(bench_rounds=2, bench_concurrency=(2,)), with_control=False).control is None


def _report(passed: int, total: int, acceptance: float) -> ValidationReport:
    checks = [Check(f"check {i}", i < passed) for i in range(total)]
    figures = [RequestFigures("p", 48, acceptance, 10, 20, 1.0 + acceptance, 900.0)]
    return ValidationReport("localhost:1", None, checks=checks, requests=figures)


def _run(control_seconds: list[float]) -> BenchRun:
    from specpipe.bench.runner import BenchSettings

    run = BenchRun(
        settings=BenchSettings(
            prompts="chat", concurrencies=(1, 4), max_tokens=128, num_requests=8, rounds=4, control=CONTROL_NAME
        )
    )
    for concurrency in (1, 4):
        run.levels += [
            level("baseline", [2.0] * 4, concurrency),
            level("ngram", [1.6] * 4, concurrency),
            level("smollm2-draft", [1.98] * 4, concurrency),
            level(CONTROL_NAME, control_seconds if concurrency == 4 else [2.04] * 4, concurrency),
        ]
    return run


def _render(table) -> list[str]:
    console = Console(width=80, record=True)
    console.print(table)
    return console.export_text().splitlines()


def test_the_summary_fits_80_columns_with_whole_cells():
    reports = {"none": _report(5, 5, 0.0), "ngram": _report(12, 12, 0.41), "smollm2-draft": _report(11, 12, 0.63)}
    lines = _render(summary_table(reports, _run([2.04] * 4)))
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    rows = {line.split("│")[1].strip(): line for line in lines if line.startswith("│") and line.split("│")[1].strip()}
    assert set(rows) >= {"none", "ngram", "smollm2-draft", CONTROL_NAME}
    ngram = [cell.strip() for cell in rows["ngram"].split("│")[1:-1]]
    assert ngram == ["ngram", "12/12", "0.41", "1.41", "1", "62.5", "1.25x", "160"]
    draft = [cell.strip() for cell in rows["smollm2-draft"].split("│")[1:-1]]
    assert draft[1:3] == ["11/12", "0.63"]
    text = "\n".join(lines)
    assert "FAILED" in text and "~1.01x" in text
    control = [cell.strip() for cell in rows[CONTROL_NAME].split("│")[1:-1]]
    assert control[1:5] == ["-", "-", "-", "1"] and control[6] == "0.98x"
    next_line = lines[lines.index(rows["ngram"]) + 1]  # the highest concurrency, under the first
    assert [cell.strip() for cell in next_line.split("│")[1:-1]][4:7] == ["4", "62.5", "1.25x"]


def test_a_busy_run_prints_busy_and_says_why(tmp_path):
    reports = {"none": _report(5, 5, 0.0), "ngram": _report(12, 12, 0.41)}
    run = _run([2.0, 2.0, 6.0, 2.0])
    lines = _render(summary_table(reports, run))
    ngram = next(i for i, line in enumerate(lines) if line.startswith("│ ngram"))
    assert "1.25x" in lines[ngram] and "busy" in lines[ngram + 1] and "1.25x" not in lines[ngram + 1]
    messages = busy_lines(run, tmp_path / "demo")
    assert "concurrency 4: the machine was too busy" in messages[0] and "measured 0.67x the baseline" in messages[0]
    assert str(Path(tmp_path / "demo" / "bench.json")) in messages[-1] and 'verdict "busy"' in messages[-1]
    quiet = busy_lines(_run([2.04] * 4), tmp_path)
    assert quiet == [
        "control (the baseline served twice): 0.98x at concurrency 1, 0.98x at concurrency 4 the baseline's tok/s"
    ]
    assert busy_lines(None, tmp_path) == []


def test_the_summary_without_a_benchmark():
    lines = _render(summary_table({"none": _report(5, 5, 0.0), "eagle": _report(12, 12, 0.7)}, None))
    eagle = next(line for line in lines if line.startswith("│ eagle"))
    assert [cell.strip() for cell in eagle.split("│")[1:-1]] == ["eagle", "12/12", "0.70", "1.70", "-", "-", "-", "-"]
