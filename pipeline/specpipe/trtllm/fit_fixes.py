"""The fixes a memory-fit failure suggests, each one re-planned and offered only if that plan fits.

A plan that does not fit its GPU names changes to try (:func:`suggest_fixes`). Every candidate is a
changed :class:`~specpipe.build_request.BuildRequest` (and, for another draft, another
:class:`~specpipe.trtllm.resolve.Draft`) that is planned again through the same pre-flight checks; a
candidate is offered only when that plan passes every check and fits, and it says what the re-plan
picked (``--gpus 4 (auto picks TP 4 x PP 1)``), so that following a suggestion never leads to another
refusal. Candidates, in order: more GPUs (``--tp/--pp auto``) or a larger ``--tp`` (given sizes); a
smaller quantization; a smaller ``--max-batch-size``; a draft that adds no weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from specpipe.build_request import AUTO, BuildRequest, GpuCount
from specpipe.errors import SpecpipeError
from specpipe.speculative import spec_of
from specpipe.trtllm.parallelism import ParallelChoice
from specpipe.trtllm.quant import SCHEMES, Scheme
from specpipe.trtllm.resolve import Draft, Target, resolve_draft

#: GPU counts ``--gpus`` suggestions may name: up to this many (eight nodes of eight).
MAX_GPUS = 64
#: Schemes tried as a fix, smallest last; only those that store fewer bytes per weight than the plan's.
SMALLER_SCHEMES = ("fp8", "int4-awq")
#: Drafts tried as a fix when the plan's draft adds weights (the name for ``--draft``).
WEIGHTLESS_DRAFTS = ("lookahead",)


class Replanned(Protocol):
    """What :func:`suggest_fixes` reads of a re-plan (a :class:`~specpipe.trtllm.preflight.PreflightResult`)."""

    memory_error: str | None
    parallel: ParallelChoice | None


#: ``replan(request, draft)``: the pre-flight result of the changed request; raises on a failed check.
Replan = Callable[[BuildRequest, Draft], Replanned]


def _fits(replan: Replan, request: BuildRequest, draft: Draft) -> ParallelChoice | None:
    """The parallel choice of the re-plan when it passes and fits, else ``None``."""
    try:
        result = replan(request, draft)
    except SpecpipeError:
        return None
    choice = result.parallel
    if result.memory_error is not None or choice is None or not choice.fits or choice.beyond:
        return None
    return choice


def _picks(request: BuildRequest, choice: ParallelChoice) -> str:
    """`` (auto picks TP a x PP b)`` when a size is auto, so the suggestion says what the re-plan chose."""
    return f" (auto picks TP {choice.tp} x PP {choice.pp})" if AUTO in (request.tp, request.pp) else ""


def _more_gpus(request: BuildRequest, draft: Draft, parallel: ParallelChoice, replan: Replan) -> str | None:
    """``--gpus N`` for an auto TP (the fewest GPUs on which the re-plan fits), ``--tp N`` for a given one."""
    if request.tp == AUTO:
        for count in range(parallel.available + 1, MAX_GPUS + 1):
            choice = _fits(replan, replace(request, gpus=GpuCount(count, "--gpus")), draft)
            if choice is not None:
                return f"--gpus {count}{_picks(request, choice)}"
        return None
    tp = parallel.tp * 2
    while tp * parallel.pp <= MAX_GPUS:
        if _fits(
            replan, replace(request, tp=tp, gpus=GpuCount(max(tp * parallel.pp, parallel.available), "--gpus")), draft
        ):
            return f"--tp {tp}" + ("" if tp * parallel.pp <= parallel.available else f" --gpus {tp * parallel.pp}")
        tp *= 2
    return None


def suggest_fixes(
    target: Target, draft: Draft, scheme: Scheme, request: BuildRequest, parallel: ParallelChoice, replan: Replan
) -> list[str]:
    """The single changes that make the plan fit, each checked by ``replan`` (module docstring).

    Args:
        target, draft: the plan's models. scheme: its quantization. request: the request as given (sizes
            may be ``auto``). parallel: the sizes it used. replan: plans a changed request (pre-flight,
            no suggestions of its own).

    Returns:
        ``--flag value`` texts, at most one per kind, in the order tried; ``[]`` when no single change fits.
    """
    fixes: list[str] = []
    more = _more_gpus(request, draft, parallel, replan)
    if more:
        fixes.append(more)
    for name in SMALLER_SCHEMES:
        if SCHEMES[name].weight_bytes >= scheme.weight_bytes:
            continue
        choice = _fits(replan, replace(request, quantization=name), draft)
        if choice is not None:
            fixes.append(f"--quantization {name}{_picks(request, choice)}")
            break
    batch = request.max_batch_size // 2
    while batch >= 1:
        choice = _fits(replan, replace(request, max_batch_size=batch), draft)
        if choice is not None:
            fixes.append(f"--max-batch-size {batch}{_picks(request, choice)}")
            break
        batch //= 2
    if spec_of(draft.method).weights is not None:
        for name in WEIGHTLESS_DRAFTS:
            try:
                other = resolve_draft(name, None, target, allow_network=False)
            except SpecpipeError:
                continue
            choice = _fits(
                replan, replace(request, draft=name, draft_model=None, choices=None, max_draft_len=None), other
            )
            if choice is not None:
                fixes.append(f"--draft {name} (adds no weights){_picks(request, choice)}")
                break
    return fixes
