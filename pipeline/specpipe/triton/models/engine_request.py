"""Inputs of the ``tensorrt_llm`` model -> one CPU-engine request, validated.

Input names, types and meanings follow TensorRT-LLM's ``tensorrt_llm`` Triton model
(``inflight_batcher_llm/tensorrt_llm/config.pbtxt`` @ 2a9abd95; see
:data:`specpipe.triton.interface.TENSORRT_LLM`).

Greedy or sampling, as in TensorRT-LLM: a request is greedy unless it asks for sampling with
``runtime_top_k`` > 1 or any ``runtime_top_p``; ``runtime_top_k == 1`` is always greedy, and
``temperature`` alone does not turn sampling on. ``temperature == 0`` also means greedy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specpipe.generation.api import SamplingParams
from specpipe.triton.models.common import scalar
from specpipe.triton.models.words import from_words_layout


@dataclass(frozen=True)
class EngineRequest:
    """One validated request for the CPU engine.

    Attributes:
        input_ids: prompt token ids (at least one).
        params: sampling settings, ``max_tokens`` >= 1.
        streaming: one response per engine step (else one at the end).
        exclude_input_in_output: non-streamed ``output_ids`` without the prompt.
        return_perf_metrics: fill the speculative-decoding counters (and the token counts).
        return_num_input_tokens: fill ``num_input_tokens``.
        return_num_output_tokens: fill ``num_output_tokens``.
        draft_input_ids: draft tokens to verify in one target step (``draft_input_ids`` input of
            TensorRT-LLM's draft-target mode), or ``None`` for ordinary generation.
    """

    input_ids: list[int]
    params: SamplingParams
    streaming: bool = False
    exclude_input_in_output: bool = False
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    draft_input_ids: tuple[int, ...] | None = None


def parse_request(get: Callable[[str], np.ndarray | None], *, exclude_input_default: bool = False) -> EngineRequest:
    """Build an :class:`EngineRequest` from the model's inputs.

    Args:
        get: returns the input tensor of that name as a numpy array, or ``None`` when absent.
        exclude_input_default: ``exclude_input_in_output`` when the request does not set it (the
            model parameter of that name).

    Raises:
        ValueError: a bad request, with a message naming the input and the accepted values: empty
            prompt, ``max_tokens`` < 1, negative ``top_k``, ``top_p`` outside (0, 1], negative or
            non-finite ``temperature``, ``repetition_penalty`` not finite and > 0, a non-finite
            ``presence_penalty``/``frequency_penalty``, negative ``min_tokens``, malformed word
            lists, more than one prompt.
    """
    ids_array = get("input_ids")
    if ids_array is None:
        raise ValueError("input_ids is missing: send the prompt's token ids")
    ids_array = np.asarray(ids_array)
    if ids_array.ndim > 1 and ids_array.shape[0] > 1:
        raise ValueError(f"one prompt per request is supported, got a batch of {ids_array.shape[0]}")
    input_ids = [int(t) for t in ids_array.reshape(-1)]
    length = scalar(get("input_lengths"), "input_lengths")
    if length is not None:
        if not 0 <= int(length) <= len(input_ids):
            raise ValueError(f"input_lengths is {length} but input_ids holds {len(input_ids)} tokens")
        input_ids = input_ids[: int(length)]
    if not input_ids:
        raise ValueError("the prompt is empty: send a text_input of at least one token")

    max_tokens = scalar(get("request_output_len"), "request_output_len")
    if max_tokens is None:
        raise ValueError("max_tokens (request_output_len) is missing: send the number of tokens to generate")
    if int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be >= 1, got {int(max_tokens)}")

    top_k = scalar(get("runtime_top_k"), "top_k")
    top_p = scalar(get("runtime_top_p"), "top_p")
    temperature = scalar(get("temperature"), "temperature")
    if top_k is not None and int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it, 1 is greedy), got {int(top_k)}")
    if top_p is not None and not (0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {float(top_p):g}")
    if temperature is not None and not (math.isfinite(float(temperature)) and float(temperature) >= 0.0):
        raise ValueError(f"temperature must be a finite number >= 0, got {float(temperature):g}")

    penalties = _penalties(get)
    sampling = (top_k is not None and int(top_k) > 1) or top_p is not None
    greedy = (
        not sampling
        or (top_k is not None and int(top_k) == 1)
        or (temperature is not None and float(temperature) == 0.0)
    )
    end_id = scalar(get("end_id"), "end_id")
    if end_id is not None and int(end_id) < -1:
        raise ValueError(f"end_id must be a token id >= 0, or -1 for the tokenizer's end id, got {int(end_id)}")
    seed = scalar(get("seed"), "seed")
    params = SamplingParams(
        max_tokens=int(max_tokens),
        greedy=greedy,
        temperature=1.0 if temperature is None or float(temperature) == 0.0 else float(temperature),
        top_k=0 if top_k is None else int(top_k),
        top_p=1.0 if top_p is None else float(top_p),
        seed=None if seed is None else int(seed),
        end_id=None if end_id is None or int(end_id) == -1 else int(end_id),
        stop_words=from_words_layout(get("stop_words_list")),
        bad_words=from_words_layout(get("bad_words_list")),
        **penalties,
    )

    def flag(name: str, default: bool = False) -> bool:
        value = scalar(get(name), name)
        return default if value is None else bool(value)

    drafts = get("draft_input_ids")
    return EngineRequest(
        draft_input_ids=None if drafts is None else tuple(int(t) for t in np.asarray(drafts).reshape(-1)),
        input_ids=input_ids,
        params=params,
        streaming=flag("streaming"),
        exclude_input_in_output=flag("exclude_input_in_output", exclude_input_default),
        return_perf_metrics=flag("return_perf_metrics"),
        return_num_input_tokens=flag("return_num_input_tokens"),
        return_num_output_tokens=flag("return_num_output_tokens"),
    )


def _penalties(get: Callable[[str], np.ndarray | None]) -> dict:
    """``repetition_penalty``/``presence_penalty``/``frequency_penalty``/``min_tokens`` as given
    (TensorRT-LLM's definitions, see :class:`~specpipe.generation.api.SamplingParams`), validated.

    Raises:
        ValueError: a value outside the accepted range, naming the input and the value.
    """
    found: dict = {}
    repetition = scalar(get("repetition_penalty"), "repetition_penalty")
    if repetition is not None:
        if not (math.isfinite(float(repetition)) and float(repetition) > 0.0):
            raise ValueError(
                f"repetition_penalty must be a finite number > 0 (1 disables it), got {float(repetition):g}"
            )
        found["repetition_penalty"] = float(repetition)
    for name in ("presence_penalty", "frequency_penalty"):
        value = scalar(get(name), name)
        if value is not None:
            if not math.isfinite(float(value)):
                raise ValueError(f"{name} must be a finite number (0 disables it), got {float(value):g}")
            found[name] = float(value)
    min_tokens = scalar(get("min_tokens"), "min_tokens")
    if min_tokens is not None:
        if int(min_tokens) < 0:
            raise ValueError(f"min_tokens must be >= 0 (0 disables it), got {int(min_tokens)}")
        found["min_tokens"] = int(min_tokens)
    return found
