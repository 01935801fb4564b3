"""The terminal comparison table of a :class:`~specpipe.bench.runner.BenchRun` and its cells.

One row per deployment and level (concurrency, or offered request rate in open loop), a speed-up column
when the baseline deployment was measured, and a caption with the first requests' TTFT, the control's
ratios, the greedy agreement, the noise rule's messages and the footnotes (:mod:`specpipe.bench.report`
explains the figures and the files).
"""

from __future__ import annotations

from specpipe.bench.agreement import agreement_line
from specpipe.bench.noise import BUSY, NOISE, NoiseReport
from specpipe.bench.report import noise_report, rows
from specpipe.bench.runner import BenchRun
from specpipe.bench.stats import MIN_REQUESTS, Distribution


def format_speedup(value: float | None, verdict: str | None) -> str:
    """A speed-up cell: ``1.25x``, ``~1.02x`` within the control's spread, ``busy`` for a figure that is not a
    result, ``-`` for none."""
    if value is None:
        return "-"
    if verdict == BUSY:
        return "busy"
    return f"{'~' if verdict == NOISE else ''}{value:.2f}x"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _percentiles(dist: Distribution, names: tuple[str, ...], digits: int = 0) -> str:
    """``p50 / p90 / p99`` cells of ``dist``, a percentile from too few requests marked ``*``."""
    return " / ".join(
        _num(getattr(dist, n), digits) + ("*" if n in dist.thin and getattr(dist, n) is not None else "") for n in names
    )


def decoding_label(settings) -> str:
    """``greedy``, or the sampling settings (``temperature 0.7, top-p 0.9, seed 1+i``); ``ignore EOS`` added."""
    if not settings.sampled:
        text = "greedy"
    else:
        parts = [
            f"temperature {settings.temperature:g}" if settings.temperature is not None else "temperature 1",
            *([f"top-p {settings.top_p:g}"] if settings.top_p is not None else []),
            *([f"seed {settings.seed}+i"] if settings.seed is not None else []),
        ]
        text = ", ".join(parts)
    return text + (", ignore EOS" if settings.ignore_eos else "")


#: How each memory kind is labelled in the table.
MEMORY_LABELS = {"gpu": "GPU", "cpu": "CPU host", "process": "proc"}


def format_bytes(value: float | None, kind: str | None = None) -> str:
    """``value`` bytes as GiB/MiB, with the kind (``GPU``, ``proc`` = the server's process tree, ``CPU host``)
    when known; ``-`` for none."""
    if value is None:
        return "-"
    text = f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"
    return f"{text} {MEMORY_LABELS.get(kind, kind.upper())}" if kind else text


def comparison_table(run: BenchRun):
    """The rich table of every level (speed-up column only when the baseline deployment was measured)."""
    from rich.table import Table

    s = run.settings
    noise = noise_report(run)
    summary = rows(run, noise)
    has_baseline = any(r["level"].deployment == s.baseline for r in summary)
    open_loop = any(r["level"].request_rate is not None for r in summary)
    by_position = any(r["aggregate"].acceptance_by_position for r in summary)
    title = f"specpipe bench: prompts {s.prompts}, max {s.max_tokens} tokens, {decoding_label(s)}, streamed"
    table = Table(title=title, caption=_caption(run, noise))
    columns = (
        ["deployment"]
        + (["offered req/s", "max conc."] if open_loop else ["conc."])
        + ["ok/err", "out tok/s"]
        + (["speed-up"] if has_baseline else [])
        + [
            "req/s",
            "TTFT ms p50/p90/p99",
            "ITL ms p50/p99",
            "e2e ms p50/p99",
            "tok/req",
            "accept.",
            "acc. len",
            "memory",
        ]
        + (["accept. by pos"] if by_position else [])
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "deployment" else "right")
    for row in summary:
        level, agg = row["level"], row["aggregate"]
        name = level.deployment + (" [red](incomplete)[/red]" if level.incomplete else "")
        load = [_num(level.request_rate, 2), str(level.concurrency or "-")] if open_loop else [str(level.concurrency)]
        cells = [name, *load, f"{agg.completed}/{agg.errors}", _num(agg.output_token_throughput)]
        if has_baseline:
            cells.append(format_speedup(row["speedup"], row["verdict"]))
        cells += [
            _num(agg.request_throughput, 2),
            _percentiles(agg.ttft_ms, ("p50", "p90", "p99")),
            _percentiles(agg.itl_ms, ("p50", "p99"), 1),
            _percentiles(agg.e2e_ms, ("p50", "p99")),
            _num(agg.output_tokens_per_request.mean, 1),
            _num(agg.acceptance_rate, 2),
            _num(agg.mean_accepted_length, 2),
            format_bytes(level.memory_peak_bytes, level.memory_kind),
        ]
        if by_position:
            cells.append(" ".join(f"{v:.2f}" for v in agg.acceptance_by_position or []) or "-")
        table.add_row(*cells)
    return table


def first_ttft_line(run: BenchRun) -> str | None:
    """``first request TTFT ms: baseline 812, eagle 990`` (the first request each deployment got: the cold
    one right after ready), or ``None`` when none was recorded."""
    cells = [
        f"{d['name']} {_num((d.get('first_request') or {}).get('ttft_ms'), 0)}"
        for d in run.deployments
        if d.get("first_request")
    ]
    return "first request TTFT ms (table: steady state): " + ", ".join(cells) if cells else None


def control_line(run: BenchRun, noise: NoiseReport) -> str | None:
    """``control/baseline tok/s: 1.02x @1, 0.97x @4 (~: within that spread)``, or ``None`` without a control."""
    if noise.control is None:
        return None
    cells = [
        f"{'-' if n.control_ratio is None else f'{n.control_ratio:.2f}x'} @{c}" for c, n in sorted(noise.levels.items())
    ]
    return f"{noise.control}/{noise.baseline} tok/s: {', '.join(cells)} (~: a speed-up within that spread)"


def _caption(run: BenchRun, noise: NoiseReport) -> str:
    parts = [line] if (line := first_ttft_line(run)) else []
    if line := control_line(run, noise):
        parts.append(line)
    if line := agreement_line(run):
        parts.append(line)
    parts += noise.messages()
    if any(
        d.thin for r in rows(run, noise) for d in (r["aggregate"].ttft_ms, r["aggregate"].itl_ms, r["aggregate"].e2e_ms)
    ):
        parts.append(
            "*: from fewer requests than the percentile needs ("
            + ", ".join(f"{k} {v}" for k, v in MIN_REQUESTS.items())
            + ")"
        )
    if run.incomplete:
        parts.append("INCOMPLETE: " + "; ".join(run.reasons))
    if not any(level.deployment == run.settings.baseline for level in run.levels):
        parts.append(f"no deployment named '{run.settings.baseline}': no speed-up column")
    return " | ".join(parts)
