"""Names, buckets and per-step bookkeeping of specpipe's speculative-decoding metrics, shared by the CPU
``tensorrt_llm`` Triton model (:mod:`specpipe.triton.models.scheduler_metrics`, on Triton's metrics
port) and the OpenAI gateway (:mod:`specpipe.openai.metrics`, on its ``/metrics``); docs/metrics.md is
the operator's table.

Each name is the Prometheus exposition name (counters end in ``_total``, as ``prometheus_client``
writes vLLM's counters) and maps one to one onto vLLM's (``vllm/v1/spec_decode/metrics.py`` @
016a8587 for ``spec_decode_*``; ``vllm/v1/metrics/loggers.py`` @ a6f0308c for the others, where
``vllm:time_per_output_token_seconds`` is deprecated for ``vllm:inter_token_latency_seconds``):

========================================================  =========  ===========================================
specpipe                                                  kind       vLLM
========================================================  =========  ===========================================
``specpipe:spec_decode_num_drafts_total``                 counter    ``vllm:spec_decode_num_drafts_total``
``specpipe:spec_decode_num_draft_tokens_total``           counter    ``vllm:spec_decode_num_draft_tokens_total``
``specpipe:spec_decode_num_accepted_tokens_total``        counter    ``vllm:spec_decode_num_accepted_tokens_total``
``specpipe:spec_decode_num_accepted_tokens_per_pos_total``  counter  ``vllm:spec_decode_num_accepted_tokens_per_pos_total``
``specpipe:generation_tokens_total``                      counter    ``vllm:generation_tokens_total``
``specpipe:prompt_tokens_total``                          counter    ``vllm:prompt_tokens_total``
``specpipe:num_requests_running``                         gauge      ``vllm:num_requests_running``
``specpipe:num_requests_waiting``                         gauge      ``vllm:num_requests_waiting``
``specpipe:time_to_first_token_seconds``                  histogram  ``vllm:time_to_first_token_seconds``
``specpipe:inter_token_latency_seconds``                  histogram  ``vllm:inter_token_latency_seconds``
========================================================  =========  ===========================================

Labels: ``model_name`` (the deployment's name, as vLLM's ``model_name``; vLLM's ``engine`` index has no
counterpart: one engine per model), and ``position`` (0-based draft position) on the per-position
counter. Semantics, as vLLM's: a *draft* is one request-step that verified >= 1 draft token (a tree's
nodes count as its draft tokens); a step that accepted ``a`` drafts adds 1 at positions ``0 .. a-1``,
so the per-position counts sum to the accepted total and never exceed the drafts; accepted <= drafted.
A step that the request's end id, stop word or ``max_tokens`` ends inside counts only the drafts before
the token that ended it (that token is the step's own), so a request's generated tokens equal its target
forwards plus its accepted drafts (:class:`~specpipe.generation.api.RequestStats`).
TTFT runs from the request's arrival at the model to its first engine step's output (prefill done, in
seconds); inter-token latency is one observation per later step of the request (seconds between its
outputs; a step may commit several tokens), so TTFT's count is the requests that got a first step and
ITL's count their steps after the first. Every counter and histogram counts since the model was loaded
(a restart resets them; Prometheus' ``rate``/``increase`` handle the reset).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from specpipe.generation.api import RequestStats

NUM_DRAFTS = "specpipe:spec_decode_num_drafts_total"
NUM_DRAFT_TOKENS = "specpipe:spec_decode_num_draft_tokens_total"
NUM_ACCEPTED_TOKENS = "specpipe:spec_decode_num_accepted_tokens_total"
NUM_ACCEPTED_PER_POS = "specpipe:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "specpipe:generation_tokens_total"
PROMPT_TOKENS = "specpipe:prompt_tokens_total"
REQUESTS_RUNNING = "specpipe:num_requests_running"
REQUESTS_WAITING = "specpipe:num_requests_waiting"
TIME_TO_FIRST_TOKEN = "specpipe:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "specpipe:inter_token_latency_seconds"

#: specpipe name -> vLLM's exposition name (module doc).
VLLM_NAMES = {
    name: "vllm:" + name.removeprefix("specpipe:")
    for name in (
        NUM_DRAFTS,
        NUM_DRAFT_TOKENS,
        NUM_ACCEPTED_TOKENS,
        NUM_ACCEPTED_PER_POS,
        GENERATION_TOKENS,
        PROMPT_TOKENS,
        REQUESTS_RUNNING,
        REQUESTS_WAITING,
        TIME_TO_FIRST_TOKEN,
        INTER_TOKEN_LATENCY,
    )
}

#: Upper bounds of the histograms' buckets, seconds: vLLM's (loggers.py @ a6f0308c), so that quantiles compare.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

#: The label every ``specpipe:`` series carries: the deployment's name.
MODEL_LABEL = "model_name"


def histogram_series(name: str) -> tuple[str, str, str]:
    """The three series Prometheus exposes for histogram ``name``: ``_bucket`` (label ``le``), ``_sum``, ``_count``."""
    return f"{name}_bucket", f"{name}_sum", f"{name}_count"


def decoding_steps(output_tokens: int, accepted_draft_tokens: int, target_forwards: int | None) -> tuple[int, int]:
    """``(tokens after the first, target decoding forwards)`` of one request, for its mean accepted length.

    With the deployment's ``target_forwards`` F and accepted drafts A: ``(F - 1 + A, F - 1)``, exact (each
    forward yields one token of its own plus the drafts it accepted; the end id or stop word that ended the
    request, generated but not sent, included). Without F (TensorRT-LLM, vLLM), estimated from the N
    output tokens sent as ``(N - 1, N - 1 - A)``: one step too few for a request that an end id or a stop
    word ended inside a step. The prefill's forward and token are left out in both.
    """
    if target_forwards is not None:
        return target_forwards - 1 + accepted_draft_tokens, target_forwards - 1
    return output_tokens - 1, output_tokens - 1 - accepted_draft_tokens


@dataclass(frozen=True)
class StepObservation:
    """What one engine step of one request adds to the metrics.

    Attributes:
        draft_tokens: draft tokens the step verified (0: plain decoding).
        accepted: of them, accepted into the output (<= ``draft_tokens``).
        output_tokens: tokens the step released to the client (stop-word hold-back respected).
        ttft_s: seconds from arrival to this step, for the request's first step; else ``None``.
        itl_s: seconds since the request's previous step, for every later step; else ``None``.
    """

    draft_tokens: int
    accepted: int
    output_tokens: int
    ttft_s: float | None
    itl_s: float | None

    @property
    def drafted(self) -> bool:
        """Whether the step counts as a draft (verified >= 1 draft token)."""
        return self.draft_tokens > 0

    @property
    def accepted_positions(self) -> range:
        """0-based draft positions accepted in this step (a chain or a tree path accepts a prefix)."""
        return range(self.accepted)


class RequestProgress:
    """Turns one request's cumulative :class:`RequestStats`, one per engine step, into
    :class:`StepObservation` deltas.

    Args:
        arrived_s: when the request arrived, on ``clock``'s scale.
        clock: seconds, monotonic (default :func:`time.monotonic`).
    """

    def __init__(self, arrived_s: float, clock: Callable[[], float] = time.monotonic):
        self._clock, self._last_s = clock, arrived_s
        self._first = True
        self._seen = RequestStats()

    def step(self, stats: RequestStats) -> StepObservation:
        """The step whose cumulative counters are ``stats``, observed now.

        Raises:
            ValueError: a counter went down (``stats`` of another request, or out of order).
        """
        now, seen = self._clock(), self._seen
        drafts = stats.total_draft_tokens - seen.total_draft_tokens
        accepted = stats.total_accepted_draft_tokens - seen.total_accepted_draft_tokens
        output = stats.num_output_tokens - seen.num_output_tokens
        if min(drafts, accepted, output) < 0 or accepted > drafts:
            raise ValueError(f"request counters out of order: {seen} then {stats}")
        elapsed, first = now - self._last_s, self._first
        self._seen, self._last_s, self._first = stats, now, False
        return StepObservation(drafts, accepted, output, elapsed if first else None, None if first else elapsed)
