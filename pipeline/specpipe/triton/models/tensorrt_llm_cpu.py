"""``tensorrt_llm`` Triton model of the CPU runtime: a decoupled (streaming) model running the CPU
speculative engine behind TensorRT-LLM's tensor interface.

``execute`` only validates each request (:func:`~specpipe.triton.models.engine_request.parse_request`)
and queues it; one worker thread (:class:`RequestWorker`) runs the queued requests one after the other,
in arrival order, so Triton is never blocked and requests are served first come, first served. Per
request the worker sends one response per engine step when ``streaming`` is true, else one response
at the end; the last response always carries the final flag
(:func:`~specpipe.triton.models.generation.run_request` lists the tensors).

Bad requests (empty prompt, ``max_tokens`` < 1, negative ``top_k``, ``top_p`` outside (0, 1], a
prompt longer than the context ...) get one final response holding a ``TritonError``
(``INVALID_ARG``); an engine failure gets ``INTERNAL``. The model keeps serving either way.

A request carrying ``draft_input_ids`` (draft-target through ``tensorrt_llm_bls``) is not generated
but verified: one target forward over prompt + drafts commits the accepted drafts + 1 target token
(:class:`~specpipe.runtime.cpu.external_drafts.DraftVerifier`), as TensorRT-LLM's
``draft_tokens_external`` mode does without draft logits.

Model parameters: ``gpt_model_path`` (absolute engine directory, TensorRT-LLM's name for it),
``exclude_input_in_output`` (default for requests that do not set it; default false).
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from specpipe.triton.models.common import error_response, input_array, model_parameters, parse_bool, pb_utils, response
from specpipe.triton.models.engine_request import EngineRequest, parse_request
from specpipe.triton.models.generation import Cancelled, run_request
from specpipe.triton.models.warmup import warm_up_engine


class TritonSender:
    """Adapter from a Triton ``InferenceResponseSender`` to what :class:`RequestWorker` needs."""

    def __init__(self, sender):
        self._sender = sender

    def data(self, outputs, final: bool) -> None:
        """Send a response with ``outputs`` (name -> numpy array), with the final flag if ``final``."""
        pb = pb_utils()
        self._sender.send(response(outputs), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def error(self, message: str, code: str = "INVALID_ARG") -> None:
        """Send a final response holding a ``TritonError``."""
        self._sender.send(error_response(message, code), flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finish(self) -> None:
        """Send the final flag alone (after a cancellation)."""
        self._sender.send(flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def cancelled(self) -> bool:
        """Whether the client cancelled the request."""
        is_cancelled = getattr(self._sender, "is_cancelled", None)
        return bool(is_cancelled()) if is_cancelled else False


class RequestWorker:
    """Serves queued requests on one thread, in arrival order.

    Args:
        engine: object with ``generate(input_ids, params) -> Iterator[StepOutput]``; or ``None`` with
            ``load``.
        log_error: called with a message when a request fails inside the engine.
        load: builds the engine on the worker thread itself (the constructor waits for it and raises
            what it raised). The CPU engine is loaded this way because its prepacked oneDNN layers run
            about 1.5x slower on a thread other than the first one that used oneDNN (measured with
            SmolLM2 on 2 cores: 47 tokens/s on the loading thread, 32 on another).
    """

    def __init__(self, engine=None, log_error=lambda message: None, *, load: Callable[[], object] | None = None):
        if (engine is None) == (load is None):
            raise ValueError("give exactly one of engine and load")
        self.engine = engine
        self.log_error = log_error
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

    def _loop(self, load, loaded: threading.Event) -> None:
        if load is not None:
            try:
                self.engine = load()
            except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which raises it
                self._load_error = exc
                return
            finally:
                loaded.set()
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.serve(*job)

    def serve(self, request: EngineRequest, sender) -> None:
        """Run one request to completion, sending its responses; never raises."""
        try:
            engine = self.engine
            if request.draft_input_ids is not None:
                from specpipe.runtime.cpu.external_drafts import DraftVerifier

                engine = DraftVerifier(self.engine, list(request.draft_input_ids))
            run_request(engine, request, sender.data, sender.cancelled)
        except Cancelled:
            self._quietly(sender.finish)
        except ValueError as exc:
            self._quietly(sender.error, str(exc), "INVALID_ARG")
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            self.log_error(f"request failed in the CPU engine: {exc}\n{traceback.format_exc()}")
            self._quietly(sender.error, f"the CPU engine failed on this request: {type(exc).__name__}: {exc}", "INTERNAL")

    def _quietly(self, send, *args) -> None:
        try:
            send(*args)
        except Exception as exc:  # noqa: BLE001 - e.g. the client has gone away
            self.log_error(f"could not send the final response: {exc}")


class TritonPythonModel:
    """Triton entry point (loaded through the repository's ``tensorrt_llm/1/model.py``)."""

    def initialize(self, args):
        from specpipe.runtime.cpu.loader import load_engine

        params = model_parameters(args)
        engine_dir = params.get("gpt_model_path", "")
        if not engine_dir:
            raise ValueError("parameter 'gpt_model_path' (the engine directory) is missing: regenerate with 'specpipe package'")
        self.exclude_input_default = parse_bool(params.get("exclude_input_in_output"), False)
        logger = pb_utils().Logger

        def load():
            engine, self.manifest = load_engine(Path(engine_dir))
            warm_up_engine(engine, logger.log_info)  # on the engine thread, before the model reports ready
            return engine

        self.worker = RequestWorker(load=load, log_error=logger.log_error)
        logger.log_info(f"specpipe CPU engine '{self.manifest.name}' loaded from {engine_dir}")

    def execute(self, requests):
        for request in requests:
            sender = TritonSender(request.get_response_sender())
            try:
                parsed = parse_request(lambda name: input_array(request, name), exclude_input_default=self.exclude_input_default)
            except ValueError as exc:
                sender.error(str(exc))
                continue
            self.worker.submit(parsed, sender)
        return None

    def finalize(self):
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.close()
