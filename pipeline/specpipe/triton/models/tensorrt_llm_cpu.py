"""``tensorrt_llm`` Triton model of the CPU runtime: a decoupled (streaming) model running the CPU
speculative engine behind TensorRT-LLM's tensor interface.

``execute`` only validates each request (:func:`~specpipe.triton.models.engine_request.parse_request`)
and queues it; one worker thread (:class:`RequestWorker`), the thread that loaded the engine, runs the
batch scheduler (:mod:`specpipe.runtime.cpu.scheduler.scheduler`): requests join and leave the running batch at
every step, up to the engine's ``max_batch_size`` (manifest ``limits``; default
:data:`DEFAULT_MAX_BATCH_SIZE`), with a bounded queue behind it. Per request the worker sends one
response per engine step when ``streaming`` is true, else one response at the end; the last response
always carries the final flag (:func:`~specpipe.triton.models.generation.run_request` lists the tensors).
A client that cancels its gRPC stream is seen through ``response_sender.is_cancelled()`` (Triton
Python backend, 23.10+; the pytriton 0.7.0 server is 2.51) and its request leaves the batch at the next
step. A client of the ensemble, which Triton does not cancel in flight, sends TensorRT-LLM's stop
request instead (input ``stop`` true, the same request id; :mod:`.stop_requests`), with the same effect.
A request sent without an id gets one here (:data:`ANONYMOUS_ID`), returned in every response as
``engine_request_id``, so that ``postprocessing`` can stop it when its client went away.

Custom metrics on Triton's metrics port (speculative counters named as vLLM's, TTFT and inter-token
latency, batch size, waiting requests, chosen draft lengths, errors by reason): :mod:`.scheduler_metrics`.

Bad requests (empty prompt, ``max_tokens`` < 1, negative ``top_k``, ``top_p`` outside (0, 1], a
prompt longer than the context ...) get one final response holding a ``TritonError``
(``INVALID_ARG``); an engine failure gets ``INTERNAL``. The model keeps serving either way.

A request carrying ``draft_input_ids`` (draft-target through ``tensorrt_llm_bls``) is not generated
but verified: one target forward over prompt + drafts commits the accepted drafts + 1 target token
(:class:`~specpipe.runtime.cpu.external_drafts.DraftVerifier`), as TensorRT-LLM's
``draft_tokens_external`` mode does without draft logits.

Model parameters: ``gpt_model_path`` (absolute engine directory, TensorRT-LLM's name for it),
``exclude_input_in_output`` (default for requests that do not set it; default false), ``dense_rows``
(``auto``, the default: the packed kernels only where they are MKL's packed GEMM, else measure at
load whether dense weight copies beat them for few rows, :mod:`specpipe.runtime.cpu.dense_rows`; a row
count; ``all``: dense copies only; ``0``: packed kernels only; both of the last two keep one copy of
the weights).
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specpipe.triton.models.common import ENGINE_FAILED, error_response, input_array, model_parameters, parse_bool, pb_utils, response
from specpipe.triton.models.draining import ENDED_BY_STOP, REFUSED_WHILE_STOPPING, DrainSignal
from specpipe.triton.models.engine_request import EngineRequest, parse_request
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler, ServerBusy
from specpipe.runtime.cpu.scheduler.scheduler import Cancelled as SchedulerCancelled
from specpipe.triton.models.generation import Cancelled, StepResponder, run_request
from specpipe.triton.models.scheduler_metrics import SchedulerMetrics, error_reason
from specpipe.triton.models.stop_requests import StopRequests, is_stop_request
from specpipe.triton.models.warmup import warm_up_deployment


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

    def __init__(self, sender, request_id: str = "", stops: StopRequests | None = None,
                 on_error: Callable[[str], None] = lambda reason: None):
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

    def __init__(self, engine=None, log_error=lambda message: None, *, load: Callable[[], object] | None = None,
                 on_step: Callable[[BatchScheduler], None] | None = None, drain: DrainSignal | None = None,
                 track: Callable[[float], Callable] | None = None):
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


#: Seconds ``finalize`` waits for the engine thread to end its requests.
FINALIZE_WAIT_S = 5.0
#: Requests decoded together when the manifest has no ``limits.max_batch_size``.
DEFAULT_MAX_BATCH_SIZE = 8


class TritonPythonModel:
    """Triton entry point (loaded through the repository's ``tensorrt_llm/1/model.py``)."""

    anonymous = itertools.count(1)  # numbers of the ids given to requests sent without one

    def initialize(self, args):
        from specpipe.runtime.cpu.dense_rows import apply_dense_rows, dense_copies_wanted, parse_dense_rows
        from specpipe.runtime.cpu.loader import load_engine

        params = model_parameters(args)
        engine_dir = params.get("gpt_model_path", "")
        if not engine_dir:
            raise ValueError("parameter 'gpt_model_path' (the engine directory) is missing: regenerate with 'specpipe package'")
        self.exclude_input_default = parse_bool(params.get("exclude_input_in_output"), False)
        logger = pb_utils().Logger

        dense_rows = parse_dense_rows(params.get("dense_rows"))  # a bad value fails before the weights load

        def load():
            engine, self.manifest = load_engine(Path(engine_dir), dense_copy=dense_copies_wanted(dense_rows))
            warm_up_deployment(engine, logger.log_info)  # on the engine thread, before the model reports ready
            logger.log_info(f"specpipe: linear kernels for few rows: {apply_dense_rows(engine, dense_rows)}")
            limits = self.manifest.limits or {}
            batch = int(limits.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
            scheduler = BatchScheduler(engine, max_batch_size=batch, max_queue=int(params.get("max_queue_size") or 4 * batch))
            logger.log_info(f"specpipe: batch scheduler for {batch} requests; target forward cost measured at load: "
                            f"{scheduler.cost_model.describe()}")
            return scheduler

        self.stops = StopRequests()
        self.worker = RequestWorker(load=load, log_error=logger.log_error, drain=DrainSignal.from_environment())
        self.metrics = SchedulerMetrics(self.manifest.name)  # labelled with the deployment: after the load
        self.worker.on_step, self.worker.track = self.metrics.update, self.metrics.track
        logger.log_info(f"specpipe CPU engine '{self.manifest.name}' loaded from {engine_dir}")

    def execute(self, requests):
        for request in requests:
            sender = TritonSender(request.get_response_sender(), request.request_id(), self.stops, self.metrics.request_failed)
            get = functools.partial(input_array, request)
            try:
                if is_stop_request(get):
                    self.stops.stop(sender.request_id)
                    sender.acknowledge()
                    continue
                parsed = parse_request(get, exclude_input_default=self.exclude_input_default)
                sender.request_id = sender.request_id or f"{ANONYMOUS_ID}{next(self.anonymous)}"
            except ValueError as exc:
                sender.error(str(exc))
                continue
            sender.started()
            self.worker.submit(parsed, sender)
        return None

    def finalize(self):
        worker = getattr(self, "worker", None)
        if worker is not None:
            # Triton unloads a model with requests still running only when it stops without a drain
            # (e.g. signalled because serve died): they can no longer be answered, do not wait for them.
            worker.end_all()
            worker.close(FINALIZE_WAIT_S)
