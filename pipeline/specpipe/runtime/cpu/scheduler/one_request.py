"""One request served alone by the batch scheduler: the CPU runtime's only decoding loop serves it.

:func:`solo_scheduler` makes a one-slot :class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler`
that drafts ``max_draft_len`` every step (no adaptive rule: nothing shares the step, and callers measure
what the drafts give). :func:`generate` runs one request on it step by step, :func:`generate_all` to the
end. Users: the Triton model's one-request worker mode, held-out acceptance and self-instruct data in
training, the benchmarks, and tests. A request's greedy text is the one it gets in any batch; a seeded
sampled text too (position-keyed draws, :mod:`~specpipe.runtime.cpu.scheduler.batch_request`).
"""

from __future__ import annotations

from collections.abc import Iterator

from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.runtime.cpu.validation import validate_request


def solo_scheduler(deployment: Deployment, **options) -> BatchScheduler:
    """A scheduler that serves one request at a time on ``deployment``, drafting ``max_draft_len`` each step.

    Args:
        deployment: the loaded target, drafter and settings.
        options: other :class:`BatchScheduler` arguments (``max_batch_size`` defaults to 1, ``max_queue``
            to 0, ``adaptive`` to ``False``; the cost model, unused without the adaptive rule, is not measured).
    """
    options = {"max_batch_size": 1, "max_queue": 0, "adaptive": False, **options}
    if options.get("cost_model") is None and not options["adaptive"]:
        options["cost_model"] = ForwardCostModel.unmeasured()
    return BatchScheduler(deployment, **options)


def generate(scheduler: BatchScheduler, input_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
    """Serve one request on ``scheduler`` (idle: nothing else active or waiting), one output per step.

    The first step is the prefill (one token; a long prompt is prefilled in ``prefill_chunk`` pieces, the
    last one emitting it); each later step commits 1 .. ``max_draft_len + 1`` tokens. The last output has
    ``finished=True`` and a ``finish_reason``: ``"stop"`` (end id or stop word, neither returned) or
    ``"length"`` (``max_tokens`` reached or the context is full). Stats are cumulative. The request is
    queued at the first ``next()``; closing the iterator early cancels it and frees its slot.

    Raises:
        ValueError: an invalid request (as :meth:`BatchScheduler.submit`), here, before the first step.
        RuntimeError: the scheduler has other work (it would be batched with it).
        Exception: whatever ended the request in the scheduler (a drafter's failure), from the iterator.
    """
    if scheduler.has_work:
        raise RuntimeError(
            "the scheduler is serving other requests: one_request.generate needs an idle one "
            "(make one with solo_scheduler, or submit to the busy one)"
        )
    input_ids = list(input_ids)
    validate_request(input_ids, params, vocab_size=scheduler.lm.vocab_size, max_context=scheduler.max_context)
    return _steps(scheduler, input_ids, params)


def _steps(scheduler: BatchScheduler, input_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
    outputs: list[StepOutput] = []
    errors: list[BaseException] = []
    # Submitted at the first next(), so an iterator that is never started leaves the scheduler idle.
    request = scheduler.submit(input_ids, params, outputs.append, errors.append)
    try:
        while not request.done:
            scheduler.step()
            yield from outputs
            outputs.clear()
        if errors:
            raise errors[0]
    finally:
        if not request.done:
            request.cancel()
            scheduler.step()  # drops the cancelled request, frees its slot


def generate_all(
    scheduler: BatchScheduler, input_ids: list[int], params: SamplingParams
) -> tuple[list[int], RequestStats]:
    """Run one request to completion on ``scheduler``; returns its returned tokens and final stats.

    Raises:
        as :func:`generate`.
    """
    tokens: list[int] = []
    stats = RequestStats(num_input_tokens=len(input_ids))
    for step in generate(scheduler, input_ids, params):
        tokens += step.token_ids
        stats = step.stats
    return tokens, stats
