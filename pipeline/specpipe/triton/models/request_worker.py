"""The CPU runtime's Triton request worker: one thread that loads the deployment, runs the batch
scheduler and answers each request through its response sender (:class:`TritonSender`).

Requests join and leave the running batch at every step; a streamed request gets one response per
engine step, another one response at the end, the last always with the final flag. A request whose client
cancelled its gRPC stream (``response_sender.is_cancelled()``, Triton Python backend 23.10+) or that a
stop request named (:mod:`.stop_requests`) leaves the batch at the next step. A request carrying
``draft_input_ids`` is verified, not generated
(:class:`~specpipe.runtime.cpu.external_drafts.DraftVerifier`). Used by
:mod:`~specpipe.triton.models.tensorrt_llm_cpu`.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np

from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler, ServerBusy
from specpipe.runtime.cpu.scheduler.scheduler import Cancelled as SchedulerCancelled
from specpipe.triton.models.common import ENGINE_FAILED, error_response, pb_utils, response
from specpipe.triton.models.draining import ENDED_BY_STOP, REFUSED_WHILE_STOPPING, DrainSignal
from specpipe.triton.models.engine_request import EngineRequest
from specpipe.triton.models.generation import Cancelled, StepResponder, run_request
from specpipe.triton.models.scheduler_metrics import error_reason
from specpipe.triton.models.stop_requests import StopRequests

#: Prefix of the ids given to requests sent without one (numbered from 1 in each model process).
ANONYMOUS_ID = "specpipe-anonymous-"
#: How often an idle worker looks for a drain request, seconds.
IDLE_POLL_S = 0.2
#: Seconds between a request's last data response and an error response ending it. Triton 2.51's
#: ensemble stops counting its steps once a step failed (``EnsembleContext::PrepareSteps`` in
#: triton-inference-server/core before the fix "always process completed steps ... even if the ensemble
#: has already failed"): a postprocessing step still running when the engine's error arrives is never
#: counted out, so the ensemble request is never released and a stopping server waits its whole exit
#: timeout for it. Measured with streams ended by a drain: 2 of 2 stops held without the pause, 0 of 3
#: with 0.3 s, 0 of 4 with 0.5 s.
ERROR_AFTER_DATA_S = 0.5


class TritonSender:
    """Adapter from a Triton ``InferenceResponseSender`` to what :class:`RequestWorker` needs.

    Args:
        sender: the request's response sender.
        request_id: the Triton request id (``""`` when the client sent none).
        stops: the model's stop requests; the request counts as cancelled once one names its id.
        on_error: called with the reason (:func:`~.scheduler_metrics.error_reason`) of each error sent.
    """

    def __init__(
        self,
        sender,
        request_id: str = "",
        stops: StopRequests | None = None,
        on_error: Callable[[str], None] = lambda reason: None,
    ):
        self._sender, self.request_id, self._stops, self._on_error = sender, request_id, stops, on_error
        self.arrived_s = time.monotonic()  # the request's arrival, for its time to first token
        self._started = False
        self._last_data_at: float | None = None

    def started(self) -> None:
        """The request goes to the engine: a stop request can now name it."""
        if self._stops is not None and not self._started:
            self._started = True
            self._stops.started(self.request_id)

    def data(self, outputs, final: bool) -> None:
        """Send a response with ``outputs`` (name -> numpy array), with the final flag if ``final``."""
        pb = pb_utils()
        if final:
            self._ended()
        outputs = {**outputs, "engine_request_id": np.array([[self.request_id.encode()]], dtype=np.object_)}
        self._sender.send(response(outputs), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        self._last_data_at = time.monotonic()

    def error(self, message: str, code: str = "INVALID_ARG") -> None:
        """Send a final response holding a ``TritonError`` (``code``: its Triton status name); after
        data responses, no sooner than :data:`ERROR_AFTER_DATA_S` after the last one."""
        self._ended()
        self._on_error(error_reason(message, code))
        if self._last_data_at is not None:
            time.sleep(max(0.0, self._last_data_at + ERROR_AFTER_DATA_S - time.monotonic()))
        self._sender.send(error_response(message, code), flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finish(self) -> None:
        """Send the final flag alone (after a cancellation)."""
        self._ended()
        self._sender.send(flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _ended(self) -> None:
        if self._stops is not None and self._started:
            self._started = False
            self._stops.ended(self.request_id)

    def acknowledge(self) -> None:
        """Send one empty final response (the answer to a stop request, as TensorRT-LLM's backend)."""
        self._sender.send(response({}), flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def cancelled(self) -> bool:
        """Whether the client cancelled the request, or a stop request named its id."""
        if self._stops is not None and self._stops.is_stopped(self.request_id):
            return True
        is_cancelled = getattr(self._sender, "is_cancelled", None)
        return bool(is_cancelled()) if is_cancelled else False


class RequestWorker:
    """Serves queued requests on one thread, in arrival order.

    Two modes, by what ``engine`` (or ``load()``) is:

    * a :class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler` (what the Triton model loads): in-flight
      batching; the worker thread runs the scheduler loop, each request streams its own responses
      (:class:`~specpipe.triton.models.generation.StepResponder`), a request whose client cancelled
      (``sender.cancelled()``, checked every step) leaves the batch at the next step, and a request past
      the queue bound gets ``UNAVAILABLE`` ("server busy") at once;
    * any object with ``generate(input_ids, params) -> Iterator[StepOutput]``: one request at a time.

    Args:
        engine: the scheduler or engine; or ``None`` with ``load``.
        log_error: called with a message when a request fails inside the engine.
        load: builds the engine on the worker thread itself (the constructor waits for it and raises
            what it raised). The CPU engine is loaded this way because its prepacked oneDNN layers run
            about 1.5x slower on a thread other than the first one that used oneDNN (measured with
            SmolLM2 on 2 cores: 47 tokens/s on the loading thread, 32 on another).
        on_step: called with the scheduler after each batch step (metrics).
        track: called with a scheduled request's arrival (``time.monotonic()`` seconds) when it starts;
            returns the callback that gets each of its :class:`~specpipe.generation.api.StepOutput` (metrics).
        drain: how ``serve`` asks the worker to drain before the server stops (:mod:`.draining`);
            none by default.
    """

    def __init__(
        self,
        engine=None,
        log_error=lambda message: None,
        *,
        load: Callable[[], object] | None = None,
        on_step: Callable[[BatchScheduler], None] | None = None,
        drain: DrainSignal | None = None,
        track: Callable[[float], Callable] | None = None,
    ):
        if (engine is None) == (load is None):
            raise ValueError("give exactly one of engine and load")
        self.engine = engine
        self.log_error = log_error
        self.on_step, self.track = on_step, track
        self.drain = drain if drain is not None else DrainSignal(None)
        self._ending = self._ending_all = False
        self._queue: queue.Queue = queue.Queue()
        self._load_error: BaseException | None = None
        loaded = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(load, loaded), name="specpipe-engine", daemon=True)
        self._thread.start()
        if load is not None:
            loaded.wait()
            if self._load_error is not None:
                raise self._load_error

    def submit(self, request: EngineRequest, sender) -> None:
        """Queue ``request``; its responses go to ``sender`` (a :class:`TritonSender`-like object)."""
        self._queue.put((request, sender))

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the queued requests, then stop the thread (waits at most ``timeout_s`` seconds)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def end_all(self) -> None:
        """End every request at the next step, as a drain past its deadline does (queued ones refused,
        running ones ended with "server stopping"): the model is being unloaded."""
        self._ending_all = True

    def _loop(self, load, loaded: threading.Event) -> None:
        if load is not None:
            try:
                self.engine = load()
            except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which raises it
                self._load_error = exc
                return
            finally:
                loaded.set()
        if isinstance(self.engine, BatchScheduler):
            self._batch_loop(self.engine)
            return
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.serve(*job)

    def _batch_loop(self, scheduler: BatchScheduler) -> None:
        """In-flight batching: hand queued requests to the scheduler, step it while it has work, and
        cancel the requests whose client has gone (checked once a step). While the server drains
        (:mod:`.draining`), new requests are refused and, past the drain's deadline, running ones ended."""
        running: list[tuple[object, object]] = []  # (scheduler request, sender)
        closing = False
        while not (closing and not scheduler.has_work):
            deadline = 0.0 if self._ending_all else self.drain.deadline()
            try:
                idle = not scheduler.has_work and not closing
                job = self._queue.get(block=idle, timeout=IDLE_POLL_S if idle and self.drain.drain_file else None)
            except queue.Empty:
                job = False
            while job is not False:
                if job is None:
                    closing = True
                elif deadline is not None:
                    self._quietly(job[1].error, REFUSED_WHILE_STOPPING, "UNAVAILABLE")
                else:
                    started = self._start(scheduler, *job)
                    if started is not None:
                        running.append(started)
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    job = False
            self._ending = deadline is not None and time.time() >= deadline
            for request, sender in running:
                if not request.done and (self._ending or self._safely(sender.cancelled)):
                    request.cancel()
            running = [(r, s) for r, s in running if not r.done]
            if scheduler.has_work:
                scheduler.step()
                if self.on_step is not None:
                    self._safely(self.on_step, scheduler)
            elif deadline is not None:
                self.drain.report_idle()

    def _start(self, scheduler: BatchScheduler, request: EngineRequest, sender):
        """Submit one request to the scheduler; requests with external drafts are verified at once."""
        if request.draft_input_ids is not None:
            from specpipe.runtime.cpu.external_drafts import DraftVerifier

            self._serve_with(DraftVerifier(scheduler.deployment, list(request.draft_input_ids)), request, sender)
            return None
        responder = StepResponder(request, lambda outputs, final: self._quietly(sender.data, outputs, final))
        emit = responder.step
        if self.track is not None:
            observe = self.track(getattr(sender, "arrived_s", time.monotonic()))

            def emit(step):
                self._safely(observe, step)
                responder.step(step)

        def fail(exc: BaseException) -> None:
            if isinstance(exc, SchedulerCancelled) and self._ending:
                self._quietly(sender.error, ENDED_BY_STOP, "UNAVAILABLE")
            elif isinstance(exc, SchedulerCancelled):
                self._quietly(sender.finish)
            else:
                self.log_error(f"request failed in the CPU engine: {exc}")
                self._quietly(sender.error, f"{ENGINE_FAILED}: {type(exc).__name__}: {exc}", "INTERNAL")

        try:
            return scheduler.submit(list(request.input_ids), request.params, emit, fail), sender
        except ServerBusy as exc:
            self._quietly(sender.error, str(exc), "UNAVAILABLE")
        except ValueError as exc:
            self._quietly(sender.error, str(exc), "INVALID_ARG")
        return None

    def _safely(self, call, *args):
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - metrics or a vanished client must not stop the loop
            self.log_error(f"{getattr(call, '__name__', call)} failed: {exc}")
            return None

    def serve(self, request: EngineRequest, sender) -> None:
        """Run one request to completion, sending its responses; never raises."""
        engine = self.engine
        if request.draft_input_ids is not None:
            from specpipe.runtime.cpu.external_drafts import DraftVerifier

            engine = DraftVerifier(self.engine, list(request.draft_input_ids))
        self._serve_with(engine, request, sender)

    def _serve_with(self, engine, request: EngineRequest, sender) -> None:
        try:
            run_request(engine, request, sender.data, sender.cancelled)
        except Cancelled:
            self._quietly(sender.finish)
        except ValueError as exc:
            self._quietly(sender.error, str(exc), "INVALID_ARG")
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            self.log_error(f"request failed in the CPU engine: {exc}\n{traceback.format_exc()}")
            self._quietly(sender.error, f"{ENGINE_FAILED}: {type(exc).__name__}: {exc}", "INTERNAL")

    def _quietly(self, send, *args) -> None:
        try:
            send(*args)
        except Exception as exc:  # noqa: BLE001 - e.g. the client has gone away
            self.log_error(f"could not send the final response: {exc}")
