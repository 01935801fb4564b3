"""Statistics of one load level, with GenAI-Perf / AIPerf metric definitions.

Sources for the definitions: NVIDIA AIPerf, "AIPerf Metrics Reference"
(https://docs.nvidia.com/aiperf/reference/ai-perf-metrics-reference) and the "Metrics" section of
NVIDIA GenAI-Perf's README (Triton Inference Server user guide, perf_analyzer/genai-perf). In short:

- time to first token (TTFT): from sending the request to the first response that carries output;
- end-to-end (request) latency: from sending the request to its final response;
- inter-token latency (ITL): (end-to-end latency - TTFT) / (output tokens - 1), per request;
- benchmark duration: from the first request sent to the last response received in the level;
- output token throughput: output tokens of all completed requests / benchmark duration;
- request throughput: completed requests / benchmark duration.

Percentiles use numpy's default linear interpolation between closest ranks
(``numpy.percentile(values, q, method="linear")``). Latencies in the aggregates are milliseconds.
A percentile needs enough requests to mean anything (:data:`MIN_REQUESTS`): p50 10, p90 20 (two
requests beyond it), p99 100 (below that the interpolated p99 lies between the two largest values,
the maximum in all but name). With fewer, the figure is still computed but listed in the
distribution's ``thin`` (``bench.json``) and shown marked ``*`` in the table.

Open loop (``--request-rate``): the offered rate is the rate arrivals were drawn at; the achieved rate
is the request throughput (completed requests / benchmark duration), as vLLM's ``bench serve``
reports ``Request throughput`` beside its ``--request-rate``.

Speculative-decoding figures (specpipe's own, from the TensorRT-LLM perf outputs):

- acceptance rate, aggregated: sum of accepted draft tokens / sum of proposed draft tokens over the
  level's completed requests (token-weighted); the per-request mean is reported beside it;
- mean accepted length, aggregated: tokens per target decoding forward after the first token,
  sum(F - 1 + A) / sum(F - 1) over requests with counters (F target forwards, A accepted draft tokens)
  where the deployment returns ``target_forwards`` (the CPU runtime), else estimated from the N output
  tokens as sum(N - 1) / sum(N - 1 - A) (TensorRT-LLM, vLLM);
  ``accepted_length_source`` says which (:attr:`~specpipe.bench.records.RequestRecord.decoding_steps`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from specpipe.bench.records import LevelResult, RequestRecord

#: Values of :attr:`Aggregate.accepted_length_source`.
LENGTH_SOURCES = ("target forwards", "output tokens", "target forwards and output tokens", "server counters")


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; ``None`` for no values."""
    data = [float(v) for v in values]
    if not data:
        return None
    return float(np.percentile(np.asarray(data, dtype=np.float64), q, method="linear"))


#: Fewest values for which each percentile is shown unmarked (module doc).
MIN_REQUESTS = {"p50": 10, "p90": 20, "p99": 100}


@dataclass(frozen=True)
class Distribution:
    """Summary of one per-request metric: mean, min, max and p50/p90/p99 (same unit as the input).

    Attributes:
        thin: the percentiles computed from fewer values than :data:`MIN_REQUESTS` asks (e.g.
            ``("p90", "p99")`` for 12 values); empty when every one has enough, or there are none.
    """

    count: int
    mean: float | None
    min: float | None
    max: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    thin: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: Iterable[float]) -> "Distribution":
        data = [float(v) for v in values]
        if not data:
            return cls(0, None, None, None, None, None, None)
        thin = tuple(name for name, least in MIN_REQUESTS.items() if len(data) < least)
        return cls(
            len(data),
            float(np.mean(data)),
            min(data),
            max(data),
            percentile(data, 50),
            percentile(data, 90),
            percentile(data, 99),
            thin,
        )


def _ms(seconds: Iterable[float | None]) -> list[float]:
    return [s * 1000.0 for s in seconds if s is not None]


@dataclass(frozen=True)
class Aggregate:
    """The figures of one deployment at one concurrency.

    Attributes:
        requests, completed, errors: requests sent, completed, failed.
        duration_s: benchmark duration, seconds (first send to last response, all requests).
        output_tokens: output tokens of the completed requests (``None`` when no count is known).
        output_token_throughput: tokens/s; request_throughput: requests/s.
        ttft_ms, itl_ms, e2e_ms: distributions in milliseconds (completed requests).
        output_tokens_per_request: distribution of output tokens per completed request.
        acceptance_rate: aggregated (token-weighted) acceptance in [0, 1], ``None`` without drafts.
        acceptance_rate_mean: mean of the per-request acceptance rates.
        mean_accepted_length: aggregated tokens per decoding step; ``..._mean`` per-request mean.
        acceptance_source: ``"perf outputs"``, ``"server counters"`` or ``None``.
        accepted_length_source: what the decoding forwards of ``mean_accepted_length`` came from: one of
            :data:`LENGTH_SOURCES` (``"target forwards"`` exact, ``"output tokens"`` estimated, both where the
            requests differ, ``"server counters"``), ``None`` without a length.
        token_count_sources: sorted distinct :data:`~specpipe.bench.records.TOKEN_SOURCES` used.
        acceptance_by_position: per draft position, accepted tokens / draft proposals from the server's
            counters (``None`` when it reports none).
    """

    requests: int
    completed: int
    errors: int
    duration_s: float | None
    output_tokens: int | None
    output_token_throughput: float | None
    request_throughput: float | None
    ttft_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    output_tokens_per_request: Distribution
    acceptance_rate: float | None
    acceptance_rate_mean: float | None
    mean_accepted_length: float | None
    mean_accepted_length_mean: float | None
    acceptance_source: str | None
    token_count_sources: tuple[str, ...]
    acceptance_by_position: list[float] | None = None
    accepted_length_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def benchmark_duration(records: list[RequestRecord]) -> float | None:
    """Seconds from the first request sent to the last response received (``None`` for no record)."""
    if not records:
        return None
    return max(r.end_s for r in records) - min(r.start_s for r in records)


def aggregate(records: list[RequestRecord], counters=None) -> Aggregate:
    """The :class:`Aggregate` of one level's records.

    Args:
        counters: a :class:`~specpipe.bench.records.CounterAcceptance` used for the acceptance
            figures when no record carries draft counters (OpenAI-compatible servers).
    """
    done = [r for r in records if r.ok]
    duration = benchmark_duration(records)
    counted = [r.output_tokens for r in done if r.output_tokens is not None]
    tokens = sum(counted) if counted else None
    rate = lambda amount: (amount / duration) if amount is not None and duration else None  # noqa: E731

    with_drafts = [r for r in done if r.draft_tokens is not None and r.accepted_draft_tokens is not None]
    proposed = sum(r.draft_tokens for r in with_drafts)
    accepted = sum(r.accepted_draft_tokens for r in with_drafts)
    per_request_rates = [r.acceptance_rate for r in with_drafts if r.acceptance_rate is not None and r.draft_tokens]
    lengths = [r for r in with_drafts if r.decoding_steps is not None]
    produced = sum(r.decoding_steps[0] for r in lengths)
    steps = sum(r.decoding_steps[1] for r in lengths)
    per_request_lengths = [r.mean_accepted_length for r in lengths if r.mean_accepted_length is not None]
    exact = {r.target_forwards is not None for r in lengths}
    length_source = (
        LENGTH_SOURCES[0] if exact == {True} else LENGTH_SOURCES[1] if exact == {False} else LENGTH_SOURCES[2]
    )

    source = "perf outputs" if with_drafts else None
    acceptance = accepted / proposed if proposed else None
    mean_length = produced / steps if steps > 0 else None
    length_source = length_source if mean_length is not None else None
    if not with_drafts and counters is not None:
        source = "server counters"
        acceptance = counters.accepted_draft_tokens / counters.draft_tokens if counters.draft_tokens else None
        if counters.output_tokens is not None and counters.requests is not None:
            produced_c = counters.output_tokens - counters.requests
            steps_c = produced_c - counters.accepted_draft_tokens
            mean_length = produced_c / steps_c if steps_c > 0 else None
            length_source = LENGTH_SOURCES[3] if mean_length is not None else None

    return Aggregate(
        requests=len(records),
        completed=len(done),
        errors=len(records) - len(done),
        duration_s=duration,
        output_tokens=tokens,
        output_token_throughput=rate(tokens),
        request_throughput=rate(len(done)) if records else None,
        ttft_ms=Distribution.of(_ms(r.ttft_s for r in done)),
        itl_ms=Distribution.of(_ms(r.itl_s for r in done)),
        e2e_ms=Distribution.of(_ms(r.latency_s for r in done)),
        output_tokens_per_request=Distribution.of(counted),
        acceptance_rate=acceptance,
        acceptance_rate_mean=float(np.mean(per_request_rates)) if per_request_rates else None,
        mean_accepted_length=mean_length,
        mean_accepted_length_mean=float(np.mean(per_request_lengths)) if per_request_lengths else None,
        acceptance_source=source,
        token_count_sources=tuple(sorted({r.output_tokens_source for r in done if r.output_tokens is not None})),
        acceptance_by_position=None if counters is None else counters.acceptance_by_position,
        accepted_length_source=length_source,
    )


def level_aggregate(level: LevelResult) -> Aggregate:
    """:func:`aggregate` of a :class:`LevelResult` (its records and counters)."""
    return aggregate(level.records, level.counters)


def speedup(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline`` (e.g. tokens/s against the baseline's), ``None`` when either is missing or 0."""
    if value is None or not baseline:
        return None
    return value / baseline
