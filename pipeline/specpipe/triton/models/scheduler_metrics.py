"""Prometheus metrics of the CPU ``tensorrt_llm`` model, exported through Triton's custom metrics
(``pb_utils.MetricFamily``, Triton's Python backend 23.03+) on Triton's metrics port.

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


class SchedulerMetrics:
    """The batch scheduler's Triton custom metrics (module doc); a no-op outside a Triton server."""

    def __init__(self):
        self._families = None
        try:
            family = pb_utils().MetricFamily
        except Exception:  # noqa: BLE001 - no Triton (tests) or a backend without custom metrics
            return
        # Triton deletes a family's metrics with the family object: keep every family referenced.
        self._families = {
            name: family(name=name, description=doc, kind=family.GAUGE) for name, doc in (
                ("specpipe_batch_size", "requests in the latest batch step"),
                ("specpipe_waiting_requests", "requests waiting for a batch slot"),
                ("specpipe_draft_length", "draft lengths chosen by the load-adaptive rule in the latest step"),
            )
        }
        for name, doc in (("specpipe_decode_steps_total", "request decoding steps by chosen draft length"),
                          ("specpipe_request_errors_total", "requests ended by an error response, by reason")):
            self._families[name] = family(name=name, description=doc, kind=family.COUNTER)
        self._batch = self._families["specpipe_batch_size"].Metric(labels={})
        self._waiting = self._families["specpipe_waiting_requests"].Metric(labels={})
        lengths = self._families["specpipe_draft_length"]
        self._mean, self._max = lengths.Metric(labels={"stat": "mean"}), lengths.Metric(labels={"stat": "max"})
        self._steps: dict[int, object] = {}
        errors = self._families["specpipe_request_errors_total"]
        self._errors = {reason: errors.Metric(labels={"reason": reason}) for reason in ERROR_REASONS}

    def update(self, scheduler) -> None:
        """Record a finished batch step of ``scheduler`` (a
        :class:`~specpipe.runtime.cpu.scheduler.BatchScheduler`)."""
        if self._families is None:
            return
        lengths = scheduler.last_draft_lengths
        self._batch.set(float(len(scheduler.active)))
        self._waiting.set(float(scheduler.waiting))
        self._mean.set(sum(lengths) / len(lengths) if lengths else 0.0)
        self._max.set(float(max(lengths, default=0)))
        for k in lengths:
            if k not in self._steps:
                self._steps[k] = self._families["specpipe_decode_steps_total"].Metric(labels={"draft_length": str(k)})
            self._steps[k].increment(1.0)

    def request_failed(self, reason: str) -> None:
        """Count one request ended by an error response (``reason``: one of :data:`ERROR_REASONS`)."""
        if self._families is not None:
            self._errors[reason].increment(1.0)
