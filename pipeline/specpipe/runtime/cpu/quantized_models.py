"""Quantize a loaded engine's models weight-only (``-q int8-wo|int4-wo``): the CPU counterpart of
prepacking them (:mod:`~specpipe.runtime.cpu.model.prepack`), called by the loader instead of it.

What is quantized: every linear layer of the target's decoder (``q/k/v`` and ``gate/up`` fused first,
:mod:`~specpipe.runtime.cpu.model.fused_projections`; ``o_proj``, ``down_proj``) and its ``lm_head`` (its own
copy where tied: the input embedding stays fp32), the same of a draft model, the linear layers of EAGLE
and Medusa heads and their reduced lm_head. Greedy decoding takes the argmax
of the quantized lm_head's logits, on every path (the bf16 argmax screen of the fp32 lm_head is not used).
The quantized layers compute a row bitwise alike whatever rows share the call, but their bf16 inputs turn
a last-bit difference of batched attention into a bf16 rounding step that can flip a near-tie; so on a
quantized target the batch scheduler runs greedy requests as exact rows, a tree method verifying its
first-children chain (``BatchScheduler.exact_greedy``), and every speculative deployment's greedy output
equals the quantized baseline's alone and in a batch (``tests/runtime/cpu/test_quantized_smollm2.py``).
"""

from __future__ import annotations

import torch

from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.model.fused_projections import fuse_projections
from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear, quantize_linear_layers


def quantize_model(model: torch.nn.Module, scheme: str, drafter: object = None) -> int:
    """Fuse and quantize a Llama-style causal LM's decoder linear layers and its ``lm_head`` in place
    (:func:`~specpipe.runtime.cpu.model.quantized_linear.quantize_linear_layers`); a tree drafter's lm_head
    over the full vocabulary (``drafter.lm``, still dense) then shares the quantized ``lm_head``.

    Returns:
        the number of layers quantized.
    """
    fuse_projections(model.model)
    replaced = quantize_linear_layers(model.model, scheme) + quantize_linear_layers(model, scheme)
    lm = getattr(drafter, "lm", None)
    head = getattr(model, "lm_head", None)
    if (
        isinstance(lm, ReducedLMHead)
        and lm.draft_vocab is None
        and lm.weight is not None
        and isinstance(head, QuantizedLinear)
    ):
        lm.use_packed(head)  # type: ignore[arg-type]  # scores like a packed layer: out_features, __call__
    return replaced


def quantize_drafter(drafter, scheme: str | None):
    """Quantize an EAGLE/Medusa drafter loaded unprepacked, in place, and return it: the linear layers of
    every module it holds (its head or heads) and its lm_head over a reduced draft vocabulary (over the
    full one it shares the target's: :func:`quantize_model`). ``scheme`` ``None``: left as it is."""
    if scheme is None:
        return drafter
    for value in list(vars(drafter).values()):
        if isinstance(value, torch.nn.Module):
            quantize_linear_layers(value, scheme)
    lm = getattr(drafter, "lm", None)
    if isinstance(lm, ReducedLMHead) and lm.draft_vocab is not None and lm.weight is not None:
        lm.use_packed(QuantizedLinear(lm.weight, None, scheme))  # type: ignore[arg-type]
    return drafter
