"""One ``specpipe bench`` run as a library call: :class:`BenchRequest` in, :class:`BenchOutcome` out.

The request names the deployments (``--url NAME=ADDRESS``, :mod:`specpipe.bench.endpoints`), the
prompts and the load; :func:`run_benchmark` checks every deployment, measures each load level with a
progress bar on stderr, and writes the result files. The caller prints the table.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specpipe.bench.endpoints import Endpoint, parse_endpoints
from specpipe.bench.load import one_line
from specpipe.bench.prompts import Prompt, load_prompts
from specpipe.bench.report import write_results
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.errors import SpecpipeError
from specpipe.progress import count_bars


@dataclass(frozen=True)
class BenchRequest:
    """What ``specpipe bench`` was asked to measure.

    Attributes:
        urls: deployments, ``NAME=HOST:PORT`` (Triton gRPC) or ``NAME=openai://HOST:PORT/v1``.
        prompts: a built-in set (``chat``, ``code``, ``summarize``) or a JSONL file of ``{"prompt": ...}``.
        concurrency: load levels, requests in flight.
        max_tokens: new tokens per request.
        num_requests: requests per level (``None``: 4 x concurrency, at least 8); exclusive with ``duration``.
        duration: seconds per level instead of a request count.
        warmup: requests per deployment before measuring (not recorded).
        out: output folder (``None``: ``bench-results/<UTC time>``).
        chat: wrap prompts in the chat template.
        metrics: ``NAME=URL`` of a deployment's Prometheus metrics, or ``NAME=none``.
        tokenizer: tokenizer (folder or Hugging Face id) to count output tokens when the server does not.
        timeout: per-request timeout, seconds.
        baseline: name of the reference deployment for speed-ups.
        model: the Triton model to drive.
        rounds: >= 1; above 1 the deployments take turns, each level in this many rounds
            (:mod:`specpipe.bench.runner`).
        request_rate: open-loop levels, requests/s (Poisson arrivals) instead of ``concurrency``.
        max_concurrency: open loop: requests in flight at most.
        input_len: synthetic prompts of exactly this many tokens instead of ``prompts``.
        output_len: new tokens per request (sets ``max_tokens``); with ``ignore_eos`` exactly that many.
        ignore_eos: generate ``max_tokens`` tokens whatever the end-of-sequence token.
        temperature, top_p, seed: sampling (``None``: greedy); request ``i`` of a level gets ``seed + i``.
    """

    urls: tuple[str, ...]
    prompts: str = "chat"
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 128
    num_requests: int | None = None
    duration: float | None = None
    warmup: int = 1
    out: Path | None = None
    chat: bool = False
    metrics: tuple[str, ...] = ()
    tokenizer: str | None = None
    timeout: float = 300.0
    baseline: str = "baseline"
    model: str = "ensemble"
    rounds: int = 1
    request_rate: tuple[float, ...] = ()
    max_concurrency: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    ignore_eos: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass
class BenchOutcome:
    """A finished (or interrupted) run, where its files went and which they are."""

    run: BenchRun
    out_dir: Path
    paths: dict[str, Path]


def default_out_dir() -> Path:
    """``bench-results/<UTC time>`` in the current directory."""
    return Path("bench-results") / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def check_output_folder(out_dir: Path) -> None:
    """Refuse, before anything is measured, an output folder the results could not be written to
    (nothing is created here).

    Raises:
        SpecpipeError: ``out_dir`` or one of its parents is a file, or the nearest existing folder is
            not writable.
    """
    existing = next(p for p in (out_dir.absolute(), *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise SpecpipeError(
            f"--out {out_dir}: {existing} is a file; pass a folder for the results "
            "(bench.json, bench.csv, requests.csv, bench.png)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecpipeError(f"--out {out_dir}: cannot write in {existing}; pass another folder with --out")


def run_benchmark(request: BenchRequest, show_progress: bool = True) -> BenchOutcome:
    """Measure every deployment of ``request`` and write the result files (JSON, CSV, plot).

    Raises:
        SpecpipeError: bad deployments or prompts, both a request count and a duration, an output folder
            that cannot be written (:func:`check_output_folder`), or a failed pre-flight check (nothing
            measured).
    """
    check_request(request)
    endpoints = parse_endpoints(list(request.urls), list(request.metrics), triton_model=request.model)
    prompt_list, label = load_prompts(request.prompts)
    if request.input_len is not None:
        label = f"synthetic {request.input_len} tokens"
    settings = BenchSettings(
        prompts=label,
        concurrencies=tuple(request.concurrency),
        max_tokens=request.output_len or request.max_tokens,
        num_requests=request.num_requests,
        duration_s=request.duration,
        warmup=request.warmup,
        chat=request.chat,
        timeout_s=request.timeout,
        baseline=request.baseline,
        tokenizer=request.tokenizer,
        rounds=request.rounds,
        request_rates=tuple(request.request_rate),
        max_concurrency=request.max_concurrency,
        input_len=request.input_len,
        ignore_eos=request.ignore_eos,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
    )
    out_dir = Path(request.out) if request.out else default_out_dir()
    check_output_folder(out_dir)
    run = execute(endpoints, prompt_list, settings, show_progress)
    mark_unmeasured(run)
    return BenchOutcome(run=run, out_dir=out_dir, paths=write_results(run, out_dir))


def check_request(request: BenchRequest) -> None:
    """Refuse contradictory or out-of-range load and sampling options before anything runs.

    Raises:
        SpecpipeError: both a request count and a duration; ``max_concurrency`` without a request rate;
            a rate, length or sampling value out of range; ``input_len`` with ``chat``.
    """
    if request.num_requests is not None and request.duration is not None:
        raise SpecpipeError("give --num-requests or --duration, not both")
    if request.max_concurrency is not None and not request.request_rate:
        raise SpecpipeError(
            "--max-concurrency caps open-loop load: give it with --request-rate (closed loop: --concurrency)"
        )
    bad_rate = [r for r in request.request_rate if not r > 0 or r == float("inf")]
    if bad_rate:
        raise SpecpipeError(
            f"--request-rate {bad_rate[0]:g} must be a finite number of requests/s above 0, e.g. 0.5,1,2"
        )
    for name, value in (
        ("--input-len", request.input_len),
        ("--output-len", request.output_len),
        ("--max-concurrency", request.max_concurrency),
    ):
        if value is not None and value < 1:
            raise SpecpipeError(f"{name} must be at least 1, got {value}")
    if request.input_len is not None and request.chat:
        raise SpecpipeError(
            "--input-len builds raw prompts of exactly that many tokens, which a chat template would "
            "lengthen: drop --chat"
        )
    if request.temperature is not None and not 0 <= request.temperature < float("inf"):
        raise SpecpipeError(f"--temperature must be a finite number >= 0 (0: greedy), got {request.temperature:g}")
    if request.top_p is not None and not 0 < request.top_p <= 1:
        raise SpecpipeError(f"--top-p must be in (0, 1], got {request.top_p:g}")
    if request.seed is not None and not 0 <= request.seed < 2**63:
        raise SpecpipeError(f"--seed must be 0 to 2**63 - 1 (request i of a level gets seed + i), got {request.seed}")


def mark_unmeasured(run: BenchRun) -> None:
    """Mark ``run`` incomplete for every level that measured nothing: no request sent (a ``--duration``
    shorter than one request), none completed (every one failed: the first error is named), or every
    answer empty (0 output tokens: an instruction-tuned model given raw prompts ends at once without
    ``--chat``). A table of zeros is not a measurement, so ``specpipe bench`` then exits 1."""
    for level in run.levels:
        if level.incomplete:
            continue
        where = f"{level.deployment} @ {level.label}"
        completed = [r for r in level.records if r.ok]
        if not level.records:
            reason = f"{where}: no request was sent (give a longer --duration, or --num-requests)"
        elif not completed:
            reason = f"{where}: all {len(level.records)} requests failed; first error: {one_line(level.records[0].error, 200)}"
        elif not any(r.output_tokens for r in completed):
            hint = "" if run.settings.chat else ": an instruction-tuned model usually needs --chat"
            reason = f"{where}: every answer was empty (0 output tokens){hint}"
        else:
            continue
        level.incomplete, level.reason = True, reason
        run.mark_incomplete(reason)


def execute(
    endpoints: list[Endpoint], prompts: list[Prompt], settings: BenchSettings, show_progress: bool = True
) -> BenchRun:
    """Run the benchmark; Ctrl-C or a failure after measuring began leaves a run marked incomplete.

    Raises:
        SpecpipeError: a pre-flight check failed (nothing measured).
    """
    run = BenchRun(settings=settings)
    progress = count_bars(show_progress)
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
