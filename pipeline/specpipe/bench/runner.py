"""``specpipe bench`` end to end: check every deployment, warm it up, run each load level, keep results.

Deployments are measured one after the other (all levels of the first, then the next), so on a
shared machine only the deployment under test is busy. With ``rounds`` > 1 they take turns instead:
each level's requests are split into that many rounds, and every deployment runs its share of a round
before the next round starts, so a machine whose speed drifts over minutes (a shared VM) slows every
deployment alike and the speed-ups stay fair; a level's duration is then the sum of its rounds'.
Results accumulate in a :class:`BenchRun` as they are measured: an interrupted or failed run still
holds everything gathered so far, and :mod:`specpipe.bench.report` writes it marked incomplete.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.load import LoadPlan, one_line, run_level
from specpipe.bench.prompts import Prompt
from specpipe.bench.records import LevelResult
from specpipe.bench.synthetic import synthetic_prompts
from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class BenchSettings:
    """What ``specpipe bench`` was asked to do.

    Attributes:
        prompts: label of the prompt set (built-in name or file path).
        concurrencies: load levels, requests in flight.
        max_tokens: new tokens per request.
        num_requests: requests per level (``None`` with ``duration_s``; see :func:`requests_for`).
        duration_s: seconds per level instead of a request count.
        warmup: requests per deployment before measuring (not recorded).
        chat: wrap prompts in the chat template (Triton: the deployment's tokenizer; OpenAI:
            ``/chat/completions``).
        timeout_s: per-request timeout, seconds.
        baseline: name of the deployment speed-ups are computed against.
        rounds: >= 1; above 1 the deployments take turns, each level in this many rounds (module doc);
            each record keeps its round (``RequestRecord.round``).
        control: name of a second deployment of the baseline's repository, measured like the others so
            that its spread against the baseline shows how noisy the run was (:mod:`specpipe.bench.noise`);
            ``None``: no control.
        request_rates: open-loop levels, requests/s (Poisson arrivals, :mod:`specpipe.bench.load`); when
            given they replace ``concurrencies``.
        max_concurrency: open loop: requests in flight at most (``None``: no cap).
        input_len: synthetic prompts of exactly this many tokens (:mod:`specpipe.bench.synthetic`)
            instead of ``prompts``' texts; ``None``: the prompt set.
        ignore_eos: ask the server to generate ``max_tokens`` tokens whatever the end-of-sequence token
            (:mod:`specpipe.bench.backends`).
        temperature, top_p: sampling; both ``None``: greedy.
        seed: base sampling seed (request ``i`` of a level: ``seed + i``); it also seeds the open
            loop's arrival times (0 when ``None``).
    """

    prompts: str
    concurrencies: tuple[int, ...]
    max_tokens: int = 128
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int = 1
    chat: bool = False
    timeout_s: float = 300.0
    baseline: str = "baseline"
    tokenizer: str | None = None
    rounds: int = 1
    control: str | None = None
    request_rates: tuple[float, ...] = ()
    max_concurrency: int | None = None
    input_len: int | None = None
    ignore_eos: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    @property
    def sampled(self) -> bool:
        """Whether requests sample (a temperature above 0 or a top-p); otherwise they are greedy."""
        return bool(self.temperature) or self.top_p is not None

    def levels(self) -> list[tuple[int, float | None]]:
        """The load levels in order: ``(concurrency, None)`` closed loop, or ``(max_concurrency or 0, rate)``."""
        if self.request_rates:
            return [(self.max_concurrency or 0, rate) for rate in self.request_rates]
        return [(c, None) for c in self.concurrencies]

    def requests_for(self, concurrency: int, rate: float | None = None) -> int | None:
        """Requests in a counted level: ``num_requests``, or by default 4 per concurrent slot (at least 8);
        open loop: 10 seconds' worth of arrivals at ``rate`` (at least 20)."""
        if self.duration_s is not None:
            return None
        if self.num_requests is not None:
            return self.num_requests
        return max(20, round(10 * rate)) if rate is not None else max(8, 4 * concurrency)

    def plan(self, concurrency: int, rate: float | None = None, **load) -> LoadPlan:
        """The :class:`LoadPlan` of a level with this run's tokens, rate and seeds; ``load``: its size."""
        return LoadPlan(
            concurrency=concurrency,
            max_tokens=self.max_tokens,
            request_rate=rate,
            arrival_seed=self.seed or 0,
            seed=self.seed if self.sampled else None,
            **load,
        )

    def round_plans(self, concurrency: int, rate: float | None = None) -> list[LoadPlan]:
        """The level's plan per round: its requests (or seconds) split as evenly as possible, earlier
        rounds taking the remainder. A counted closed-loop level has at most ``requests // concurrency``
        rounds (at least one), so that every round can hold ``concurrency`` requests in flight."""
        total = self.requests_for(concurrency, rate)
        if total is None:
            return [self.plan(concurrency, rate, duration_s=self.duration_s / self.rounds)] * self.rounds
        rounds = max(1, min(self.rounds, total // max(concurrency, 1)))
        counts = [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]
        return [self.plan(concurrency, rate, num_requests=n) for n in counts]


def command_line() -> str:
    """This process's command line, shell-quoted, with the program's file name only (``specpipe bench ...``)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


@dataclass
class BenchRun:
    """Everything measured so far.

    Attributes:
        deployments: per deployment: name, kind, address, metrics URL and what the pre-flight found.
        levels: one :class:`LevelResult` per deployment and concurrency, in the order run.
        incomplete: the run did not finish every planned level; ``reasons`` says why.
        command: the command line that made the run (recorded in ``bench.json``).
        prompts: the text of every prompt sent, by prompt id (the profile exports carry it).
    """

    settings: BenchSettings
    deployments: list[dict[str, Any]] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)
    incomplete: bool = False
    reasons: list[str] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    finished: str | None = None
    command: str = field(default_factory=command_line)
    prompts: dict[str, str] = field(default_factory=dict)

    def mark_incomplete(self, reason: str) -> None:
        self.incomplete = True
        if reason not in self.reasons:
            self.reasons.append(reason)


async def _warm_up(backend, prompts: list[Prompt], settings: BenchSettings) -> tuple[str | None, dict | None]:
    """Send the warm-up requests; the first error (or ``None``) and the first request's timing."""
    first = None
    for i in range(settings.warmup):
        result, _, _ = await backend.send(prompts[i % len(prompts)].text, settings.max_tokens)
        if first is None:
            first = first_request(result.ttft_s, result.latency_s, result.error)
        if result.error is not None:
            return result.error, first
    return None, first


def first_request(ttft_s: float | None, latency_s: float, error: str | None) -> dict:
    """The first request the benchmark sent to a deployment: ``ttft_ms``, ``latency_ms``, ``error``. Right
    after the server became ready this is the cold request; the levels' TTFTs are the steady state."""
    return {
        "ttft_ms": None if ttft_s is None else round(ttft_s * 1e3, 1),
        "latency_ms": round(latency_s * 1e3, 1),
        "error": error,
    }


async def run_bench(
    endpoints: list[Endpoint],
    prompts: list[Prompt],
    settings: BenchSettings,
    run: BenchRun,
    progress=None,
    backends: list | None = None,
) -> BenchRun:
    """Measure every deployment at every concurrency, filling ``run`` as results arrive.

    Args:
        backends: one client per endpoint (default: :func:`~specpipe.bench.backends.make_backend`).

    Raises:
        SpecpipeError: a deployment fails its pre-flight check (nothing has been measured then).
    """
    if backends is None:
        from specpipe.bench.backend_base import Sampling
        from specpipe.bench.backends import make_backend

        sampling = Sampling(settings.temperature, settings.top_p, settings.ignore_eos)
        backends = [make_backend(e, settings.timeout_s, settings.chat, settings.tokenizer, sampling) for e in endpoints]
    try:
        for backend in backends:
            await backend.open()
        for endpoint, backend in zip(endpoints, backends):
            info = await backend.preflight()
            run.deployments.append(
                {
                    "name": endpoint.name,
                    "kind": endpoint.kind,
                    "address": endpoint.address,
                    "metrics_url": endpoint.metrics_url,
                    **info,
                }
            )
        if settings.input_len is not None:
            prompts = synthetic_prompts(settings.input_len, _tokenizer_source(settings, backends), len(prompts))
        run.prompts = {p.id: p.text for p in prompts}
        if progress is not None:
            progress.start()  # shown once every deployment passed its checks
        if settings.rounds > 1:
            await _bench_in_rounds(endpoints, backends, prompts, settings, run, progress)
        else:
            for endpoint, backend in zip(endpoints, backends):
                await _bench_deployment(endpoint, backend, prompts, settings, run, progress)
    finally:
        for backend in backends:
            await backend.close()
    run.finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return run


async def _warm_up_deployment(
    endpoint: Endpoint, backend, prompts: list[Prompt], settings: BenchSettings, run: BenchRun, progress
) -> bool:
    """Warm ``backend`` up (recording its first request); ``False`` when its server stopped answering."""
    info = next((d for d in run.deployments if d["name"] == endpoint.name), {})
    if not settings.warmup:
        return True
    task = progress.add_task(f"{endpoint.name}: warm-up", total=settings.warmup) if progress else None
    error, info["first_request"] = await _warm_up(backend, prompts, settings)
    if progress:
        progress.update(task, completed=settings.warmup, visible=False)
    if error is not None and not await backend.alive():
        run.mark_incomplete(f"{endpoint.name}: the server stopped answering during warm-up ({one_line(error)})")
        return False
    return True


def _note_first_request(run: BenchRun, endpoint: Endpoint, level: LevelResult) -> None:
    """Without a warm-up, a deployment's first request is the first of its first level."""
    info = next((d for d in run.deployments if d["name"] == endpoint.name), {})
    if "first_request" not in info and level.records:
        first = min(level.records, key=lambda r: r.start_s)
        info["first_request"] = first_request(first.ttft_s, first.latency_s, first.error)


async def _bench_deployment(
    endpoint: Endpoint, backend, prompts: list[Prompt], settings: BenchSettings, run: BenchRun, progress
) -> None:
    if not await _warm_up_deployment(endpoint, backend, prompts, settings, run, progress):
        return
    for concurrency, rate in settings.levels():
        total = settings.requests_for(concurrency, rate)
        plan = settings.plan(concurrency, rate, num_requests=total, duration_s=settings.duration_s)
        level = LevelResult(endpoint.name, concurrency, request_rate=rate)
        run.levels.append(level)
        label = f"{endpoint.name} @ {level.label}"
        task = progress.add_task(label, total=total) if progress else None
        on_record = (lambda record: progress.advance(task)) if progress else (lambda record: None)
        await run_level(backend, prompts, plan, level, on_record)
        _note_first_request(run, endpoint, level)
        if progress:
            progress.update(task, description=f"{label} ({len(level.records)} requests)")
        if level.incomplete:
            run.mark_incomplete(f"{endpoint.name}: {level.reason}; load levels after {level.label} were not run")
            return


async def _bench_in_rounds(
    endpoints: list[Endpoint], backends: list, prompts: list[Prompt], settings: BenchSettings, run: BenchRun, progress
) -> None:
    """Every level in ``settings.rounds`` rounds, the deployments taking turns within each round."""
    live = [
        (e, b) for e, b in zip(endpoints, backends) if await _warm_up_deployment(e, b, prompts, settings, run, progress)
    ]
    for concurrency, rate in settings.levels():
        total = settings.requests_for(concurrency, rate)
        levels, tasks = {}, {}
        for endpoint, _ in live:
            levels[endpoint.name] = LevelResult(endpoint.name, concurrency, request_rate=rate)
            run.levels.append(levels[endpoint.name])
            label = f"{endpoint.name} @ {levels[endpoint.name].label}"
            tasks[endpoint.name] = progress.add_task(label, total=total) if progress else None
        for number, plan in enumerate(settings.round_plans(concurrency, rate)):
            for endpoint, backend in list(live):
                level, task = levels[endpoint.name], tasks[endpoint.name]
                on_record = _round_marker(number, progress, task)
                await run_level(backend, prompts, plan, level, on_record)
                if level.incomplete:
                    run.mark_incomplete(f"{endpoint.name}: {level.reason}; its later rounds and levels were not run")
                    live.remove((endpoint, backend))
        for endpoint in endpoints:
            if endpoint.name in levels:
                _note_first_request(run, endpoint, levels[endpoint.name])


def _tokenizer_source(settings: BenchSettings, backends: list) -> str:
    """The tokenizer synthetic prompts are built with: ``--tokenizer``, else the first deployment's own
    (a Triton ensemble's ``tokenizer_dir`` on this machine, found by its pre-flight check).

    Raises:
        SpecpipeError: neither is known.
    """
    if settings.tokenizer:
        return settings.tokenizer
    for backend in backends:
        counter = getattr(backend, "counter", None)
        if counter:
            return counter.source
    raise SpecpipeError(
        f"--input-len {settings.input_len} needs the deployments' tokenizer to build prompts of exactly "
        "that many tokens: pass --tokenizer DIR_OR_ID"
    )


def _round_marker(number: int, progress, task):
    """The ``on_record`` of round ``number``: stamps the record with its round and advances the progress bar."""

    def on_record(record) -> None:
        record.round = number
        if progress:
            progress.advance(task)

    return on_record
