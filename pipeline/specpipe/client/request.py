"""One request to a TensorRT-LLM-style ensemble and its Triton input tensors.

:class:`GenerationRequest` holds what a user asks for; :func:`build_inputs` turns it into the
ensemble's input tensors (the names and dtypes of TensorRT-LLM's ``inflight_batcher_llm`` ensemble:
``max_tokens`` INT32, ``seed`` UINT64 ...), refusing values that the tensors cannot hold;
:func:`sampling_fields` says when a request samples, as TensorRT-LLM decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class GenerationRequest:
    """One text-generation request.

    ``temperature``/``top_k``/``top_p``/``seed`` left as ``None`` are not sent, which makes the
    request greedy (as in TensorRT-LLM). ``stop_words`` are strings; the server stops before them.
    ``return_perf_metrics=None`` leaves the flag out (for ensembles that do not declare it);
    ``return_num_tokens=True`` also sends ``return_num_input_tokens``/``return_num_output_tokens``
    (upstream ensembles return the token counts only when asked). ``repetition_penalty``,
    ``presence_penalty``, ``frequency_penalty`` and ``min_tokens`` (TensorRT-LLM's definitions) are
    sent only when set. ``text_segments`` (specpipe ensembles only): the prompt in pieces whose odd
    pieces are tokenized as plain text (see :mod:`specpipe.triton.models.preprocessing`).
    """

    prompt: str
    max_tokens: int = 128
    stream: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    end_id: int | None = None
    exclude_input_in_output: bool = True
    return_perf_metrics: bool | None = True
    return_num_tokens: bool | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    text_segments: tuple[str, ...] = ()


#: The largest value of the ensemble's INT32 inputs (``max_tokens``, ``top_k``, ``end_id``, ``min_tokens``).
INT32_MAX = 2**31 - 1

#: The largest ``seed`` (the ensemble's ``random_seed`` is UINT64).
SEED_MAX = 2**64 - 1


def sampling_fields(
    temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None
) -> dict[str, float | int | None]:
    """The sampling fields of a :class:`GenerationRequest` for what a user asked, as TensorRT-LLM reads
    them: a request samples only when ``top_k`` > 1 or ``top_p`` > 0 reaches the server, so a temperature
    alone would decode greedily. Greedy (every field ``None``) for ``temperature`` 0, or when nothing is
    set; otherwise the given fields, ``top_p`` 1.0 (no nucleus cut) when not given, and the seed.
    ``temperature`` ``None`` with ``top_k``/``top_p`` set samples at the server's temperature (1.0)."""
    if temperature == 0 or (temperature is None and top_k is None and top_p is None):
        return {"temperature": None, "top_k": None, "top_p": None, "seed": None}
    return {"temperature": temperature, "top_k": top_k, "top_p": 1.0 if top_p is None else top_p, "seed": seed}


def _check_ranges(request: "GenerationRequest") -> None:
    if not 1 <= request.max_tokens <= INT32_MAX:
        raise SpecpipeError(f"max_tokens must be 1-{INT32_MAX} (a 32-bit count), got {request.max_tokens}")
    for name in ("top_k", "end_id", "min_tokens"):
        value = getattr(request, name)
        if value is not None and not 0 <= value <= INT32_MAX:
            raise SpecpipeError(f"{name} must be 0-{INT32_MAX}, got {value}")
    if request.seed is not None and not 0 <= request.seed <= SEED_MAX:
        raise SpecpipeError(f"seed must be 0-{SEED_MAX} (a 64-bit unsigned integer), got {request.seed}")


def tensor_input(name: str, value: np.ndarray, batched: bool):
    """A tritonclient gRPC ``InferInput`` named ``name`` holding ``value`` (numpy; object arrays go as
    BYTES); ``batched`` adds the leading batch dimension of 1."""
    from tritonclient.grpc import InferInput
    from tritonclient.utils import np_to_triton_dtype

    array = value[np.newaxis, ...] if batched else value
    tensor = InferInput(name, list(array.shape), "BYTES" if array.dtype == object else np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def build_inputs(request: GenerationRequest, batched: bool) -> list:
    """Triton input tensors for ``request``; ``batched`` adds the leading batch dimension of 1.

    Raises:
        SpecpipeError: a value outside its tensor's range (``max_tokens`` 1-2**31-1, ``seed`` 0-2**64-1 ...),
            which would otherwise wrap around.
    """
    _check_ranges(request)
    tensors = [
        tensor_input("text_input", np.array([request.prompt.encode()], dtype=object), batched),
        tensor_input("max_tokens", np.array([request.max_tokens], dtype=np.int32), batched),
        tensor_input("stream", np.array([request.stream], dtype=bool), batched),
        tensor_input("exclude_input_in_output", np.array([request.exclude_input_in_output], dtype=bool), batched),
    ]
    if request.return_perf_metrics is not None:
        tensors.append(
            tensor_input("return_perf_metrics", np.array([request.return_perf_metrics], dtype=bool), batched)
        )
    if request.return_num_tokens is not None:
        for name in ("return_num_input_tokens", "return_num_output_tokens"):
            tensors.append(tensor_input(name, np.array([request.return_num_tokens], dtype=bool), batched))
    optional = {
        "temperature": (request.temperature, np.float32),
        "top_k": (request.top_k, np.int32),
        "top_p": (request.top_p, np.float32),
        "seed": (request.seed, np.uint64),
        "end_id": (request.end_id, np.int32),
        "repetition_penalty": (request.repetition_penalty, np.float32),
        "presence_penalty": (request.presence_penalty, np.float32),
        "frequency_penalty": (request.frequency_penalty, np.float32),
        "min_tokens": (request.min_tokens, np.int32),
    }
    for name, (value, dtype) in optional.items():
        if value is not None:
            tensors.append(tensor_input(name, np.array([value], dtype=dtype), batched))
    for name, words in (
        ("stop_words", request.stop_words),
        ("bad_words", request.bad_words),
        ("text_segments", request.text_segments),
    ):
        if words:
            tensors.append(tensor_input(name, np.array([w.encode() for w in words], dtype=object), batched))
    if request.text_segments and "".join(request.text_segments) != request.prompt:
        raise SpecpipeError("text_segments must join to exactly the prompt")
    return tensors
