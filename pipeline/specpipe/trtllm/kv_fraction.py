"""``kv_cache_free_gpu_mem_fraction`` of each engine, from the build's memory plan.

The tensorrtllm backend sizes an engine's KV-cache pool as this fraction of the GPU memory that is
free after the engine's weights and runtime buffers are loaded (``kv_cache_free_gpu_mem_fraction``,
model_instance_state.cc, see :mod:`specpipe.triton.backend_parameters`). From the memory plan
(:mod:`specpipe.trtllm.memory`, bytes per GPU):

    F = gpu_memory - (target_weights + draft_weights + activations + runtime_overhead)   free at load
    U = usable     - (same)                                                              free within 95 %

One engine: its pool may take all of ``U``, so the fraction is ``U / F``. Two engines on the same GPUs
(draft-target): ``U`` is split in proportion to their planned KV caches and each fraction is its share
of ``U`` over ``F``. Triton loads the two models in any order; the engine loaded second sees less free
memory and so gets at most its share: the pools never exceed ``U`` together. Fractions are rounded
down to 0.01.
"""

from __future__ import annotations

import math
from typing import Any

from specpipe.errors import SpecpipeError

MIN_FRACTION = 0.01


def _floor2(value: float) -> float:
    return math.floor(value * 100 + 1e-9) / 100


def kv_cache_fractions(memory: dict[str, Any], two_engines: bool) -> tuple[float, float | None]:
    """``(target fraction, draft fraction or None)`` for a memory plan (``MemoryPlan.as_dict()``).

    Raises:
        SpecpipeError: the plan names no GPU, or its KV caches do not fit the GPU.
    """
    if not memory.get("gpu_memory") or not memory.get("usable"):
        raise SpecpipeError(
            "the memory plan names no GPU, so the KV-cache fraction cannot be derived: build (or plan) with --gpu, "
            "e.g. --gpu h100-80gb"
        )
    fixed = sum(int(memory.get(k, 0)) for k in ("target_weights", "draft_weights", "activations", "runtime_overhead"))
    free = int(memory["gpu_memory"]) - fixed
    usable = int(memory["usable"]) - fixed
    kv_t, kv_d = int(memory.get("target_kv_cache", 0)), int(memory.get("draft_kv_cache", 0))
    need = kv_t + (kv_d if two_engines else 0)
    if usable <= 0 or usable < need:
        gib = 1 << 30
        raise SpecpipeError(
            f"the memory plan leaves {max(usable, 0) / gib:.2f} GiB per GPU for KV caches on {memory.get('gpu')}, the "
            f"engines need {need / gib:.2f} GiB: rebuild with a larger --tp, a smaller --max-batch-size or --max-seq-len"
        )
    if not two_engines:
        return max(MIN_FRACTION, _floor2(usable / free)), None
    share_t = kv_t / need if need else 0.5
    return (
        max(MIN_FRACTION, _floor2(share_t * usable / free)),
        max(MIN_FRACTION, _floor2((1 - share_t) * usable / free)),
    )
