"""``tensorrt_llm`` Triton model of the CPU runtime: a decoupled (streaming) model running the CPU speculative
engine behind TensorRT-LLM's tensor interface.

``execute`` only validates each request (:func:`~specpipe.triton.models.engine_request.parse_request`) and
queues it; one worker thread (:class:`~specpipe.triton.models.request_worker.RequestWorker`), the thread that
loaded the engine, runs the batch scheduler (:mod:`specpipe.runtime.cpu.scheduler.scheduler`): requests join
and leave the running batch at every step, up to the engine's ``max_batch_size`` (manifest ``limits``; default
:data:`DEFAULT_MAX_BATCH_SIZE`), with a bounded queue behind it. Per request the worker sends one response per
engine step when ``streaming`` is true, else one response at the end; the last response always carries the
final flag (:func:`~specpipe.triton.models.generation.run_request` lists the tensors). A client that cancels
its gRPC stream is seen through ``response_sender.is_cancelled()`` (Triton Python backend, 23.10+; the
pytriton 0.7.0 server is 2.51) and its request leaves the batch at the next step. A client of the ensemble,
which Triton does not cancel in flight, sends TensorRT-LLM's stop request instead (input ``stop`` true, the
same request id; :mod:`.stop_requests`), with the same effect. A request sent without an id gets one here
(:data:`~specpipe.triton.models.request_worker.ANONYMOUS_ID`), returned in every response as
``engine_request_id``, so that ``postprocessing`` can stop it when its client went away.

Custom metrics on Triton's metrics port (speculative counters named as vLLM's, TTFT and inter-token latency,
batch size, waiting requests, chosen draft lengths, errors by reason): :mod:`.scheduler_metrics`.

Bad requests (empty prompt, ``max_tokens`` < 1, negative ``top_k``, ``top_p`` outside (0, 1], a prompt longer
than the context ...) get one final response holding a ``TritonError`` (``INVALID_ARG``); an engine failure
gets ``INTERNAL``. The model keeps serving either way.

A request carrying ``draft_input_ids`` (draft-target through ``tensorrt_llm_bls``) is not generated but
verified: one target forward over prompt + drafts commits the accepted drafts + 1 target token
(:class:`~specpipe.runtime.cpu.external_drafts.DraftVerifier`), as TensorRT-LLM's ``draft_tokens_external``
mode does without draft logits.

Model parameters: ``gpt_model_path`` (absolute engine directory, TensorRT-LLM's name for it),
``exclude_input_in_output`` (default for requests that do not set it; default false), ``dense_rows``
(``auto``, the default: the packed kernels only where they are MKL's packed GEMM, else measure at load whether
dense weight copies beat them for few rows, :mod:`specpipe.runtime.cpu.dense_rows`; a row count; ``all``:
dense copies only; ``0``: packed kernels only; both of the last two keep one copy of the weights),
``draft_lengths`` (``adaptive``, the default: the load-adaptive rule chooses each request's draft length every
step, on the forward cost measured at load; ``max``: every request drafts ``max_draft_len``, its whole tree,
every step, as TensorRT-LLM does, and nothing is measured), ``warm_up`` (default true: serve the warm-up
requests of :mod:`.warmup` before reporting ready; false: the first requests pay for the first shapes). The
last two with a fixed ``dense_rows`` make a model ready in seconds rather than minutes (tests, quick starts).
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.triton.models.common import input_array, model_parameters, parse_bool, parse_draft_lengths, pb_utils
from specpipe.triton.models.draining import DrainSignal
from specpipe.triton.models.engine_request import parse_request
from specpipe.triton.models.request_worker import ANONYMOUS_ID, RequestWorker, TritonSender
from specpipe.triton.models.scheduler_metrics import SchedulerMetrics
from specpipe.triton.models.stop_requests import StopRequests, is_stop_request
from specpipe.triton.models.warmup import warm_up_deployment

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
            raise ValueError(
                "parameter 'gpt_model_path' (the engine directory) is missing: regenerate with 'specpipe package'"
            )
        self.exclude_input_default = parse_bool(params.get("exclude_input_in_output"), False)
        logger = pb_utils().Logger

        # bad values fail before the weights load
        dense_rows = parse_dense_rows(params.get("dense_rows"))
        adaptive = parse_draft_lengths(params.get("draft_lengths")) == "adaptive"
        warm_up = parse_bool(params.get("warm_up"), True)

        def load():
            engine, self.manifest = load_engine(Path(engine_dir), dense_copy=dense_copies_wanted(dense_rows))
            if warm_up:  # on the engine thread, before the model reports ready
                warm_up_deployment(engine, logger.log_info)
            else:
                logger.log_info("specpipe: no warm-up (warm_up false): the first requests pay for their shapes")
            logger.log_info(f"specpipe: linear kernels for few rows: {apply_dense_rows(engine, dense_rows)}")
            limits = self.manifest.limits or {}
            batch = int(limits.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
            scheduler = BatchScheduler(
                engine,
                max_batch_size=batch,
                max_queue=int(params.get("max_queue_size") or 4 * batch),
                adaptive=adaptive,
                cost_model=None if adaptive else ForwardCostModel.unmeasured(),
            )
            lengths = (
                f"target forward cost measured at load: {scheduler.policy.cost_model.describe()}"
                if adaptive
                else "every request drafts max_draft_len every step (draft_lengths max)"
            )
            logger.log_info(f"specpipe: batch scheduler for {batch} requests; {lengths}")
            return scheduler

        self.stops = StopRequests()
        self.worker = RequestWorker(load=load, log_error=logger.log_error, drain=DrainSignal.from_environment())
        self.metrics = SchedulerMetrics(self.manifest.name)  # labelled with the deployment: after the load
        self.worker.on_step, self.worker.track = self.metrics.update, self.metrics.track
        logger.log_info(f"specpipe CPU engine '{self.manifest.name}' loaded from {engine_dir}")

    def execute(self, requests):
        for request in requests:
            sender = TritonSender(
                request.get_response_sender(), request.request_id(), self.stops, self.metrics.request_failed
            )
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
