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

A client that dies without sending its stop (SIGKILL, a dropped network) is covered on the server:
Triton then cancels the ensemble request, and although the running engine step never learns of it,
every postprocessing step the ensemble schedules for that request afterwards is created cancelled
(Triton core's ``EnsembleContext::ScheduleSteps`` propagates the cancellation to the next step, core
pull request #263) and carries the request id. ``postprocessing`` sees ``is_cancelled()`` there and
sends the stop request itself, once per id (:class:`AbandonedRequests`, :func:`send_stop_request`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from specpipe.triton.models.common import pb_utils, scalar

#: Seconds a stop request is remembered for a request id that is not running yet.
PENDING_STOP_S = 10.0
#: Seconds during which further cancelled steps of an abandoned request id send no new stop request
#: (the engine drops the request at its next step; a later request reusing the id gets its own stop).
ABANDONED_STOP_WINDOW_S = 5.0

logger = logging.getLogger(__name__)


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
            raise ValueError(
                "a stop request must carry the request id of the request to stop "
                "(send it with the same request_id as that request)"
            )
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


def stop_request_values() -> dict[str, np.ndarray]:
    """The input tensors of a stop request without the batch dimension (``[1]`` each), for clients and
    for :func:`send_stop_request`: the engine model's required inputs, empty (``input_ids``,
    ``input_lengths``, ``request_output_len``), and ``stop`` true."""
    zero = np.array([0], np.int32)
    return {"input_ids": zero, "input_lengths": zero, "request_output_len": zero, "stop": np.array([True])}


def send_stop_request(engine_model: str, request_id: str) -> None:
    """Send TensorRT-LLM's stop request for ``request_id`` to ``engine_model`` from inside a Python-backend
    model (a BLS call) and wait for its empty final response.

    Raises:
        RuntimeError: the engine model answered with an error.
    """
    pb = pb_utils()
    request = pb.InferenceRequest(
        model_name=engine_model,
        requested_output_names=[],
        request_id=request_id,
        inputs=[pb.Tensor(name, value[np.newaxis]) for name, value in stop_request_values().items()],
    )
    for reply in request.exec(decoupled=True):
        if reply.has_error():
            raise RuntimeError(f"{engine_model}: {reply.error().message()}")


class AbandonedRequests:
    """Stops the engine request of each abandoned ensemble request, once (``postprocessing``'s side;
    module doc).

    Each cancelled postprocessing step of an abandoned request (one per streamed response until the
    engine drops it) names the same id; a stop goes out for the first, and again only for one that comes
    ``window_s`` seconds or more after the last stop of that id (a later request reusing the id).

    Args:
        send: sends a stop request for a request id (:func:`send_stop_request` bound to the engine model);
            may raise.
        window_s: seconds (:data:`ABANDONED_STOP_WINDOW_S`).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        send: Callable[[str], None],
        window_s: float = ABANDONED_STOP_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._send, self.window_s, self._clock = send, window_s, clock
        self._stopped: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, request_id: str, cancelled: bool) -> bool:
        """Look at one postprocessing request: when it is cancelled and names a request id not stopped in
        the last ``window_s`` seconds, send that id's stop request.

        Returns:
            whether a stop request was sent now. A failed send is logged and tried again at the next
            cancelled request of that id; without an id there is nothing to stop.
        """
        if not cancelled or not request_id:
            return False
        now = self._clock()
        with self._lock:
            while self._stopped and now - next(iter(self._stopped.values())) >= self.window_s:
                self._stopped.popitem(last=False)  # oldest first: the table stays in time order
            if request_id in self._stopped:
                return False
            self._stopped[request_id] = now
        try:
            self._send(request_id)
        except Exception as exc:  # noqa: BLE001 - best effort: the request may have ended, the engine be gone
            logger.warning("could not stop abandoned request %s: %s", request_id, exc)
            with self._lock:
                self._stopped.pop(request_id, None)
            return False
        return True
