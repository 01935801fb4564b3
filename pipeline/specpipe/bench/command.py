"""``specpipe bench``: argument checks, the run with a progress bar, the table and the files."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.errors import SpecpipeError


def parse_positive_ints(text: str, option: str, example: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)`` (duplicates dropped, order kept), for the CLI ``option``.

    Raises:
        SpecpipeError: an item that is not a positive integer, naming ``option`` and an ``example``.
    """
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value <= 0:
            raise SpecpipeError(f"{option} must list positive integers, e.g. {example}; got {item!r}")
        if value not in values:
            values.append(value)
    return tuple(values)


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``--concurrency`` (requests in flight) as a tuple, see :func:`parse_positive_ints`."""
    return parse_positive_ints(text, "--concurrency", "1,2,4,8 (requests in flight)")


def default_out_dir() -> Path:
    """``bench-results/<UTC time>`` in the current directory."""
    return Path("bench-results") / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def check_settings(settings: BenchSettings) -> None:
    """Refuse settings that cannot run.

    Raises:
        SpecpipeError: non-positive max tokens, request count or duration, negative warm-up, or both
            a request count and a duration.
    """
    if settings.max_tokens <= 0:
        raise SpecpipeError(f"--max-tokens must be a positive number of tokens, got {settings.max_tokens}")
    if settings.num_requests is not None and settings.duration_s is not None:
        raise SpecpipeError("give --num-requests or --duration, not both")
    if settings.num_requests is not None and settings.num_requests <= 0:
        raise SpecpipeError(f"--num-requests must be positive, got {settings.num_requests}")
    if settings.duration_s is not None and settings.duration_s <= 0:
        raise SpecpipeError(f"--duration must be a positive number of seconds, got {settings.duration_s:g}")
    if settings.warmup < 0:
        raise SpecpipeError(f"--warmup must be 0 or more requests, got {settings.warmup}")
    if settings.timeout_s <= 0:
        raise SpecpipeError(f"--timeout must be a positive number of seconds, got {settings.timeout_s:g}")


def execute(endpoints, prompts, settings: BenchSettings, show_progress: bool = True) -> BenchRun:
    """Run the benchmark; Ctrl-C or a failure after measuring began leaves a run marked incomplete.

    Raises:
        SpecpipeError: a pre-flight check failed (nothing measured).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specpipe.bench.runner import run_bench
    from specpipe.progress import console

    run = BenchRun(settings=settings)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=not show_progress)
    try:
        try:
            asyncio.run(run_bench(endpoints, prompts, settings, run, progress))
        finally:
            progress.stop()
    except KeyboardInterrupt:
        _stop(run, "interrupted (Ctrl-C)")
    except SpecpipeError as exc:
        if not run.levels:
            raise
        _stop(run, str(exc))
    return run


def _stop(run: BenchRun, reason: str) -> None:
    """Mark ``run`` (and the level that was running) incomplete for ``reason``."""
    run.mark_incomplete(reason)
    if run.levels and not run.levels[-1].incomplete:
        run.levels[-1].incomplete, run.levels[-1].reason = True, reason


def bench_command(urls: list[str], metrics: list[str], prompts: str, concurrency: str, max_tokens: int,
                  num_requests: int | None, duration: float | None, warmup: int, out: Path | None, chat: bool,
                  timeout: float, tokenizer: str | None, baseline: str, model: str) -> bool:
    """The ``specpipe bench`` command; returns True when every planned level ran to the end.

    Raises:
        SpecpipeError: bad arguments, prompts or deployments (before any load).
    """
    from rich.console import Console

    from specpipe.bench.endpoints import parse_endpoints
    from specpipe.bench.prompts import load_prompts
    from specpipe.bench.report import comparison_table, write_results
    from specpipe.progress import console as err

    endpoints = parse_endpoints(list(urls), list(metrics), triton_model=model)
    prompt_list, label = load_prompts(prompts)
    settings = BenchSettings(prompts=label, concurrencies=parse_concurrency(concurrency), max_tokens=max_tokens,
                             num_requests=num_requests, duration_s=duration, warmup=warmup, chat=chat, timeout_s=timeout,
                             baseline=baseline, tokenizer=tokenizer)
    check_settings(settings)
    out_dir = Path(out) if out else default_out_dir()
    run = execute(endpoints, prompt_list, settings)
    import sys

    Console(width=None if sys.stdout.isatty() else 200).print(comparison_table(run))
    paths = write_results(run, out_dir)
    err.print(f"wrote {', '.join(str(p) for p in paths.values())}", markup=False, highlight=False)
    for level in run.levels:
        failed = [r for r in level.records if r.error]
        if failed:
            err.print(f"[yellow]![/yellow] {level.deployment} @ {level.concurrency}: {len(failed)} of {len(level.records)} "
                      f"requests failed; first error: {failed[0].error.splitlines()[0][:200]}", highlight=False)
    if run.incomplete:
        err.print(f"[red]the benchmark is incomplete[/red] ({'; '.join(run.reasons)}): partial results written to {out_dir}, "
                  f"marked \"incomplete\": true", highlight=False)
    return not run.incomplete


def tune_command(name: str, engines_dir: Path, prompts: str, max_draft_len: str, concurrency: int, max_tokens: int,
                 num_requests: int, warmup: int, draft: str | None, keep: bool, chat: bool = False) -> bool:
    """The ``specpipe tune`` command; returns True when a best setting was found and recorded.

    Raises:
        SpecpipeError: bad arguments, prompts or engine.
    """
    import sys

    from rich.console import Console

    from specpipe.bench.prompts import load_prompts
    from specpipe.bench.tune import curve_table, parse_lengths, tune_engine
    from specpipe.progress import console as err

    if concurrency <= 0:
        raise SpecpipeError(f"--concurrency must be a positive number of requests in flight, got {concurrency}")
    lengths = parse_lengths(max_draft_len)
    prompt_list, label = load_prompts(prompts)
    settings = BenchSettings(prompts=label, concurrencies=(concurrency,), max_tokens=max_tokens, num_requests=num_requests,
                             warmup=warmup, chat=chat)
    check_settings(settings)
    result = tune_engine(name, engines_dir, prompt_list, settings, lengths, draft=draft, keep=keep)
    Console(width=None if sys.stdout.isatty() else 160).print(curve_table(result))
    if result.best is None:
        err.print(f"[red]no setting of {name} could be measured[/red]: see the messages above", highlight=False)
        return False
    best = result.best
    err.print(f"[green]✓[/green] best: {best['label']} (max_draft_len={best['max_draft_len']}, "
              f"{best['output_token_throughput']:.1f} tokens/s); recorded in {result.record}: the next "
              f"'specpipe build' of {name} uses it (delete the file to go back to the preset)", highlight=False)
    return True
