"""Helpers shared by specpipe's Triton Python-backend models.

``triton_python_backend_utils`` exists only inside Triton's Python-backend stub process, so it is
imported when first needed (:func:`pb_utils`); the rest of each model module imports without it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

#: How the error of a request that failed inside the CPU engine begins (``INTERNAL``; the gateway answers 500).
ENGINE_FAILED = "the CPU engine failed on this request"


def pb_utils():
    """The ``triton_python_backend_utils`` module of the running Triton Python-backend stub."""
    import triton_python_backend_utils

    return triton_python_backend_utils


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """String parameters of the model config given to ``TritonPythonModel.initialize(args)``."""
    config = json.loads(args["model_config"])
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def parse_bool(value: str | None, default: bool) -> bool:
    """``"true"``/``"1"``/``"yes"`` -> True, ``"false"``/``"0"``/``"no"`` -> False, empty -> ``default``.

    Raises:
        ValueError: any other text.
    """
    if value is None or value.strip() == "":
        return default
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


#: Values of the CPU model's ``draft_lengths`` parameter: the load-adaptive rule's lengths (its forward
#: cost measured at load), or every request drafting ``max_draft_len`` (its whole tree) every step.
DRAFT_LENGTHS = ("adaptive", "max")


def parse_draft_lengths(value: str | None) -> str:
    """The CPU model's ``draft_lengths`` parameter: one of :data:`DRAFT_LENGTHS`, empty -> ``adaptive``.

    Raises:
        ValueError: any other text.
    """
    text = (value or "").strip().lower() or DRAFT_LENGTHS[0]
    if text not in DRAFT_LENGTHS:
        raise ValueError(f"draft_lengths: expected {' or '.join(DRAFT_LENGTHS)}, got {value!r}")
    return text


def input_array(request, name: str) -> np.ndarray | None:
    """The input tensor ``name`` of a Triton request as a numpy array, or ``None`` when absent."""
    tensor = pb_utils().get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def scalar(array: np.ndarray | None, name: str):
    """The single value of a per-request input (``[1]``, ``[1, 1]`` or a scalar), or ``None``.

    Raises:
        ValueError: the tensor holds more or fewer than one value.
    """
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"input '{name}' must hold one value per request, got shape {list(np.asarray(array).shape)}")
    return flat[0].item()


def strings(array: np.ndarray | None, name: str = "a STRING input") -> list[str]:
    """The UTF-8 strings of a STRING (BYTES) tensor, flattened; ``[]`` when absent.

    Raises:
        ValueError: an element is not valid UTF-8 (the message names the input ``name`` and the element).
    """
    if array is None:
        return []
    texts = []
    for index, value in enumerate(np.asarray(array).reshape(-1)):
        try:
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{name} element {index} is not valid UTF-8 ({exc.reason} at byte {exc.start}): send UTF-8 text"
            ) from None
    return texts


def error_response(message: str, code: str = "INVALID_ARG"):
    """An ``InferenceResponse`` carrying a ``TritonError`` (``code``: a ``TritonError`` attribute)."""
    pb = pb_utils()
    error_code = getattr(pb.TritonError, code, None)
    error = pb.TritonError(message) if error_code is None else pb.TritonError(message, error_code)
    return pb.InferenceResponse(output_tensors=[], error=error)


def response(outputs: dict[str, np.ndarray]):
    """An ``InferenceResponse`` with one output tensor per ``outputs`` item."""
    pb = pb_utils()
    return pb.InferenceResponse(output_tensors=[pb.Tensor(name, value) for name, value in outputs.items()])
