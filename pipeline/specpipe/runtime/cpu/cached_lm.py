"""A causal LM that keeps the KV cache of one token sequence, so that each forward pass only
processes new tokens and rejected tokens can be dropped from the end."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel


def _cache_argument_name(decoder: torch.nn.Module) -> str:
    # transformers 5.x renamed the decoder's `past_key_values` argument to `cache`.
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class CachedLM:
    """Runs a Llama-style causal LM (``model.model`` decoder + ``model.lm_head``) over one sequence
    with a KV cache.

    The cache holds the keys/values of the first :attr:`length` tokens of the sequence; a forward pass
    appends its tokens at positions ``length .. length + n - 1``; :meth:`truncate` drops tokens from the
    end (speculative rollback). Not thread-safe: one sequence at a time.
    """

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self._cache_argument = _cache_argument_name(model.model)
        self.cache = DynamicCache(config=model.config)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def length(self) -> int:
        """Tokens whose keys/values are in the cache."""
        return self.cache.get_seq_length()

    def reset(self) -> None:
        """Empty the cache (start of a new sequence)."""
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], *, last_only: bool = False) -> torch.Tensor:
        """Feed ``token_ids`` after the cached tokens and return their next-token logits.

        Args:
            token_ids: n >= 1 token ids, appended to the cache.
            last_only: project only the last hidden state through ``lm_head`` (prefill, drafting).

        Returns:
            float32 logits of shape ``[n, vocab]`` (``[1, vocab]`` with ``last_only``); row i scores the
            token that follows ``token_ids[i]``.
        """
        start = self.length
        input_ids = torch.tensor([token_ids], dtype=torch.long)
        positions = torch.arange(start, start + len(token_ids), dtype=torch.long).unsqueeze(0)
        hidden = self.model.model(
            input_ids=input_ids,
            position_ids=positions,
            use_cache=True,
            **{self._cache_argument: self.cache},
        ).last_hidden_state
        if last_only:
            hidden = hidden[:, -1:]
        return self.model.lm_head(hidden)[0].float()

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (no-op when the cache is not longer)."""
        excess = self.length - length
        if excess > 0:
            self.cache.crop(-excess)
