"""The EAGLE-3 draft head (model code, CPU, PyTorch).

EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv:2503.01840) differs from EAGLE-1/2 (:mod:`specpipe.runtime.cpu.drafters.eagle_head`) in
three ways, all read from the authors' model code (SafeAILab/EAGLE ``eagle/model/cnets.py`` @ bfeb532e,
``Model`` and ``LlamaDecoderLayeremb``):

* its input feature fuses a low, a middle and a high layer of the target: ``fc`` (no bias) maps their
  concatenation ``[3H]`` to ``H``; at deeper draft steps the head's own output ``[H]`` is fed back unchanged;
* its one decoder layer (``midlayer``) normalises the token embedding (``input_layernorm``) and the feature
  (``hidden_norm``) separately and attends over their concatenation (``q/k/v_proj`` read ``2H``), with the
  feature as the residual;
* it predicts tokens, not features: ``lm_head(norm(h))`` over its own draft vocabulary of ``V'`` tokens
  (``d2t``: draft index -> target id offset, ``target = d + d2t[d]``).

The captured layers are those TensorRT-LLM's EAGLE-3 path captures by default, the outputs of decoder
layers ``(1, N // 2 - 1, N - 4)`` of an N-layer target, N > 5 (``layers_to_capture`` of
``Eagle3SpecMetadata``, tensorrt_llm/_torch/speculative/eagle3.py); they equal the inputs of layers
``(2, N // 2, N - 3)`` that the EAGLE authors' target code collects.
"""

from __future__ import annotations

import torch
from torch import nn

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.drafters.eagle_head import _MLP, EagleConfig, RMSNorm, _Attention, rope_tables


def capture_layers(num_layers: int) -> tuple[int, int, int]:
    """The target's decoder layers whose outputs an EAGLE-3 head reads: ``(1, N // 2 - 1, N - 4)``.

    Raises:
        SpecpipeError: a target of 5 decoder layers or fewer (TensorRT-LLM refuses them too).
    """
    if num_layers <= 5:
        raise SpecpipeError(
            f"EAGLE-3 heads read layers 1, N/2-1 and N-4 of the target, which has only {num_layers} "
            "decoder layers (at least 6 needed): train an EAGLE-1 head (--style eagle1)"
        )
    return 1, num_layers // 2 - 1, num_layers - 4


class _Eagle3Attention(_Attention):
    """Attention whose queries, keys and values read ``concat(norm(embedding), norm(feature))`` [2H]."""

    def __init__(self, c: EagleConfig):
        super().__init__(c)
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer over (token embedding, feature), the feature being the residual."""

    def __init__(self, c: EagleConfig):
        super().__init__()
        self.self_attn = _Eagle3Attention(c)
        self.mlp = _MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, embeds, hidden, cos, sin, past_k=None, past_v=None, mask=None):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, k, v = self.self_attn(x, cos, sin, past_k, past_v, mask)
        hidden = hidden + attn
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, k, v


class Eagle3Head(nn.Module):
    """EAGLE-3 draft head: ``fc`` [H, 3H], ``midlayer.*``, ``norm``, ``lm_head`` [V', H].

    It also scores its own drafts (:meth:`logits`, :meth:`to_target_ids`), so a drafter uses it both as
    the head and as the lm_head object of :class:`~specpipe.runtime.cpu.drafters.eagle.EagleTreeDrafter`.

    Args:
        config: the target's shape (:meth:`EagleConfig.from_target`).
        layers: the captured target layers (:func:`capture_layers`).
        draft_vocab: int64 ``[V']`` target ids the head scores, ascending.
    """

    def __init__(self, config: EagleConfig, layers: tuple[int, ...], draft_vocab: torch.Tensor):
        super().__init__()
        self.config, self.layers = config, tuple(int(i) for i in layers)
        h = config.hidden_size
        self.fc = nn.Linear(len(self.layers) * h, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, int(draft_vocab.numel()), bias=False)
        self.register_buffer("draft_vocab", draft_vocab.to(torch.long).clone(), persistent=False)

    def reset_parameters(
        self, lm_weight: torch.Tensor, std: float = 0.02, generator: torch.Generator | None = None
    ) -> None:
        """Training start: projections N(0, std^2), norms at 1, ``fc`` averaging the captured layers, and
        ``lm_head`` the target's rows of the draft vocabulary (``lm_weight`` float ``[V, H]``)."""
        h = self.config.hidden_size
        with torch.no_grad():
            for module in self.midlayer.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std, generator=generator)
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)
            self.norm.weight.fill_(1.0)
            self.fc.weight.normal_(0.0, std, generator=generator)
            for i in range(len(self.layers)):
                self.fc.weight[:, i * h : (i + 1) * h] += torch.eye(h) / len(self.layers)
            self.lm_head.weight.copy_(lm_weight.detach()[self.draft_vocab])

    def forward(
        self,
        features: torch.Tensor,
        token_embeds: torch.Tensor,
        positions: torch.Tensor,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass of the head (the interface of :meth:`EagleHead.forward`).

        Args:
            features: float ``[B, T, 3H]`` the target's fused features at positions t, or ``[B, T, H]`` the
                head's own earlier outputs (deeper draft steps).
            token_embeds: float ``[B, T, H]`` embeddings of x_{t+1}.
            positions, past_k, past_v, mask: as :meth:`EagleHead.forward`.

        Returns:
            the head's hidden states ``[B, T, H]`` (before ``norm``; fed back at the next depth), and the
            keys/values ``[B, kv_heads, S + T, head_dim]``.
        """
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        if mask is None and past_k is not None and features.shape[1] > 1:
            s, t = past_k.shape[2], features.shape[1]
            mask = torch.ones(t, s + t, dtype=torch.bool).tril(diagonal=s)[None, None]
        return self.midlayer(token_embeds, features, cos, sin, past_k, past_v, mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., V']`` logits of head outputs ``[..., H]`` over the draft vocabulary."""
        return self.lm_head(self.norm(hidden.to(self.lm_head.weight.dtype)))

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary indices to target token ids."""
        return self.draft_vocab[index]

    def d2t(self) -> torch.Tensor:
        """int64 ``[V']`` the EAGLE-3 offsets: target id of draft index d is ``d + d2t[d]``."""
        return self.draft_vocab - torch.arange(self.draft_vocab.numel())


def check_capture(features: torch.Tensor, hidden_size: int, layers: int) -> torch.Tensor:
    """The fused part ``[n, layers * H]`` of a target's wide features ``[n, (1 + layers) * H]`` (final hidden
    state first, :attr:`CachedLM.capture_layers`).

    Raises:
        SpecpipeError: features without the captured layers (the target was not told to capture them).
    """
    if features.shape[-1] != (1 + layers) * hidden_size:
        raise SpecpipeError(
            f"an EAGLE-3 drafter needs the target's final and {layers} captured hidden states "
            f"({(1 + layers) * hidden_size} values per position), got {features.shape[-1]}: run it "
            "in an engine that sets the target's capture_layers from the drafter"
        )
    return features[:, hidden_size:]
