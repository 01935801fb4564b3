"""Mixed precision for training, where the CPU runs bf16 matrix products natively
(:func:`~specpipe.runtime.cpu.model.prepack.native_bf16`, the check that also decides the drafts' dtype).

bf16 autocast halves the memory traffic of a training step on CPUs whose oneDNN kernels take bf16
(AVX-512 BW/VL/DQ, avx512_bf16, AMX: ``torch.ops.mkldnn._is_mkldnn_bf16_supported``). Elsewhere
(AVX2 only) PyTorch falls back to reference bf16 kernels: measured on an AMD EPYC with AVX2 and
torch 2.13, a [4096, 576] x [576, 32000] product with its backward took 234 s in bf16 against 4.6 s in
fp32, so training there stays in fp32. The choice is made at run time and written into the recipe.
"""

from __future__ import annotations

import torch

from specpipe.runtime.cpu.model.prepack import native_bf16


def training_dtype() -> str:
    """The dtype of the training steps' matrix products on this CPU: ``"bfloat16"`` or ``"float32"``."""
    return "bfloat16" if native_bf16() else "float32"


def mixed_precision() -> torch.autocast:
    """The autocast context for a training step's forward pass: bf16 where :func:`native_bf16`, else
    disabled (fp32). Losses are computed in fp32 either way."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())
