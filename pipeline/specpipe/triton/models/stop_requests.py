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
request when it arrives; a stop that arrives just after its request ended is dropped, so a later
request reusing the id runs.
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

    A stop naming a running request cancels it. A stop naming a request that ended less than
    ``pending_s`` seconds ago is late and ignored, so a client reusing the id is not cancelled. A stop
    naming an id not seen in that time is kept for ``pending_s`` seconds, for a request that has not
    reached the engine yet.

    Args:
        pending_s: how long stops and ended ids are remembered, seconds (:data:`PENDING_STOP_S`).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, pending_s: float = PENDING_STOP_S, clock: Callable[[], float] = time.monotonic):
        self.pending_s, self._clock = pending_s, clock
        self._stopped: dict[str, float] = {}
        self._running: dict[str, int] = {}
        self._ended: dict[str, float] = {}
        self._lock = threading.Lock()

    def started(self, request_id: str) -> None:
        """A request with this id reached the engine (``""``: no id, ignored)."""
        if request_id:
            with self._lock:
                self._running[request_id] = self._running.get(request_id, 0) + 1
                self._ended.pop(request_id, None)

    def ended(self, request_id: str) -> None:
        """A request with this id sent its final response."""
        if not request_id:
            return
        with self._lock:
            count = self._running.get(request_id, 0) - 1
            if count > 0:
                self._running[request_id] = count
                return
            self._running.pop(request_id, None)
            self._stopped.pop(request_id, None)
            now = self._clock()
            self._forget_expired(now)
            self._ended.pop(request_id, None)  # re-inserted last: the table stays in time order
            self._ended[request_id] = now

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
            self._forget_expired(now)
            if request_id in self._running or request_id not in self._ended:
                self._stopped[request_id] = now

    def _forget_expired(self, now: float) -> None:
        """Drop stops older than ``pending_s`` but those of running requests, and ended ids older than
        ``pending_s`` (that table is in time order, oldest first; call with the lock held)."""
        for old in [rid for rid, at in self._stopped.items() if now - at > self.pending_s and rid not in self._running]:
            del self._stopped[old]
        while self._ended:
            oldest, at = next(iter(self._ended.items()))
            if now - at <= self.pending_s:
                break
            del self._ended[oldest]

    def is_stopped(self, request_id: str) -> bool:
        """Whether ``request_id`` is running and stopped, or was named by a stop in the last ``pending_s``
        seconds before it arrived."""
        if not request_id:
            return False
        with self._lock:
            at = self._stopped.get(request_id)
            running = request_id in self._running
        return at is not None and (running or self._clock() - at <= self.pending_s)
