"""What ``specpipe bench`` measures, as plain data: one record per request, one result per load level.

Times are seconds on a monotonic clock whose origin is the start of the load level, so records of
one level can be placed on one time line (throughput windows, see :mod:`specpipe.bench.stats`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specpipe.generation.spec_metrics import decoding_steps

#: Where a request's output token count came from, best first.
TOKEN_SOURCES = ("server", "usage", "tokenizer", "chunks")


@dataclass
class RequestRecord:
    """One measured request.

    Attributes:
        deployment: the deployment's name (``--url NAME=...``).
        concurrency: requests kept in flight during the level.
        index: order in which the request was sent within its level (0-based).
        prompt_id: ``id`` of the prompt sent.
        start_s: seconds from the level's origin to sending the request.
        latency_s: end-to-end latency, seconds from sending to the final response (or the error).
        ttft_s: time to first token, seconds from sending to the first response carrying text;
            ``None`` when no text came back.
        output_tokens: tokens generated; ``None`` when unknown.
        output_tokens_source: one of :data:`TOKEN_SOURCES`: the server's ``num_output_tokens``
            perf output, the OpenAI ``usage`` block, re-tokenizing the text, or (approximate) the
            number of streamed chunks.
        input_tokens: prompt length in tokens when the server reported it.
        chunks: streamed responses that carried text.
        acceptance_rate: accepted / proposed draft tokens of this request, in [0, 1]; ``None`` when
            the server reported no draft tokens.
        accepted_draft_tokens, draft_tokens: the server's counters for this request.
        target_forwards: target forward passes of this request, the prefill's included, from the
            deployment's ``target_forwards`` perf output (the CPU runtime's); ``None`` where it returns none
            (TensorRT-LLM, vLLM), and :attr:`decoding_steps` then estimates them from the output tokens.
        text: the generated text.
        error: the error message; ``None`` for a completed request.
        round: the round (0-based) the request was sent in when the deployments took turns
            (``rounds`` > 1, :mod:`specpipe.bench.runner`); 0 otherwise.
        scheduled_s: open loop (``--request-rate``): seconds from the level's origin to the request's
            Poisson arrival time; ``start_s`` is later when ``--max-concurrency`` made it wait. ``None``
            in closed loop.
        seed: the sampling seed sent (base seed + ``index``); ``None`` for greedy or unseeded requests.
        chunk_times_s: seconds from sending to each streamed response that carried text.
        chunk_texts: the text of each of those responses (their concatenation is ``text``).
    """

    deployment: str
    concurrency: int
    index: int
    prompt_id: str
    start_s: float
    latency_s: float
    ttft_s: float | None = None
    output_tokens: int | None = None
    output_tokens_source: str = "server"
    input_tokens: int | None = None
    chunks: int = 0
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None
    target_forwards: int | None = None
    text: str = ""
    error: str | None = None
    round: int = 0
    scheduled_s: float | None = None
    seed: int | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Completed without an error."""
        return self.error is None

    @property
    def end_s(self) -> float:
        """Seconds from the level's origin to the final response."""
        return self.start_s + self.latency_s

    @property
    def itl_s(self) -> float | None:
        """Inter-token latency, seconds: (end-to-end latency - TTFT) / (output tokens - 1).

        GenAI-Perf / AIPerf definition (AIPerf metrics reference, "Inter Token Latency"); defined
        for completed requests with a TTFT and at least 2 output tokens, else ``None``.
        """
        if not self.ok or self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def decoding_steps(self) -> tuple[int, int] | None:
        """``(tokens after the first, target decoding forwards)`` of a completed request with draft counters
        (:func:`~specpipe.generation.spec_metrics.decoding_steps`: exact with ``target_forwards``, else
        estimated from the output tokens), or ``None`` (no counters, an error, fewer than 2 tokens)."""
        if not self.ok or self.output_tokens is None or self.output_tokens < 2 or self.accepted_draft_tokens is None:
            return None
        return decoding_steps(self.output_tokens, self.accepted_draft_tokens, self.target_forwards)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target decoding forward after the first token, from :attr:`decoding_steps`: 1.0
        without speculation; ``None`` where those are unknown or no decoding forward ran."""
        steps = self.decoding_steps
        return steps[0] / steps[1] if steps is not None and steps[1] > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The record with its derived values (``end_s``, ``itl_s``, ``mean_accepted_length``)."""
        return {
            **asdict(self),
            "end_s": self.end_s,
            "itl_s": self.itl_s,
            "mean_accepted_length": self.mean_accepted_length,
        }


@dataclass
class CounterAcceptance:
    """Acceptance read from a server's Prometheus counters over one level (OpenAI-compatible servers).

    Attributes:
        draft_tokens, accepted_draft_tokens: counter increases during the level.
        output_tokens: increase of the output-token counter (``None`` if the server has none).
        requests: increase of the request counter (``None`` if the server has none).
        source: which exporter the counters came from (``vllm``, ``specpipe-triton``, ``specpipe``; see
            :mod:`specpipe.bench.metrics`).
        drafts: increase of the count of draft proposals (decoding steps that drafted), ``None`` if
            the server has no such counter.
        accepted_per_position: accepted draft tokens at each draft position (0-based) over the level;
            empty when the server reports none.
    """

    draft_tokens: float
    accepted_draft_tokens: float
    output_tokens: float | None = None
    requests: float | None = None
    source: str = ""
    drafts: float | None = None
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    @property
    def acceptance_by_position(self) -> list[float] | None:
        """Per draft position k (0-based): accepted tokens at k / draft proposals, in [0, 1] (vLLM's
        per-position acceptance rate); ``None`` without both counters."""
        if not self.accepted_per_position or not self.drafts:
            return None
        return [
            self.accepted_per_position.get(k, 0.0) / self.drafts for k in range(max(self.accepted_per_position) + 1)
        ]


@dataclass
class LevelResult:
    """All requests of one deployment at one load level, and what else was observed.

    A level is closed loop (``concurrency`` requests in flight) or, with ``request_rate``, open loop
    (Poisson arrivals at that rate; ``concurrency`` is then the ``--max-concurrency`` cap, 0 for none).

    Attributes:
        request_rate: offered request rate of an open-loop level, requests/s; ``None`` in closed loop.
        origin_unix_ns: wall-clock time of the level's origin (``start_s`` = 0), ns since the epoch.
        memory_peak_bytes: the highest memory use seen during the level, bytes: GPU memory when the
            server's metrics report any, else the server's own process tree when it runs on this machine
            (:mod:`specpipe.bench.process_memory`), else the host's CPU memory in use from the metrics.
        memory_kind: ``"gpu"``, ``"process"``, ``"cpu"`` (host-wide) or ``None`` when nothing could be read.
        incomplete: the level stopped early (server died, interrupted); ``reason`` says why.
        counters: acceptance from the server's counters, when requests carry no perf outputs.
    """

    deployment: str
    concurrency: int
    records: list[RequestRecord] = field(default_factory=list)
    memory_peak_bytes: float | None = None
    memory_kind: str | None = None
    incomplete: bool = False
    reason: str | None = None
    counters: CounterAcceptance | None = None
    request_rate: float | None = None
    origin_unix_ns: int | None = None

    @property
    def key(self) -> tuple[int, float | None]:
        """What identifies the level across deployments: (concurrency, request rate)."""
        return self.concurrency, self.request_rate

    @property
    def label(self) -> str:
        """``concurrency 4``, ``rate 2 req/s`` or ``rate 2 req/s, max 8 in flight``."""
        if self.request_rate is None:
            return f"concurrency {self.concurrency}"
        cap = f", max {self.concurrency} in flight" if self.concurrency else ""
        return f"rate {self.request_rate:g} req/s{cap}"
