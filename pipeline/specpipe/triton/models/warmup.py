"""Warm a CPU deployment up before its Triton model reports ready, so the first user request is not the slow one.

The first requests through a freshly loaded deployment pay one-off costs: oneDNN creates its primitives for
each new input shape (one row for a decode step, n rows for a prefill or a verification, a batch's rows,
the heads' own shapes), PyTorch allocates its caches, and the drafter builds its state.
:func:`warm_up_deployment` runs short greedy requests with prompts of different lengths through the batch
scheduler, the code that serves every request, drafting ``max_draft_len`` every step (its chain or, for
Medusa and EAGLE, tree verification): each prompt alone, then all of them in one batch. It runs on the
thread that will serve (the prepacked kernels are faster on the thread that first used them), inside the
model's ``initialize``, i.e. before Triton marks the model ready. Its scheduler is its own, so what the
serving scheduler learns (acceptance, drafting costs) comes from user requests only.

Triton's own ``model_warmup`` (config.pbtxt) is not used for the CPU model: its requests arrive
through ``execute`` on Triton's thread and would only be queued to the engine thread, while the load
already runs there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

#: Prompt lengths (tokens) of the warm-up requests: a short and a chat-sized prompt.
WARMUP_PROMPT_LENGTHS = (8, 96)
#: New tokens per warm-up request: enough for several decode (and speculative) steps.
WARMUP_NEW_TOKENS = 16


#: The warm-up prompts repeat a cycle of this many ids, so that n-gram lookup finds matches and drafts.
WARMUP_CYCLE = 6


def warmup_prompt(length: int, vocab_size: int) -> list[int]:
    """A deterministic prompt of ``length`` ordinary token ids: a cycle of :data:`WARMUP_CYCLE` ids from
    100 up (wrapped into the vocabulary), repeated."""
    return [100 + (7 * (i % WARMUP_CYCLE)) % max(1, vocab_size - 100) for i in range(length)]


def warm_up_deployment(
    deployment: Deployment,
    log: Callable[[str], None] | None = None,
    *,
    lengths: tuple[int, ...] = WARMUP_PROMPT_LENGTHS,
    max_tokens: int = WARMUP_NEW_TOKENS,
) -> float:
    """Serve one greedy request per prompt length alone, then all of them in one batch, through a batch
    scheduler of ``deployment`` that drafts every step; return the seconds it took.

    Args:
        deployment: the loaded target, drafter and settings.
        log: called with one line saying how long the warm-up took.
        lengths: prompt lengths, tokens (capped to fit the deployment's context).
        max_tokens: new tokens per request.

    Raises:
        Exception: whatever a warm-up request failed with (the deployment cannot serve).

    Call it on the thread that will serve, before the model reports ready.
    """
    vocab = deployment.target.vocab_size
    prompts = [warmup_prompt(max(1, min(n, deployment.max_context - max_tokens - 1)), vocab) for n in lengths]
    params = SamplingParams(max_tokens=max_tokens)
    scheduler = solo_scheduler(deployment, max_batch_size=max(1, len(prompts)))
    start = time.perf_counter()
    for prompt in prompts:
        generate_all(scheduler, prompt, params)
    errors: list[BaseException] = []
    for prompt in prompts:
        scheduler.submit(prompt, params, lambda step: None, errors.append)
    scheduler.run_until_idle()
    if errors:
        raise errors[0]
    seconds = time.perf_counter() - start
    if log is not None:
        log(
            f"specpipe: engine warmed up in {seconds:.2f} s ({len(prompts)} requests alone and together, prompts of "
            f"{', '.join(map(str, lengths))} tokens, {max_tokens} new tokens each, drafting every step)"
        )
    return seconds
