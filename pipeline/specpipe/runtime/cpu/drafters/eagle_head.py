"""The EAGLE draft head (model code, CPU, PyTorch).

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
arXiv:2401.15077): an autoregressive head over features. The input at position t is
``fc(concat(embed(x_{t+1}), f_t))`` (embedding first), followed by one Llama decoder layer without its
input RMSNorm; the output predicts the target's next feature f_{t+1}, which the target's lm_head turns
into logits for x_{t+2} (no final norm: features are already post-norm). Drafting a tree
(:mod:`specpipe.runtime.cpu.drafters.eagle`) feeds the head its own predicted features, with its own small KV cache.

Tensor names follow the layout TensorRT-LLM's EAGLE converter reads (see :mod:`specpipe.heads_format`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Llama RMSNorm: ``w * x / sqrt(mean(x^2) + eps)`` over the last dimension (computed in fp32)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, head_dim]`` for int64 ``positions`` ``[T]`` (Llama / GPT-NeoX rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, T, D]`` by cos/sin ``[T, D]`` (or ``[B, 1, T, D]``), in ``x``'s dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class EagleConfig:
    """Shape of an EAGLE head (Llama-style; the target's own sizes)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int

    @classmethod
    def from_target(cls, config) -> "EagleConfig":
        """From a Hugging Face ``LlamaConfig`` of the target."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=float(theta),
            vocab_size=config.vocab_size,
            max_position_embeddings=config.max_position_embeddings,
        )


class _Attention(nn.Module):
    def __init__(self, c: EagleConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, past_k=None, past_v=None, mask=None):
        b, t, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        groups = c.num_attention_heads // c.num_key_value_heads
        kk, vv = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, kk, vv, is_causal=past_k is None and t > 1)
        else:
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, t, c.num_attention_heads * c.head_dim)
        return self.o_proj(out), k, v


class _MLP(nn.Module):
    def __init__(self, c: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _EagleLayer(nn.Module):
    """A Llama decoder layer without the input RMSNorm (EAGLE's first layer)."""

    def __init__(self, c: EagleConfig):
        super().__init__()
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)

    def forward(self, x, cos, sin, past_k=None, past_v=None, mask=None):
        attn, k, v = self.self_attn(x, cos, sin, past_k, past_v, mask)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class EagleHead(nn.Module):
    """EAGLE-1 draft head: ``fc`` [H, 2H] + bias, and ``layers.0`` (one decoder layer).

    The token embedding and lm_head are the target's (passed in, never trained or stored here).
    State-dict names match the EAGLE authors' checkpoints (``fc.weight``, ``fc.bias``,
    ``layers.0.self_attn.q_proj.weight`` ...), which TensorRT-LLM's EAGLE converter reads.
    """

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers = nn.ModuleList([_EagleLayer(config)])

    def reset_parameters(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Training start: the layer's projections N(0, std^2) (small, so the layer starts close to the
        identity through its residual connections), norms at 1, and ``fc`` taking the feature half
        (``fc(concat(e, f)) = f``), so the head first predicts f_{t+1} = f_t and learns the change."""
        with torch.no_grad():
            for module in self.layers[0].modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std, generator=generator)
            self.layers[0].post_attention_layernorm.weight.fill_(1.0)
            h = self.config.hidden_size
            self.fc.weight.normal_(0.0, std, generator=generator)
            self.fc.weight[:, h:] += torch.eye(h)
            self.fc.bias.zero_()

    def forward(
        self,
        features: torch.Tensor,
        token_embeds: torch.Tensor,
        positions: torch.Tensor,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass of the head.

        Args:
            features: float ``[B, T, H]``: f_t, the target's (or the head's own predicted) features.
            token_embeds: float ``[B, T, H]``: embeddings of x_{t+1}, the token that follows position t.
            positions: int64 ``[T]``: rotary positions of the inputs.
            past_k, past_v: ``[B, kv_heads, S, head_dim]`` keys/values of earlier inputs, or ``None``.
            mask: bool ``[B or 1, 1, T, S + T]`` (True = may attend), or ``None`` for causal attention
                over the T inputs after all S past entries.

        Returns:
            predicted features ``[B, T, H]`` (f_{t+1}), and the keys/values ``[B, kv_heads, S + T, D]``
            including the new entries.
        """
        x = self.fc(torch.cat([token_embeds, features], dim=-1))
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        if mask is None and past_k is not None and x.shape[1] > 1:
            s, t = past_k.shape[2], x.shape[1]
            mask = torch.ones(t, s + t, dtype=torch.bool).tril(diagonal=s)[None, None]
        return self.layers[0](x, cos, sin, past_k, past_v, mask)
