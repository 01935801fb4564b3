"""TensorRT-LLM's stop requests, for the CPU ``tensorrt_llm`` model.

A client of the ``ensemble`` cannot cancel the running ``tensorrt_llm`` request by cancelling its
gRPC stream: Triton looks at an ensemble's cancellation only when it schedules the next step
(Triton's request-cancellation docs; server issue #6739), and the engine step runs until the end of
generation. TensorRT-LLM's backend answers this with a second request, sent to ``tensorrt_llm``
itself: the optional BOOL input ``stop`` set to true and the request id of the request to stop
(``handleStopRequest`` in ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc``,
TensorRT-LLM @ 2a9abd95). Triton gives an ensemble's step requests the ensemble request's id
(``EnsembleContext`` in Triton core's ``ensemble_scheduler.cc`` sets it), so the id the client chose
for its ensemble request names the engine request too.

As upstream, the stop request gets one empty final response at once, and a stop naming no running
request is not an error (the request may have finished). Unlike upstream, a stop that arrives before
its request (the ensemble still tokenizing) is kept for :data:`PENDING_STOP_S` seconds and cancels that
request when it arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from specpipe.triton.models.common import scalar

#: Seconds a stop request is remembered for a request id that is not running yet.
PENDING_STOP_S = 10.0


def is_stop_request(get: Callable[[str], np.ndarray | None]) -> bool:
    """Whether a ``tensorrt_llm`` request is a stop request (its ``stop`` input holds true).

    Args:
        get: returns the input tensor of that name as a numpy array, or ``None`` when absent.

    Raises:
        ValueError: ``stop`` holds more or fewer than one value.
    """
    return bool(scalar(get("stop"), "stop"))


class StopRequests:
    """Request ids named by stop requests, shared between Triton's ``execute`` thread and the engine
    thread (which asks :meth:`is_stopped` once a step for every running request).

    Args:
        pending_s: how long a stop is remembered, seconds (:data:`PENDING_STOP_S`).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, pending_s: float = PENDING_STOP_S, clock: Callable[[], float] = time.monotonic):
        self.pending_s, self._clock = pending_s, clock
        self._stopped: dict[str, float] = {}
        self._lock = threading.Lock()

    def stop(self, request_id: str) -> None:
        """Record a stop request for ``request_id``.

        Raises:
            ValueError: ``request_id`` is empty (a stop names its request by id).
        """
        if not request_id:
            raise ValueError("a stop request must carry the request id of the request to stop "
                             "(send it with the same request_id as that request)")
        now = self._clock()
        with self._lock:
            for old in [rid for rid, at in self._stopped.items() if now - at > self.pending_s]:
                del self._stopped[old]
            self._stopped[request_id] = now

    def is_stopped(self, request_id: str) -> bool:
        """Whether a stop request named ``request_id`` in the last ``pending_s`` seconds."""
        if not request_id:
            return False
        with self._lock:
            at = self._stopped.get(request_id)
        return at is not None and self._clock() - at <= self.pending_s

    def forget(self, request_id: str) -> None:
        """Drop ``request_id`` (its request has ended)."""
        with self._lock:
            self._stopped.pop(request_id, None)
