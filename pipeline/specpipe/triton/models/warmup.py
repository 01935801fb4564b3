"""Warm a CPU engine up before its Triton model reports ready, so the first user request is not the slow one.

The first requests through a freshly loaded engine pay one-off costs: oneDNN creates its primitives for
each new input shape (one row for a decode step, n rows for a prefill or a verification, the heads' own
shapes), PyTorch allocates its caches, and the drafter builds its state. :func:`warm_up_engine` runs a
few short greedy requests with prompts of different lengths through the engine on the thread that will
serve (the prepacked kernels are faster on the thread that first used them), inside the model's
``initialize``, i.e. before Triton marks the model ready.

Triton's own ``model_warmup`` (config.pbtxt) is not used for the CPU model: its requests arrive
through ``execute`` on Triton's thread and would only be queued to the engine thread, while the load
already runs there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from specpipe.generation.api import SamplingParams

#: Prompt lengths (tokens) of the warm-up requests: a short and a chat-sized prompt.
WARMUP_PROMPT_LENGTHS = (8, 96)
#: New tokens per warm-up request: enough for several decode (and speculative) steps.
WARMUP_NEW_TOKENS = 16


def warmup_prompt(length: int, vocab_size: int) -> list[int]:
    """A deterministic prompt of ``length`` ordinary token ids (ids from 100 up, wrapped into the vocabulary)."""
    return [100 + (7 * i) % max(1, vocab_size - 100) for i in range(length)]


def warm_up_engine(engine, log: Callable[[str], None] | None = None, *,
                   lengths: tuple[int, ...] = WARMUP_PROMPT_LENGTHS, max_tokens: int = WARMUP_NEW_TOKENS) -> float:
    """Run one greedy request per prompt length through ``engine`` and return the seconds it took.

    Args:
        engine: anything with ``generate_all(input_ids, SamplingParams)`` (the CPU engines) and a
            ``target.vocab_size`` (else a 49152-token vocabulary is assumed) and ``max_context``.
        log: called with one line saying how long the warm-up took.
        lengths: prompt lengths, tokens (capped to fit the engine's context).
        max_tokens: new tokens per request.

    Call it on the thread that will run the engine, before the model reports ready.
    """
    vocab = int(getattr(getattr(engine, "target", None), "vocab_size", 49152))
    context = int(getattr(engine, "max_context", 4096))
    start = time.perf_counter()
    for length in lengths:
        length = max(1, min(length, context - max_tokens - 1))
        engine.generate_all(warmup_prompt(length, vocab), SamplingParams(max_tokens=max_tokens))
    seconds = time.perf_counter() - start
    if log is not None:
        log(f"specpipe: engine warmed up in {seconds:.2f} s ({len(lengths)} requests, prompts of "
            f"{', '.join(map(str, lengths))} tokens, {max_tokens} new tokens each)")
    return seconds
