"""One GEMM for a decoder layer's query, key and value projections, and one for its MLP's gate and up
projections (as vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear`` do).

A layer then makes 4 GEMM calls instead of 7, which saves per-call overhead (figures in
``docs/experiments.md``). The fused layer is an ordinary ``nn.Linear`` (``self_attn.qkv_proj``, ``mlp.gate_up_proj``) with
the weights stacked along the output dimension, so :func:`~specpipe.runtime.cpu.model.prepack.prepack_linear_layers`
packs it like any other layer and the weights are held once.

The original attributes (``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``) become
:class:`FusedSlice` modules, so transformers' own forward (used by
:class:`~specpipe.runtime.cpu.model.cached_lm.CachedLM`) still works: it calls the three (two) projections on
the same input one after the other, and the fused output computed for the first is reused for the others.
The batched forward (:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`) calls the fused layer itself.
"""

from __future__ import annotations

import torch
from torch import nn

#: The fused groups: (module holding them, fused layer's name, the projections it replaces).
GROUPS = (("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")), ("mlp", "gate_up_proj", ("gate_proj", "up_proj")))


class _FusedOutput:
    """The fused layer's output for the last input, until every slice has taken its columns once."""

    def __init__(self, owner: nn.Module, fused_name: str, slices: int):
        self.owner, self.fused_name, self.slices = owner, fused_name, slices
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._served: set[int] = set()

    def columns(self, x: torch.Tensor, index: int, start: int, stop: int) -> torch.Tensor:
        if x is not self._input or index in self._served:
            self._input, self._output, self._served = x, getattr(self.owner, self.fused_name)(x), set()
        out = self._output[..., start:stop]
        self._served.add(index)
        if len(self._served) == self.slices:
            self._input = self._output = None
        return out


class FusedSlice(nn.Module):
    """One projection of a fused group: columns ``[start, stop)`` of the fused layer's output, ``[...,
    in_features]`` -> ``[..., stop - start]`` (a view; float32 where the fused layer is)."""

    def __init__(self, shared: _FusedOutput, index: int, start: int, stop: int, in_features: int):
        super().__init__()
        self._shared, self.index, self.start, self.stop = shared, index, start, stop
        self.in_features, self.out_features = in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._shared.columns(x, self.index, self.start, self.stop)


def _fusable(linears: list) -> bool:
    first = linears[0]
    return (
        all(type(m) is nn.Linear for m in linears)
        and all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype for m in linears)
        and len({m.bias is None for m in linears}) == 1
    )


def fuse_projections(decoder: nn.Module) -> int:
    """In every layer of ``decoder.layers`` (a Llama-style decoder), stack ``q_proj``/``k_proj``/``v_proj``
    into ``self_attn.qkv_proj`` and ``gate_proj``/``up_proj`` into ``mlp.gate_up_proj`` (``nn.Linear``,
    weights ``[sum of out_features, in_features]`` in that order), replacing the originals by
    :class:`FusedSlice` views. Groups whose layers are not plain ``nn.Linear`` of one input size, dtype
    and bias presence are left as they are. Call before prepacking.

    Returns:
        the number of fused layers created.
    """
    fused = 0
    for layer in getattr(decoder, "layers", []):
        for owner_name, fused_name, names in GROUPS:
            owner = getattr(layer, owner_name, None)
            linears = [getattr(owner, name, None) for name in names]
            if owner is None or hasattr(owner, fused_name) or any(m is None for m in linears) or not _fusable(linears):
                continue
            weight = torch.cat([m.weight.detach() for m in linears])
            combined = nn.Linear(
                weight.shape[1], weight.shape[0], bias=linears[0].bias is not None, device="meta", dtype=weight.dtype
            )
            combined.weight = nn.Parameter(weight, requires_grad=False)
            if combined.bias is not None:
                combined.bias = nn.Parameter(torch.cat([m.bias.detach() for m in linears]), requires_grad=False)
            setattr(owner, fused_name, combined)
            shared = _FusedOutput(owner, fused_name, len(linears))
            start = 0
            for index, (name, linear) in enumerate(zip(names, linears)):
                setattr(owner, name, FusedSlice(shared, index, start, start + linear.out_features, linear.in_features))
                start += linear.out_features
            fused += 1
    return fused
