"""Runs one :class:`EngineRequest` on the CPU engine and turns its steps into response tensors.

Output tensors (TensorRT-LLM's ``tensorrt_llm`` outputs @ 2a9abd95, batch size 1, beam width 1):

- ``output_ids`` INT32 ``[1, 1, T]``: streamed response: the tokens this step committed (as
  TensorRT-LLM streams); non-streamed: prompt (unless ``exclude_input_in_output``) + all output.
- ``sequence_length`` INT32 ``[1, 1]``: ``T``.
- ``prior_output_ids`` INT32 ``[1, 1, P]`` (specpipe): tokens sent in earlier streamed responses of
  the request (``P = 0`` otherwise), so that postprocessing can decode chunks exactly.
- with ``return_perf_metrics``: ``acceptance_rate`` FP32 ``[1, 1]`` (in [0, 1]),
  ``total_accepted_draft_tokens`` / ``total_draft_tokens`` INT32 ``[1, 1]``, cumulative over the
  request, ``draft_length`` INT32 ``[1, 1]`` (specpipe: the draft length chosen for the latest step) and
  ``target_forwards`` INT32 ``[1, 1]`` (specpipe: target forward passes so far, the prefill included);
  with it or the ``return_num_*`` flags: ``num_input_tokens`` / ``num_output_tokens`` INT32
  ``[1, 1]``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specpipe.generation.api import RequestStats
from specpipe.triton.models.engine_request import EngineRequest


class Cancelled(Exception):
    """The client cancelled the request; stop generating."""


def _ids(tokens: list[int]) -> np.ndarray:
    return np.array(tokens, dtype=np.int32).reshape(1, 1, len(tokens))


def response_outputs(
    request: EngineRequest, tokens: list[int], prior: list[int], stats: RequestStats
) -> dict[str, np.ndarray]:
    """Output tensors of one response carrying ``tokens`` after ``prior`` (see module doc)."""
    outputs = {
        "output_ids": _ids(tokens),
        "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
        "prior_output_ids": _ids(prior),
    }
    if request.return_perf_metrics:
        outputs["acceptance_rate"] = np.array([[stats.acceptance_rate]], dtype=np.float32)
        outputs["total_accepted_draft_tokens"] = np.array([[stats.total_accepted_draft_tokens]], dtype=np.int32)
        outputs["total_draft_tokens"] = np.array([[stats.total_draft_tokens]], dtype=np.int32)
        outputs["draft_length"] = np.array([[stats.draft_length]], dtype=np.int32)
        outputs["target_forwards"] = np.array([[stats.target_forwards]], dtype=np.int32)
    if request.return_perf_metrics or request.return_num_input_tokens:
        outputs["num_input_tokens"] = np.array([[stats.num_input_tokens]], dtype=np.int32)
    if request.return_perf_metrics or request.return_num_output_tokens:
        outputs["num_output_tokens"] = np.array([[stats.num_output_tokens]], dtype=np.int32)
    return outputs


def run_request(
    engine,
    request: EngineRequest,
    emit: Callable[[dict[str, np.ndarray], bool], None],
    cancelled: Callable[[], bool] = lambda: False,
) -> RequestStats:
    """Generate for ``request`` and hand each response to ``emit(outputs, final)``.

    Streaming: one ``emit`` per engine step, the last one with ``final=True`` (an empty one if the
    engine ends without a finished step). Otherwise exactly one ``emit(..., final=True)`` at the end.

    Returns:
        the request's final counters.

    Raises:
        ValueError: the engine rejected the request (e.g. the prompt is longer than the context).
        Cancelled: ``cancelled()`` turned true between steps; nothing more was emitted.
        Exception: anything else the engine raised.
    """
    generated: list[int] = []
    stats = RequestStats(num_input_tokens=len(request.input_ids))
    finished = False
    for step in engine.generate(list(request.input_ids), request.params):
        stats = step.stats
        tokens = list(step.token_ids)
        finished = bool(step.finished)
        if request.streaming:
            emit(response_outputs(request, tokens, generated, stats), finished)
        generated.extend(tokens)
        if finished:
            break
        if cancelled():
            raise Cancelled()
    if request.streaming:
        if not finished:
            emit(response_outputs(request, [], generated, stats), True)
    else:
        prompt = [] if request.exclude_input_in_output else list(request.input_ids)
        emit(response_outputs(request, prompt + generated, [], stats), True)
    return stats


class StepResponder:
    """Turns one request's :class:`StepOutput` objects, handed over one at a time by the batch scheduler,
    into responses exactly as :func:`run_request` does (streamed: one per step; else one at the end).

    Args:
        request: the parsed request; emit: ``emit(outputs, final)`` as for :func:`run_request`.
    """

    def __init__(self, request: EngineRequest, emit: Callable[[dict[str, np.ndarray], bool], None]):
        self.request, self.emit = request, emit
        self.generated: list[int] = []

    def step(self, step) -> None:
        """Handle one step of the request (the scheduler's ``emit`` callback)."""
        tokens = list(step.token_ids)
        if self.request.streaming:
            self.emit(response_outputs(self.request, tokens, self.generated, step.stats), bool(step.finished))
        self.generated.extend(tokens)
        if step.finished and not self.request.streaming:
            prompt = [] if self.request.exclude_input_in_output else list(self.request.input_ids)
            self.emit(response_outputs(self.request, prompt + self.generated, [], step.stats), True)
