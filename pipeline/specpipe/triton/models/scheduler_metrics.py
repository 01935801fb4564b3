"""Prometheus metrics of the CPU ``tensorrt_llm`` model, exported through Triton's custom metrics
(``pb_utils.MetricFamily``, Triton's Python backend 23.03+; ``HISTOGRAM`` with ``buckets``, as the
python_backend of Triton 2.51 has it: ``src/metric_family.cc`` @ c48fd379, and the pytriton 0.7.0 stub)
on Triton's metrics port.

Speculative decoding, tokens, queue and latency, named and labelled as vLLM's (label ``model_name``;
the table, semantics and reset behaviour: :mod:`specpipe.generation.spec_metrics`, docs/metrics.md):
``specpipe:spec_decode_num_drafts_total``, ``specpipe:spec_decode_num_draft_tokens_total``,
``specpipe:spec_decode_num_accepted_tokens_total``, ``specpipe:spec_decode_num_accepted_tokens_per_pos_total``
(label ``position``), ``specpipe:generation_tokens_total``, ``specpipe:prompt_tokens_total``,
``specpipe:num_requests_running``, ``specpipe:num_requests_waiting`` and the histograms
``specpipe:time_to_first_token_seconds`` and ``specpipe:inter_token_latency_seconds``. Requests with
external drafts (``tensorrt_llm_bls``'s draft-target verification) are not in them.

specpipe's own series (no vLLM counterpart):

Gauges, updated after each batch step: ``specpipe_batch_size`` (requests in the latest step),
``specpipe_waiting_requests`` and ``specpipe_draft_length`` (label ``stat``: ``mean`` / ``max`` of the
draft lengths the load-adaptive rule chose in the latest step). Counters: ``specpipe_decode_steps_total``
(label ``draft_length``: request-steps decoded with each draft length) and
``specpipe_request_errors_total`` (label ``reason``, :func:`error_reason`: requests of this model that
ended with an error response; those the ``preprocessing`` model rejects, such as ``max_tokens`` < 1,
never reach it, and a client's cancellation is not an error).

Triton's own per-model counters cannot tell these errors apart: a decoupled Python model's request
counts as a success of ``tensorrt_llm`` once ``execute`` has returned, whatever response it later
sends, and (measured on Triton 2.51) as two failures of the ``ensemble`` that carried it, whatever the
cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from specpipe.generation import spec_metrics as names
from specpipe.generation.api import StepOutput
from specpipe.generation.spec_metrics import RequestProgress, histogram_series
from specpipe.triton.models.common import pb_utils
from specpipe.triton.models.draining import ENDED_BY_STOP, SERVER_STOPPING

#: ``reason`` label of ``specpipe_request_errors_total``: what each error response means.
ERROR_REASONS = ("invalid_request", "server_busy", "refused_while_stopping", "ended_by_stop", "engine_failed")


def error_reason(message: str, code: str) -> str:
    """The ``reason`` label of an error response.

    Args:
        message: the error message sent to the client.
        code: its Triton status (``INVALID_ARG``, ``UNAVAILABLE``, ``INTERNAL``).

    Returns:
        one of :data:`ERROR_REASONS`: ``UNAVAILABLE`` is ``server_busy``, or, with a message starting
        "server stopping", ``ended_by_stop`` (:data:`~.draining.ENDED_BY_STOP`) or
        ``refused_while_stopping``; ``INTERNAL`` is ``engine_failed``; anything else ``invalid_request``.
    """
    if code == "UNAVAILABLE":
        if not message.startswith(SERVER_STOPPING):
            return "server_busy"
        return "ended_by_stop" if message == ENDED_BY_STOP else "refused_while_stopping"
    return "engine_failed" if code == "INTERNAL" else "invalid_request"


#: Every family the model exports: ``(name, kind, description)``; kind is ``GAUGE``, ``COUNTER`` or ``HISTOGRAM``.
FAMILIES = (
    ("specpipe_batch_size", "GAUGE", "requests in the latest batch step"),
    ("specpipe_waiting_requests", "GAUGE", "requests waiting for a batch slot"),
    ("specpipe_draft_length", "GAUGE", "draft lengths chosen by the load-adaptive rule in the latest step"),
    ("specpipe_decode_steps_total", "COUNTER", "request decoding steps by chosen draft length"),
    ("specpipe_request_errors_total", "COUNTER", "requests ended by an error response, by reason"),
    (names.NUM_DRAFTS, "COUNTER", "request steps that verified at least one draft token"),
    (names.NUM_DRAFT_TOKENS, "COUNTER", "draft tokens verified"),
    (names.NUM_ACCEPTED_TOKENS, "COUNTER", "draft tokens accepted into the output"),
    (names.NUM_ACCEPTED_PER_POS, "COUNTER", "draft tokens accepted, by 0-based draft position"),
    (names.GENERATION_TOKENS, "COUNTER", "output tokens sent"),
    (names.PROMPT_TOKENS, "COUNTER", "prompt tokens of the requests that got a first step"),
    (names.REQUESTS_RUNNING, "GAUGE", "requests in the batch after the latest step"),
    (names.REQUESTS_WAITING, "GAUGE", "requests waiting for a batch slot"),
    (names.TIME_TO_FIRST_TOKEN, "HISTOGRAM", "seconds from a request's arrival to its first step's output"),
    (names.INTER_TOKEN_LATENCY, "HISTOGRAM", "seconds between a request's successive step outputs"),
)
_BUCKETS = {names.TIME_TO_FIRST_TOKEN: names.TTFT_BUCKETS, names.INTER_TOKEN_LATENCY: names.ITL_BUCKETS}


def exported_series() -> frozenset[str]:
    """Every series name the model exposes (a histogram's ``_bucket``, ``_sum`` and ``_count``)."""
    series = set()
    for name, kind, _ in FAMILIES:
        series.update(histogram_series(name) if kind == "HISTOGRAM" else (name,))
    return frozenset(series)


class SchedulerMetrics:
    """The batch scheduler's Triton custom metrics (module doc); a no-op outside a Triton server.

    Args:
        model_name: the ``model_name`` label of the ``specpipe:`` series (the deployment's name).
    """

    def __init__(self, model_name: str = "tensorrt_llm"):
        self._families = None
        try:
            family = pb_utils().MetricFamily
        except Exception:  # noqa: BLE001 - no Triton (tests) or a backend without custom metrics
            return
        # Triton deletes a family's metrics with the family object: keep every family referenced.
        self._families = {
            name: family(name=name, description=doc, kind=getattr(family, kind)) for name, kind, doc in FAMILIES
        }
        self._model = {names.MODEL_LABEL: model_name}
        self._batch = self._families["specpipe_batch_size"].Metric(labels={})
        self._waiting = self._families["specpipe_waiting_requests"].Metric(labels={})
        lengths = self._families["specpipe_draft_length"]
        self._mean, self._max = lengths.Metric(labels={"stat": "mean"}), lengths.Metric(labels={"stat": "max"})
        self._steps: dict[int, object] = {}
        self._positions: dict[int, object] = {}
        errors = self._families["specpipe_request_errors_total"]
        self._errors = {reason: errors.Metric(labels={"reason": reason}) for reason in ERROR_REASONS}
        self._own = {
            name: self._families[name].Metric(labels=dict(self._model), buckets=list(_BUCKETS[name]))
            if name in _BUCKETS
            else self._families[name].Metric(labels=dict(self._model))
            for name, _, _ in FAMILIES
            if name.startswith("specpipe:") and name != names.NUM_ACCEPTED_PER_POS
        }

    def update(self, scheduler) -> None:
        """Record a finished batch step of ``scheduler`` (a
        :class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler`)."""
        if self._families is None:
            return
        lengths = scheduler.last_draft_lengths
        self._batch.set(float(len(scheduler.active)))
        self._waiting.set(float(scheduler.waiting))
        self._own[names.REQUESTS_RUNNING].set(float(len(scheduler.active)))
        self._own[names.REQUESTS_WAITING].set(float(scheduler.waiting))
        self._mean.set(sum(lengths) / len(lengths) if lengths else 0.0)
        self._max.set(float(max(lengths, default=0)))
        for k in lengths:
            if k not in self._steps:
                self._steps[k] = self._families["specpipe_decode_steps_total"].Metric(labels={"draft_length": str(k)})
            self._steps[k].increment(1.0)

    def track(self, arrived_s: float, clock: Callable[[], float] = time.monotonic) -> Callable[[StepOutput], None]:
        """A callback that records each :class:`StepOutput` of one request that arrived at ``arrived_s``
        (``clock``'s seconds): speculative counters, tokens, TTFT and inter-token latency."""
        progress = RequestProgress(arrived_s, clock)

        def observe(output: StepOutput) -> None:
            step = progress.step(output.stats)
            if self._families is None:
                return
            own = self._own
            if step.ttft_s is not None:
                own[names.TIME_TO_FIRST_TOKEN].observe(step.ttft_s)
                own[names.PROMPT_TOKENS].increment(float(output.stats.num_input_tokens))
            else:
                own[names.INTER_TOKEN_LATENCY].observe(step.itl_s)
            own[names.GENERATION_TOKENS].increment(float(step.output_tokens))
            if step.drafted:
                own[names.NUM_DRAFTS].increment(1.0)
                own[names.NUM_DRAFT_TOKENS].increment(float(step.draft_tokens))
                own[names.NUM_ACCEPTED_TOKENS].increment(float(step.accepted))
            for position in step.accepted_positions:
                self._position(position).increment(1.0)

        return observe

    def _position(self, position: int):
        if position not in self._positions:
            labels = {**self._model, "position": str(position)}
            self._positions[position] = self._families[names.NUM_ACCEPTED_PER_POS].Metric(labels=labels)
        return self._positions[position]

    def request_failed(self, reason: str) -> None:
        """Count one request ended by an error response (``reason``: one of :data:`ERROR_REASONS`)."""
        if self._families is not None:
            self._errors[reason].increment(1.0)
