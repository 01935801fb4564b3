"""Presenting a :class:`~specpipe.bench.runner.BenchRun`: per-level summaries, JSON, CSV and a plot (the
terminal table is :mod:`specpipe.bench.table`).

Files written to the output folder:

- ``bench.json``: settings, metric definitions, deployments, one aggregate per deployment and
  concurrency, and every per-request record (with its text); ``"incomplete": true`` and the
  reasons when the run stopped early;
- ``bench.csv``: the aggregates, one row per deployment and concurrency;
- ``requests.csv``: the per-request records, without their text;
- ``bench.png``: output token throughput and median TTFT against concurrency, one line per deployment;
- ``profile_export-<deployment>.json``: the per-request records in perf_analyzer's profile export
  format, which GenAI-Perf reads (:mod:`specpipe.bench.export`).

``bench.json`` also records the machine that ran the benchmark (:mod:`specpipe.bench.machine`).
Percentiles from fewer requests than :data:`~specpipe.bench.stats.MIN_REQUESTS` asks are shown
``12.3*`` in the table, with a footnote, and listed in each distribution's ``thin``.

Speed-up is a deployment's output token throughput divided by the baseline deployment's at the
same concurrency. With a control (``BenchSettings.control``) every speed-up also gets a verdict from
:mod:`specpipe.bench.noise`: the table shows ``busy`` instead of a figure the machine's noise made
meaningless and ``~`` before one within the control's spread; the files keep every raw figure with
its verdict and the rule's findings (``bench.json`` ``"noise"``).

Greedy runs also report each deployment's agreement with the first deployment's texts
(:mod:`specpipe.bench.agreement`): a line under the table, ``greedy_agreement`` per result in
``bench.json`` and ``greedy_*`` columns in ``bench.csv``; ``None`` for the reference and sampled runs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from specpipe.bench.agreement import greedy_agreement
from specpipe.bench.export import write_profile_exports
from specpipe.bench.machine import machine_facts
from specpipe.bench.noise import NoiseReport, assess
from specpipe.bench.runner import BenchRun
from specpipe.bench.stats import MIN_REQUESTS, Aggregate, level_aggregate, speedup

METRIC_DEFINITIONS = {
    "time_to_first_token_ms": "request sent -> first response carrying text (GenAI-Perf/AIPerf TTFT)",
    "end_to_end_latency_ms": "request sent -> final response (GenAI-Perf/AIPerf request latency)",
    "inter_token_latency_ms": "(end-to-end latency - TTFT) / (output tokens - 1), per request (GenAI-Perf/AIPerf ITL)",
    "benchmark_duration_s": "first request sent -> last response received, per deployment and concurrency (with "
    "rounds: the sum over the deployment's rounds; start_s runs on that summed timeline)",
    "output_token_throughput": "output tokens of completed requests / benchmark duration, tokens/s",
    "request_throughput": "completed requests / benchmark duration, requests/s (open loop: the achieved request rate)",
    "request_rate": "open loop: the offered rate, requests/s, of the level's Poisson arrivals; null in closed loop",
    "thin": "the percentiles of a distribution computed from fewer requests than they need "
    f"({', '.join(f'{k} {v}' for k, v in MIN_REQUESTS.items())}); shown with * in the table",
    "acceptance_by_position": "per draft position k: accepted tokens at k / draft proposals, from the server's counters",
    "percentiles": "numpy.percentile with linear interpolation",
    "acceptance_rate": "sum of accepted draft tokens / sum of proposed draft tokens (perf outputs or server counters)",
    "mean_accepted_length": "tokens per target decoding forward after the first token: sum(F - 1 + A) / sum(F - 1) "
    "with the deployment's target_forwards F (CPU runtime), else estimated as sum(N - 1) / sum(N - 1 - A) from the "
    "output tokens N (A: accepted draft tokens); accepted_length_source says which",
    "accepted_length_source": "'target forwards' (exact), 'output tokens' (estimated), both, or 'server counters'",
    "speedup": "output token throughput / the baseline deployment's at the same concurrency (none where either level "
    "is incomplete)",
    "verdict": "with a control (a second server of the baseline): ok, noise (no farther from 1 than the control's ratio), "
    "busy (not a result: the control beyond 10 % of the baseline, or the deployment's rounds spread beyond 4x), "
    "unchecked (no usable control), control; null without a control (specpipe.bench.noise)",
    "memory_peak_bytes": "highest nv_gpu_memory_used_bytes (summed over GPUs); else, for a server on this machine, the PSS "
    "of its process tree (server + Python backend stubs; memory_kind 'process'); else "
    "nv_cpu_memory_used_bytes (host-wide); sampled every second during the level",
    "output_tokens": "num_output_tokens perf output, else OpenAI usage.completion_tokens, else re-tokenized text, else streamed chunks",
    "greedy_agreement": "greedy runs: over the prompts this deployment and the reference (the first deployment) both "
    "completed at the level, the share of identical texts and the mean common prefix (characters / the "
    "reference text's length); first completed text per prompt; null for the reference and sampled runs",
}

CSV_COLUMNS = (
    "deployment",
    "concurrency",
    "request_rate",
    "requests",
    "completed",
    "errors",
    "duration_s",
    "output_tokens",
    "output_token_throughput",
    "speedup_vs_baseline",
    "request_throughput",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "ttft_ms_mean",
    "itl_ms_p50",
    "itl_ms_p99",
    "itl_ms_mean",
    "e2e_ms_p50",
    "e2e_ms_p90",
    "e2e_ms_p99",
    "e2e_ms_mean",
    "output_tokens_mean",
    "acceptance_rate",
    "acceptance_rate_mean",
    "mean_accepted_length",
    "mean_accepted_length_mean",
    "acceptance_source",
    "accepted_length_source",
    "memory_peak_bytes",
    "memory_kind",
    "incomplete",
    "reason",
    "verdict",
    "acceptance_by_position",
    "thin_percentiles",
    "greedy_identical",
    "greedy_common_prefix",
    "greedy_prompts",
    "greedy_reference",
)
REQUEST_COLUMNS = (
    "deployment",
    "concurrency",
    "index",
    "round",
    "prompt_id",
    "scheduled_s",
    "start_s",
    "end_s",
    "latency_s",
    "ttft_s",
    "itl_s",
    "output_tokens",
    "output_tokens_source",
    "input_tokens",
    "chunks",
    "acceptance_rate",
    "accepted_draft_tokens",
    "draft_tokens",
    "target_forwards",
    "mean_accepted_length",
    "seed",
    "error",
)


def noise_report(run: BenchRun) -> NoiseReport:
    """The control rule of :mod:`specpipe.bench.noise` on ``run`` (no verdicts without a control)."""
    return assess(run.levels, run.settings.baseline, run.settings.control)


def rows(run: BenchRun, noise: NoiseReport | None = None) -> list[dict[str, Any]]:
    """One summary per level: ``level`` (the :class:`LevelResult`), ``aggregate``, ``speedup``, the
    figure's ``verdict`` (:meth:`~specpipe.bench.noise.NoiseReport.figure`; ``noise`` defaults to
    :func:`noise_report`) and its greedy ``agreement`` (:mod:`specpipe.bench.agreement`, or ``None``)."""
    noise = noise_report(run) if noise is None else noise
    agreements = greedy_agreement(run)
    aggregates = [(level, level_aggregate(level)) for level in run.levels]
    base = {
        level.key: None if level.incomplete else agg.output_token_throughput
        for level, agg in aggregates
        if level.deployment == run.settings.baseline
    }
    found = []
    for level, agg in aggregates:
        gain = None if level.incomplete else speedup(agg.output_token_throughput, base.get(level.key))
        found.append(
            {
                "level": level,
                "aggregate": agg,
                "speedup": gain,
                "verdict": noise.figure(level.deployment, level.concurrency, gain),
                "agreement": agreements.get((level.deployment, level.key)),
            }
        )
    return found


def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    level, agg = row["level"], row["aggregate"]
    return {
        "deployment": level.deployment,
        "concurrency": level.concurrency,
        "request_rate": level.request_rate,
        "requests": agg.requests,
        "completed": agg.completed,
        "errors": agg.errors,
        "duration_s": agg.duration_s,
        "output_tokens": agg.output_tokens,
        "output_token_throughput": agg.output_token_throughput,
        "speedup_vs_baseline": row["speedup"],
        "request_throughput": agg.request_throughput,
        "ttft_ms_p50": agg.ttft_ms.p50,
        "ttft_ms_p90": agg.ttft_ms.p90,
        "ttft_ms_p99": agg.ttft_ms.p99,
        "ttft_ms_mean": agg.ttft_ms.mean,
        "itl_ms_p50": agg.itl_ms.p50,
        "itl_ms_p99": agg.itl_ms.p99,
        "itl_ms_mean": agg.itl_ms.mean,
        "e2e_ms_p50": agg.e2e_ms.p50,
        "e2e_ms_p90": agg.e2e_ms.p90,
        "e2e_ms_p99": agg.e2e_ms.p99,
        "e2e_ms_mean": agg.e2e_ms.mean,
        "output_tokens_mean": agg.output_tokens_per_request.mean,
        "acceptance_rate": agg.acceptance_rate,
        "acceptance_rate_mean": agg.acceptance_rate_mean,
        "mean_accepted_length": agg.mean_accepted_length,
        "mean_accepted_length_mean": agg.mean_accepted_length_mean,
        "acceptance_source": agg.acceptance_source,
        "accepted_length_source": agg.accepted_length_source,
        "memory_peak_bytes": level.memory_peak_bytes,
        "memory_kind": level.memory_kind,
        "incomplete": level.incomplete,
        "reason": level.reason,
        "verdict": row["verdict"],
        "acceptance_by_position": " ".join(f"{v:.4f}" for v in agg.acceptance_by_position or []) or None,
        "thin_percentiles": " ".join(
            sorted({f"{m}:{p}" for m in ("ttft", "itl", "e2e") for p in getattr(agg, f"{m}_ms").thin})
        )
        or None,
        **{
            f"greedy_{k}": getattr(row["agreement"], k, None)
            for k in ("identical", "common_prefix", "prompts", "reference")
        },
    }


def to_json(run: BenchRun) -> dict[str, Any]:
    """The whole run as one JSON-ready document."""
    from dataclasses import asdict

    from specpipe import __version__

    results = []
    noise = noise_report(run)
    for row in rows(run, noise):
        level, agg = row["level"], row["aggregate"]
        results.append(
            {
                "deployment": level.deployment,
                "concurrency": level.concurrency,
                "request_rate": level.request_rate,
                "incomplete": level.incomplete,
                "reason": level.reason,
                "memory_peak_bytes": level.memory_peak_bytes,
                "memory_kind": level.memory_kind,
                "counters": asdict(level.counters) if level.counters else None,
                "speedup_vs_baseline": row["speedup"],
                "verdict": row["verdict"],
                "aggregate": agg.to_dict(),
                "greedy_agreement": row["agreement"].to_dict() if row["agreement"] else None,
            }
        )
    return {
        "specpipe_version": __version__,
        "command": run.command,
        "started": run.started,
        "finished": run.finished,
        "machine": machine_facts(),
        "incomplete": run.incomplete,
        "reasons": run.reasons,
        "settings": asdict(run.settings),
        "metric_definitions": METRIC_DEFINITIONS,
        "deployments": run.deployments,
        "noise": noise.to_dict(),
        "results": results,
        "records": [record.to_dict() for level in run.levels for record in level.records],
    }


def plot_figure(run: BenchRun):
    """A matplotlib figure: output tokens/s (left) and median TTFT, ms (right) per deployment: against
    concurrency (open loop: the offered request rate) as one line per deployment, or as one bar per
    deployment when a single level was run."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), dpi=110)
    throughput_ax, ttft_ax = figure.subplots(1, 2)
    by_deployment: dict[str, list[tuple[int, Aggregate]]] = {}
    open_loop = any(level.request_rate is not None for level in run.levels)
    for row in rows(run):
        x = row["level"].request_rate if open_loop else row["level"].concurrency
        by_deployment.setdefault(row["level"].deployment, []).append((x, row["aggregate"]))
    concurrencies = sorted({c for points in by_deployment.values() for c, _ in points})
    unit = "offered request rate, requests/s" if open_loop else "concurrency (requests in flight)"
    metrics = (
        (throughput_ax, lambda a: a.output_token_throughput, "output tokens/s", "Output token throughput"),
        (ttft_ax, lambda a: a.ttft_ms.p50, "TTFT p50, ms", "Time to first token (median)"),
    )
    for ax, value, ylabel, title in metrics:
        if len(concurrencies) == 1:
            _bars(ax, by_deployment, value, concurrencies[0], unit.split(",")[0].split(" (")[0])
        else:
            _lines(ax, by_deployment, value, concurrencies, unit)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3, axis="y" if len(concurrencies) == 1 else "both")
    s = run.settings
    figure.suptitle(
        f"specpipe bench: prompts {s.prompts}, max {s.max_tokens} tokens" + ("  [INCOMPLETE]" if run.incomplete else "")
    )
    figure.tight_layout()
    return figure


def _value(aggregate: Aggregate, value) -> float:
    found = value(aggregate)
    return float("nan") if found is None else found


def _lines(ax, by_deployment: dict, value, concurrencies: list, unit: str) -> None:
    for name, points in by_deployment.items():
        points = sorted(points, key=lambda p: p[0])
        ax.plot([c for c, _ in points], [_value(a, value) for _, a in points], marker="o", label=name)
    ax.set_xlabel(unit)
    if concurrencies and max(concurrencies) / min(concurrencies) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies)
    ax.set_xticklabels([f"{c:g}" for c in concurrencies])
    ax.legend()


def _bars(ax, by_deployment: dict, value, concurrency, unit: str = "concurrency") -> None:
    names = list(by_deployment)
    heights = [_value(points[0][1], value) for points in by_deployment.values()]
    colors = [f"C{i}" for i in range(len(names))]
    ax.bar(range(len(names)), heights, color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_xlabel(f"deployment ({unit} {concurrency:g})")


def write_results(run: BenchRun, out_dir: Path) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.csv``, ``requests.csv``, ``bench.png`` and the profile exports into
    ``out_dir``; returns their paths (exports keyed by their file names)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in ("bench.json", "bench.csv", "requests.csv", "bench.png")}
    paths["bench.json"].write_text(json.dumps(to_json(run), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    with open(paths["bench.csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(_csv_row(row) for row in rows(run))
    with open(paths["requests.csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(record.to_dict() for level in run.levels for record in level.records)
    plot_figure(run).savefig(paths["bench.png"])
    paths.update({path.name: path for path in write_profile_exports(run, out_dir)})
    return paths
