"""One decoder layer's operations, looked up once for the batched forward
(:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`): norms as single ``torch.rms_norm`` calls, linear
layers as their prepacked kernels on 2-D rows, the query/key/value projections as one GEMM and the
gated MLP's gate/up projections as another where the loader fused them
(:mod:`~specpipe.runtime.cpu.model.fused_projections`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import SiLUActivation

from specpipe.runtime.cpu.model.prepack import PrepackedLinear

Op = Callable[[torch.Tensor], torch.Tensor]


def norm_op(norm: torch.nn.Module) -> Op:
    """A Llama RMSNorm module as one ``torch.rms_norm`` call (instead of six ops; bitwise the same
    float32 result as transformers' ``LlamaRMSNorm``); other norm modules are called as they are."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or norm.weight.dtype != torch.float32:
        return norm
    return functools.partial(torch.rms_norm, normalized_shape=(norm.weight.shape[0],), weight=norm.weight, eps=eps)


def _linear_op(linear: torch.nn.Module) -> Op:
    """A linear layer's kernel for 2-D float32 rows: :meth:`PrepackedLinear.rows` (no reshapes, no module
    call) for a prepacked layer, the module itself otherwise."""
    return linear.rows if isinstance(linear, PrepackedLinear) else linear


@dataclass(frozen=True)
class LayerOps:
    """One decoder layer's operations, looked up once: a one-token step makes about 20 calls per layer,
    and at batch 1 the per-call overhead (module calls, attribute lookups, reshapes) is a sixth of it.

    Attributes:
        input_norm / post_norm: ``[T, H]`` -> ``[T, H]``.
        qkv: ``[T, H]`` -> ``[T, (heads + 2 * kv_heads) * head_dim]``, the query, key and value
            projections side by side (one GEMM where the layer has a fused ``qkv_proj``,
            :mod:`~specpipe.runtime.cpu.model.fused_projections`).
        o: the output projection, 2-D rows in and out.
        mlp: ``[T, H]`` -> ``[T, H]``: ``down(act(gate(x)) * up(x))`` from the layer's projections where
            its MLP is the gated Llama one with SiLU, else the MLP module itself.
        scaling: the attention's softmax scale.
    """

    input_norm: Op
    qkv: Op
    o: Op
    post_norm: Op
    mlp: Op
    scaling: float

    @classmethod
    def of(cls, layer: torch.nn.Module) -> "LayerOps":
        attn, mlp = layer.self_attn, layer.mlp
        return cls(
            norm_op(layer.input_layernorm),
            _qkv_op(attn),
            _linear_op(attn.o_proj),
            norm_op(layer.post_attention_layernorm),
            _mlp_op(mlp),
            float(attn.scaling),
        )


def _qkv_op(attn: torch.nn.Module) -> Op:
    fused = getattr(attn, "qkv_proj", None)
    if fused is not None:
        return _linear_op(fused)
    q, k, v = _linear_op(attn.q_proj), _linear_op(attn.k_proj), _linear_op(attn.v_proj)

    def separate(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([q(x), k(x), v(x)], dim=1)

    return separate


def _mlp_op(mlp: torch.nn.Module) -> Op:
    projections = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(mlp, "act_fn", None)
    if any(p is None for p in projections) or not isinstance(act, (torch.nn.SiLU, SiLUActivation)):
        return mlp
    down = _linear_op(projections[2])
    fused = getattr(mlp, "gate_up_proj", None)
    if fused is not None:
        gate_up, width = _linear_op(fused), projections[0].out_features

        def fused_gated_silu(x: torch.Tensor) -> torch.Tensor:
            both = gate_up(x)
            return down(F.silu(both[:, :width]) * both[:, width:])

        return fused_gated_silu
    gate, up = _linear_op(projections[0]), _linear_op(projections[1])

    def gated_silu(x: torch.Tensor) -> torch.Tensor:
        return down(F.silu(gate(x)) * up(x))

    return gated_silu
