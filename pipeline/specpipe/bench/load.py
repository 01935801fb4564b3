"""Load for one deployment at one load level: closed loop (a concurrency) or open loop (a request rate).

Closed loop: ``concurrency`` workers each send a request, wait for its last response, and send the
next, so exactly ``concurrency`` requests are in flight until the level ends (GenAI-Perf's and
AIPerf's ``--concurrency`` mode).

Open loop (``request_rate`` R requests/s): requests arrive as a Poisson process, the gaps between
arrivals drawn from an exponential distribution of mean 1/R from a ``random.Random`` seeded with
``arrival_seed`` (the first request arrives at 0), and each is sent at its arrival time whatever is
still in flight (vLLM ``benchmarks/benchmark_serving.py`` ``get_request`` with burstiness 1, i.e.
``np.random.gamma(1, 1/R)`` gaps, @ vllm-project/vllm 8668d7c05027b98ac66bd5540955dd2ce3a0f318;
GenAI-Perf ``--request-rate``). With ``max_concurrency`` a request that arrives while that many are in flight
waits for one to end (vLLM ``--max-concurrency``: a semaphore taken before sending); its record keeps
both its arrival (``scheduled_s``) and its send time (``start_s``), and latencies run from the send.

The level ends after ``num_requests`` requests, or once ``duration_s`` seconds have passed since it
started (closed loop: no new request after that; open loop: no arrival at or after it; requests
already in flight then are completed and counted). Request ``i`` of a level uses prompt
``i mod len(prompts)``, so every deployment and level sees the same prompts in the same order, and
with ``seed`` set it is sent with sampling seed ``seed + i``.

A request that fails is recorded with its error; the deployment's server is then asked whether it
is still live, and if not the level stops at once and is marked incomplete.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import Callable

from specpipe.bench.prompts import Prompt
from specpipe.bench.records import CounterAcceptance, LevelResult, RequestRecord
from specpipe.client.llm import GenerationResult


@dataclass(frozen=True)
class LoadPlan:
    """How much load one level applies.

    Attributes:
        concurrency: requests kept in flight (>= 1).
        max_tokens: new tokens asked for per request.
        num_requests: requests in the level; ``None`` when the level is timed.
        duration_s: length of a timed level, seconds; ``None`` when it is counted.
        memory_interval_s: seconds between two scrapes of the server's memory figure.
        request_rate: open loop: mean arrivals per second (> 0); ``None``: closed loop.
        arrival_seed: seed of the open loop's arrival times.
        seed: base sampling seed; request ``i`` is sent with ``seed + i`` (``None``: no seed sent).

    In open loop ``concurrency`` is the ``--max-concurrency`` cap (0: none).
    """

    concurrency: int
    max_tokens: int
    num_requests: int | None = None
    duration_s: float | None = None
    memory_interval_s: float = 1.0
    request_rate: float | None = None
    arrival_seed: int = 0
    seed: int | None = None


def arrival_times(rate: float, seed: int, count: int | None = None, duration_s: float | None = None):
    """Poisson arrival times, seconds from 0: the first at 0, then gaps ~ Exponential(mean 1/``rate``)
    from ``random.Random(seed)``; ``count`` of them, or those before ``duration_s`` (an endless
    generator when neither is given)."""
    rng = random.Random(seed)
    at = 0.0
    for number in itertools.count():
        if count is not None and number >= count:
            return
        if duration_s is not None and at >= duration_s:
            return
        yield at
        at += rng.expovariate(rate)


def one_line(error: str, limit: int = 300) -> str:
    """A multi-line error (gRPC's ``AioRpcError`` puts its status and details on later lines) as one line."""
    text = " ".join(error.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_record(
    deployment: str,
    concurrency: int,
    index: int,
    prompt: Prompt,
    start_s: float,
    result: GenerationResult,
    tokens: int | None,
    source: str,
    seed: int | None = None,
    scheduled_s: float | None = None,
) -> RequestRecord:
    """A :class:`RequestRecord` from one backend answer (draft counters from the perf outputs)."""
    perf = result.perf
    drafts = perf.get("total_draft_tokens")
    accepted = perf.get("total_accepted_draft_tokens")
    return RequestRecord(
        deployment=deployment,
        concurrency=concurrency,
        index=index,
        prompt_id=prompt.id,
        start_s=start_s,
        latency_s=result.latency_s,
        ttft_s=result.ttft_s,
        output_tokens=tokens if result.error is None else None,
        output_tokens_source=source,
        input_tokens=int(perf["num_input_tokens"]) if "num_input_tokens" in perf else None,
        chunks=len(result.chunks),
        acceptance_rate=float(perf["acceptance_rate"]) if "acceptance_rate" in perf and drafts else None,
        accepted_draft_tokens=None if accepted is None else int(accepted),
        draft_tokens=None if drafts is None else int(drafts),
        target_forwards=int(perf["target_forwards"]) if "target_forwards" in perf else None,
        text=result.text,
        error=result.error,
        scheduled_s=scheduled_s,
        seed=seed,
        chunk_times_s=list(result.chunk_times_s),
        chunk_texts=list(result.chunks),
    )


def add_counters(total: CounterAcceptance | None, delta: CounterAcceptance | None) -> CounterAcceptance | None:
    """Counter increases of two rounds of one level, added (``None`` when either is unknown)."""
    if total is None or delta is None:
        return None
    plus = lambda a, b: None if a is None or b is None else a + b  # noqa: E731
    positions = {
        k: total.accepted_per_position.get(k, 0.0) + delta.accepted_per_position.get(k, 0.0)
        for k in set(total.accepted_per_position) | set(delta.accepted_per_position)
    }
    return CounterAcceptance(
        draft_tokens=total.draft_tokens + delta.draft_tokens,
        accepted_draft_tokens=total.accepted_draft_tokens + delta.accepted_draft_tokens,
        output_tokens=plus(total.output_tokens, delta.output_tokens),
        requests=plus(total.requests, delta.requests),
        source=delta.source,
        drafts=plus(total.drafts, delta.drafts),
        accepted_per_position=positions,
    )


def counter_delta(before: dict | None, after: dict | None) -> CounterAcceptance | None:
    """The increase of a server's speculative-decoding counters between two scrapes."""
    if not before or not after or before.get("source") != after.get("source"):
        return None
    diff = lambda key: None if before.get(key) is None or after.get(key) is None else after[key] - before[key]  # noqa: E731
    old, new = before.get("accepted_per_position") or {}, after.get("accepted_per_position") or {}
    positions = {k: v - old.get(k, 0.0) for k, v in new.items()}
    return CounterAcceptance(
        draft_tokens=diff("draft_tokens") or 0.0,
        accepted_draft_tokens=diff("accepted_draft_tokens") or 0.0,
        output_tokens=diff("output_tokens"),
        requests=diff("requests"),
        source=str(after["source"]),
        drafts=diff("drafts"),
        accepted_per_position=positions,
    )


async def _memory_now(backend, pid: int | None, session, timeout_s: float) -> tuple[float, str] | None:
    """One memory figure: GPU memory from the server's metrics when it reports GPUs, else the process tree
    of a server listening on this machine (:mod:`specpipe.bench.process_memory`), else the host's CPU
    memory in use from the metrics."""
    from specpipe.bench.metrics import memory_used, scrape
    from specpipe.bench.process_memory import tree_memory

    url = backend.endpoint.metrics_url
    samples = await scrape(session, url, timeout_s=timeout_s) if url else None
    found = memory_used(samples) if samples else None
    if pid is not None and (found is None or found[1] != "gpu"):
        value = await asyncio.to_thread(tree_memory, pid)
        found = (float(value), "process") if value is not None else found
    return found


def _keep_peak(level: LevelResult, found: tuple[float, str] | None) -> None:
    if found is not None and (level.memory_peak_bytes is None or found[0] > level.memory_peak_bytes):
        level.memory_peak_bytes, level.memory_kind = found


async def _server_pid(backend) -> int | None:
    """The local server's pid for ``backend`` (looked up once per backend; ``None`` when not local)."""
    from specpipe.bench.process_memory import local_server_pid

    if not hasattr(backend, "_specpipe_server_pid"):
        backend._specpipe_server_pid = await asyncio.to_thread(local_server_pid, _host_port(backend.endpoint.address))
    return backend._specpipe_server_pid


async def _sample_memory(backend, level: LevelResult, interval_s: float, session, pid: int | None) -> None:
    """Record the level's peak memory (see :func:`_memory_now`) every ``interval_s`` seconds."""
    if not backend.endpoint.metrics_url and pid is None:
        return
    while True:
        _keep_peak(level, await _memory_now(backend, pid, session, max(interval_s, 2.0)))
        await asyncio.sleep(interval_s)


def _host_port(address: str) -> str:
    """``HOST:PORT`` of a Triton address (already that) or of an OpenAI API root URL."""
    if "://" not in address:
        return address
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


async def _send(
    backend, prompt: Prompt, plan: LoadPlan, index: int
) -> tuple[GenerationResult, int | None, str, int | None]:
    """Send one request (a client-side failure becomes an error result); also returns the seed sent."""
    seed = None if plan.seed is None else plan.seed + index
    sent = time.perf_counter()
    try:
        if seed is None:
            result, tokens, source = await backend.send(prompt.text, plan.max_tokens)
        else:
            result, tokens, source = await backend.send(prompt.text, plan.max_tokens, seed=seed)
    except Exception as exc:  # a client-side failure still becomes a record
        result = GenerationResult(latency_s=time.perf_counter() - sent, error=f"{type(exc).__name__}: {exc}")
        tokens, source = None, "server"
    return result, tokens, source, seed


async def run_level(
    backend,
    prompts: list[Prompt],
    plan: LoadPlan,
    level: LevelResult,
    on_record: Callable[[RequestRecord], None] = lambda record: None,
) -> LevelResult:
    """Apply ``plan`` to ``backend`` (closed or open loop, module doc), appending each request's record
    to ``level`` as it completes.

    ``level`` is filled in place, so a caller interrupted mid-level still holds what was measured. A
    level that already holds records (an earlier round, :func:`~specpipe.bench.runner.run_bench` with
    ``rounds``) is continued: request indices go on from its last one, and the new records' times from
    its last response, so that its duration is the sum of its rounds' and its draft counters add up.
    """
    import aiohttp

    pid = await _server_pid(backend)  # before the clock starts: a /proc scan
    first_index = max((r.index + 1 for r in level.records), default=0)
    time_offset_s = max((r.end_s for r in level.records), default=0.0)
    level.request_rate = plan.request_rate
    stop = asyncio.Event()
    counters = getattr(backend, "counters", None)
    before = await counters() if counters else None
    origin = time.perf_counter()
    if level.origin_unix_ns is None:
        level.origin_unix_ns = time.time_ns()

    async def measure(index: int, scheduled_s: float | None = None) -> None:
        prompt = prompts[index % len(prompts)]
        sent = time.perf_counter()
        result, tokens, source, seed = await _send(backend, prompt, plan, index)
        start = sent - origin + time_offset_s
        scheduled = None if scheduled_s is None else scheduled_s + time_offset_s
        record = make_record(
            level.deployment, plan.concurrency, index, prompt, start, result, tokens, source, seed, scheduled
        )
        level.records.append(record)
        on_record(record)
        if record.error is not None and not stop.is_set() and not await backend.alive():
            level.incomplete = True
            level.reason = f"the server stopped answering during the run ({one_line(record.error)})"
            stop.set()

    async def worker(indices) -> None:
        while not stop.is_set():
            index = next(indices)
            if plan.num_requests is not None and index - first_index >= plan.num_requests:
                return
            if plan.duration_s is not None and time.perf_counter() - origin >= plan.duration_s:
                return
            await measure(index)

    async def open_loop() -> None:
        cap = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None
        tasks = []

        async def arrive(index: int, at: float) -> None:
            if cap is None:
                return await measure(index, at)
            async with cap:
                if not stop.is_set():
                    await measure(index, at)

        seed = plan.arrival_seed + first_index
        for number, at in enumerate(arrival_times(plan.request_rate, seed, plan.num_requests, plan.duration_s)):
            delay = origin + at - time.perf_counter()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if stop.is_set():
                break
            tasks.append(asyncio.create_task(arrive(first_index + number, at)))
        await asyncio.gather(*tasks)

    async with aiohttp.ClientSession() as session:
        sampler = asyncio.create_task(_sample_memory(backend, level, plan.memory_interval_s, session, pid))
        try:
            if plan.request_rate is not None:
                await open_loop()
            else:
                indices = itertools.count(first_index)
                await asyncio.gather(*(worker(indices) for _ in range(plan.concurrency)))
            _keep_peak(level, await _memory_now(backend, pid, session, 2.0))  # a short level gets one figure at least
        finally:
            sampler.cancel()
            try:
                await sampler
            except (asyncio.CancelledError, Exception):
                pass
    if counters and not level.incomplete:
        delta = counter_delta(before, await counters())
        level.counters = add_counters(level.counters, delta) if first_index else delta
    level.records.sort(key=lambda r: r.index)
    return level
