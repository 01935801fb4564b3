"""Tiny randomly initialised Llama models, for tests that must run without downloads."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(
    seed: int = 0,
    *,
    vocab_size: int = 64,
    num_layers: int = 2,
    hidden_size: int = 32,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 512,
    init_std: float = 0.5,
    eos_token_id: int | None = None,
    tie_word_embeddings: bool = False,
) -> LlamaForCausalLM:
    """A small fp32 ``LlamaForCausalLM`` in eval mode, its weights drawn from N(0, ``init_std``²) with
    ``seed`` (the global RNG state is left unchanged).

    The default ``init_std`` is far above a trained model's 0.02 so that next-token distributions are
    peaked (far from uniform) and random models differ visibly from each other. ``eos_token_id`` is
    ``None`` by default, so generation runs to ``max_tokens`` unless a request names an end id.
    ``tie_word_embeddings``: the lm_head is the input embedding (as SmolLM2's).
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=tie_word_embeddings,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()
