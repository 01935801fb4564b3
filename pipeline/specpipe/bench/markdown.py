"""A committed ``bench.json`` as Markdown tables for the README (generated with cog, never typed by hand).

:func:`load_table` reads the file that ``specpipe bench`` wrote (:func:`~specpipe.bench.report.to_json`)
and renders, per deployment and concurrency, the output token throughput (tokens/s), the gain against
the baseline deployment at the same concurrency and the median TTFT (ms); per deployment, the mean
accepted length (tokens per step) at the lowest and highest concurrency and the peak memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: How ``memory_kind`` is shown (see ``memory_peak_bytes`` in :data:`specpipe.bench.report.METRIC_DEFINITIONS`).
MEMORY_KINDS = {"gpu": "GPU", "cpu": "host-wide", "process": "process tree PSS"}


def _by_level(results: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["deployment"], int(r["concurrency"])): r for r in results}


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def throughput_table(bench: dict[str, Any]) -> str:
    """Markdown: one row per deployment, one column per concurrency, cells ``tok/s (gain×)``; the gain reads
    ``busy`` where the run's control found the machine too busy for it (``"verdict"``).

    Args:
        bench: a parsed ``bench.json``.
    """
    levels = _by_level(bench["results"])
    concurrencies = sorted({c for _, c in levels})
    names = [d["name"] for d in bench["deployments"]]
    head = "| deployment | " + " | ".join(f"concurrency {c}" for c in concurrencies) + " |"
    lines = [head, "|---|" + "---|" * len(concurrencies)]
    for name in names:
        cells = []
        for c in concurrencies:
            level = levels.get((name, c))
            if level is None:
                cells.append("—")
                continue
            tps = level["aggregate"]["output_token_throughput"]
            gain = level.get("speedup_vs_baseline")
            shown = (
                "busy" if level.get("verdict") == "busy" else _fmt(gain, 2, "×")
            )  # not a result (specpipe.bench.noise)
            cells.append(f"{_fmt(tps)} ({shown})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latency_table(bench: dict[str, Any]) -> str:
    """Markdown: per deployment, median TTFT (ms) at each concurrency, mean accepted length at the
    lowest and highest concurrency, and the peak memory (MiB) with what it measures (a local server's
    process tree PSS, GPU memory, or host-wide memory)."""
    levels = _by_level(bench["results"])
    concurrencies = sorted({c for _, c in levels})
    low, high = concurrencies[0], concurrencies[-1]
    head = (
        "| deployment | "
        + " | ".join(f"TTFT p50 @{c} (ms)" for c in concurrencies)
        + f" | tokens/step @{low} | tokens/step @{high} | peak memory (MiB) |"
    )
    lines = [head, "|---|" + "---|" * (len(concurrencies) + 3)]
    for d in bench["deployments"]:
        name = d["name"]
        row = [name]
        for c in concurrencies:
            level = levels.get((name, c))
            row.append(_fmt(level["aggregate"]["ttft_ms"]["p50"], 0) if level else "—")
        for c in (low, high):
            level = levels.get((name, c))
            row.append(_fmt(level["aggregate"].get("mean_accepted_length"), 2) if level else "—")
        measured = [levels[(name, c)] for c in concurrencies if levels.get((name, c), {}).get("memory_peak_bytes")]
        if measured:
            peak = max(measured, key=lambda level: level["memory_peak_bytes"])
            row.append(
                f"{_fmt(peak['memory_peak_bytes'] / 2**20, 0)} {MEMORY_KINDS.get(peak.get('memory_kind'), '')}".strip()
            )
        else:
            row.append("—")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def load_table(path: str | Path, *more: str | Path) -> str:
    """Both tables of the ``bench.json`` at ``path`` with the command that produced it; with ``more``
    files (runs of other concurrencies, e.g. concurrency 8 with more requests), their levels join the
    tables and each command is listed (a level measured twice keeps the later file's).

    Raises:
        FileNotFoundError: no such file; json.JSONDecodeError / KeyError: not a ``specpipe bench`` result.
    """
    benches = [json.loads(Path(p).read_text(encoding="utf-8")) for p in (path, *more)]
    bench = {**benches[0], "results": [r for b in benches for r in b["results"]]}
    settings = bench["settings"]
    commands = " and ".join(f"`{b.get('command') or 'specpipe bench'}`" for b in benches)
    header = (
        f"{commands} ({settings['prompts']} prompts, "
        f"{settings['max_tokens']} new tokens, greedy; measured {bench['started'][:10]}, "
        f"specpipe {bench['specpipe_version']}):"
    )
    return (
        "\n\n".join(
            [
                header,
                "Output tokens/s (gain against the baseline at the same concurrency):",
                throughput_table(bench),
                "Time to first token and memory:",
                latency_table(bench),
            ]
        )
        + "\n"
    )


def interleaved_table(path: str | Path) -> str:
    """The table of ``benchmarks/adaptive_interleaved.py``'s JSON at ``path`` (output tok/s and gain per
    deployment and concurrency, the share of decoding steps that drafted), with its command.

    Raises:
        FileNotFoundError: no such file; json.JSONDecodeError / KeyError: not that benchmark's output.
    """
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    levels = sorted({row["concurrency"] for row in report["levels"]})
    names = list(dict.fromkeys(row["deployment"] for row in report["levels"]))
    cell = {(row["deployment"], row["concurrency"]): row for row in report["levels"]}
    lines = [
        f"`{report['command']}` (measured {report['date']}, torch {report['torch']}):",
        "",
        "| deployment | " + " | ".join(f"concurrency {c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for name in names:
        cells = []
        for c in levels:
            row = cell.get((name, c))
            if row is None:  # a lane that sat this level out (llama.cpp beyond concurrency 1)
                cells.append("—")
                continue
            steps = sum(row["draft_lengths"].values())
            drafted = steps - row["draft_lengths"].get("0", 0)
            cells.append(f"{row['output_tok_s']:.1f} ({row['speedup']:.2f}×, drafts in {100 * drafted / steps:.0f} %)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ngram_ceiling_table(path: str | Path) -> str:
    """The table of the n-gram ceiling experiment's JSON at ``path`` (``docs/experiments.md``): per
    drafter (rows) and prompt set (columns), tokens per target forward and, in brackets, the speed-up
    predicted with the forward cost measured in that run; with its command.

    Raises:
        FileNotFoundError: no such file; json.JSONDecodeError / KeyError: not that benchmark's output.
    """
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    sets = list(dict.fromkeys(row["prompts"] for row in report["results"]))
    drafters = list(dict.fromkeys(row["drafter"] for row in report["results"]))
    cell = {(row["drafter"], row["prompts"]): row for row in report["results"]}
    lines = [
        f"`{report['command']}` (measured {report['date']}; {report['answer_tokens']} greedy tokens per answer; "
        "tokens per target forward, in brackets the predicted speed-up):",
        "",
        "| drafter | " + " | ".join(f"{name} ({report['prompts_per_set'][name]} prompts)" for name in sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for drafter in drafters:
        cells = [
            f"{cell[(drafter, s)]['tokens_per_forward']:.2f} ({cell[(drafter, s)]['predicted_speedup']:.2f}×)"
            for s in sets
        ]
        lines.append(f"| {drafter} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
