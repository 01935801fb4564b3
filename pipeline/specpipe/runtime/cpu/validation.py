"""Checks of one request's inputs, before any work is done."""

from __future__ import annotations

import math

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.verify.sampling import is_greedy


def validate_request(input_ids: list[int], params: SamplingParams, *, vocab_size: int, max_context: int) -> None:
    """Reject a request the engine cannot serve.

    Args:
        input_ids: prompt token ids.
        params: sampling settings.
        vocab_size: the target's vocabulary size (valid ids are ``0 .. vocab_size - 1``).
        max_context: most tokens (prompt + output) the engine holds.

    Raises:
        ValueError: with a message naming the offending input and the accepted range.
    """
    if not input_ids:
        raise ValueError("input_ids is empty: a request needs at least one prompt token")
    if len(input_ids) >= max_context:
        raise ValueError(
            f"the prompt has {len(input_ids)} tokens but the context limit is {max_context} tokens: "
            f"shorten it to at most {max_context - 1} tokens to leave room for output"
        )
    out_of_range = [t for t in input_ids if not 0 <= t < vocab_size]
    if out_of_range:
        raise ValueError(f"input_ids contains ids outside the vocabulary [0, {vocab_size}): {out_of_range[:5]}")
    if params.max_tokens <= 0:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {params.top_k}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {params.top_p}")
    if not is_greedy(params) and not (params.temperature > 0.0 and math.isfinite(params.temperature)):
        raise ValueError(f"temperature must be a finite number > 0 when sampling, got {params.temperature}")
    if not (math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0.0):
        raise ValueError(
            f"repetition_penalty must be a finite number > 0 (1 disables it), got {params.repetition_penalty}"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if not math.isfinite(getattr(params, name)):
            raise ValueError(f"{name} must be a finite number (0 disables it), got {getattr(params, name)}")
    if params.min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0 (0 disables it), got {params.min_tokens}")
    if params.end_id is not None and not 0 <= params.end_id < vocab_size:
        raise ValueError(
            f"end_id must be a token id in [0, {vocab_size}) (or unset: the tokenizer's), got {params.end_id}"
        )
    bad = sorted({t for words in params.bad_words for t in words if not 0 <= t < vocab_size})
    if bad:
        raise ValueError(f"bad_words contains ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
