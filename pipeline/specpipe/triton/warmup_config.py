"""Triton ``model_warmup`` for the models of the tensorrtllm backend (engine-flow repositories).

Triton core sends the warm-up requests listed in a model's config to each model instance after it is
loaded and before the model is marked ready (model_config.proto, ``ModelWarmup``; the server's
"Model Warmup" documentation). The tensorrtllm backend serves them as ordinary requests: its repository
documents ``model_warmup`` for the ``tensorrt_llm`` model with ``input_ids``, ``input_lengths`` and
``request_output_len`` read from files under the model's ``warmup/`` folder
(triton-inference-server/tensorrtllm_backend, docs/lora_warmup.md, commit ad13938). Input data files
hold the raw little-endian values of the tensor (int32 here).
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

#: Folder (inside the model's folder) where Triton looks for ``input_data_file`` warm-up data.
WARMUP_DIR = "warmup"
#: Prompt length (tokens) and new tokens of the warm-up request.
WARMUP_PROMPT_TOKENS = 16
WARMUP_NEW_TOKENS = 8


def engine_warmup(
    name: str = "short_prompt", prompt_tokens: int = WARMUP_PROMPT_TOKENS, new_tokens: int = WARMUP_NEW_TOKENS
) -> tuple[mc.ModelWarmup, dict[str, bytes]]:
    """One warm-up request for a tensorrtllm-backend model: a ``prompt_tokens``-token prompt of ordinary
    ids (100, 101 ...), ``new_tokens`` new tokens, batch size 1.

    Returns:
        the ``ModelWarmup`` message and its data files by file name (to write into ``warmup/``).
    """
    data = {
        "input_ids": np.arange(100, 100 + prompt_tokens, dtype="<i4"),
        "input_lengths": np.array([prompt_tokens], dtype="<i4"),
        "request_output_len": np.array([new_tokens], dtype="<i4"),
    }
    warmup = mc.ModelWarmup(name=name, batch_size=1, count=1)
    files = {}
    for tensor, values in data.items():
        file_name = f"{name}_{tensor}"
        warmup.inputs[tensor].data_type = mc.TYPE_INT32
        warmup.inputs[tensor].dims.extend([int(values.size)])
        warmup.inputs[tensor].input_data_file = file_name
        files[file_name] = values.tobytes()
    return warmup, files


def add_engine_warmup(config: mc.ModelConfig) -> dict[str, bytes]:
    """Add :func:`engine_warmup`'s request to ``config`` (in place).

    Returns:
        the data files to write, by path relative to the repository root (``<model>/warmup/<file>``).
    """
    warmup, files = engine_warmup()
    config.model_warmup.append(warmup)
    return {f"{config.name}/{WARMUP_DIR}/{file_name}": data for file_name, data in files.items()}
