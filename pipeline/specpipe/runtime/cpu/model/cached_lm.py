"""A causal LM that keeps the KV cache of one token sequence, so that each forward pass only
processes new tokens and rejected tokens can be dropped from the end (a chain) or a rejected part of a
token tree can be compacted away.

:class:`CachedLM` is the one place that runs a decoder over its KV cache: engines and drafters call its
methods and never the decoder or the cache directly."""

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

    Attributes:
        capture_layers: decoder layers whose outputs :meth:`hidden` also returns (an EAGLE-3 drafter's
            :attr:`~specpipe.runtime.cpu.drafters.eagle3.Eagle3TreeDrafter.capture_layers`; the tree engine sets it);
            ``()``: only the final hidden states.
    """

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.capture_layers: tuple[int, ...] = ()
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
    def _decode(self, token_ids: list[int], positions: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        """The decoder over ``token_ids`` after the cache (appending their keys/values): hidden ``[1, n, H]``."""
        start = self.length
        input_ids = torch.tensor([token_ids], dtype=torch.long)
        if positions is None:
            positions = torch.arange(start, start + len(token_ids), dtype=torch.long)
        kwargs = {self._cache_argument: self.cache}
        if mask is not None:
            kwargs["attention_mask"] = mask
        out = self.model.model(
            input_ids=input_ids,
            position_ids=positions.unsqueeze(0),
            use_cache=True,
            output_hidden_states=bool(self.capture_layers),
            **kwargs,
        )
        if not self.capture_layers:
            return out.last_hidden_state
        # hidden_states[0] is the embedding output, hidden_states[i + 1] decoder layer i's output
        return torch.cat([out.last_hidden_state, *(out.hidden_states[i + 1] for i in self.capture_layers)], dim=-1)

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
        hidden = self._decode(token_ids, None, None)[..., : self.model.config.hidden_size]
        if last_only:
            hidden = hidden[:, -1:]
        return self.model.lm_head(hidden)[0].float()

    @torch.inference_mode()
    def hidden(
        self, token_ids: list[int], *, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Feed ``token_ids`` after the cached tokens and return their final hidden states (after the final
        norm: the features EAGLE/Medusa heads read, and the input of :meth:`project`).

        Args:
            token_ids: n >= 1 token ids, appended to the cache.
            positions: int64 ``[n]`` position ids; default ``length .. length + n - 1`` (a chain). A token
                tree passes ``root position + depth``.
            mask: bool ``[1, 1, n, length + n]`` (True = may attend), or ``None`` for causal attention
                (a tree passes :func:`~specpipe.runtime.cpu.verify.tree_accept.tree_attention`'s mask).

        Returns:
            float ``[n, H]`` hidden states in the model's dtype; with :attr:`capture_layers` ``[n, (1 + k) H]``:
            the final ones, then each captured layer's output.
        """
        return self._decode(token_ids, positions, mask)[0]

    @torch.inference_mode()
    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[n, vocab]`` of hidden states ``[n, H]`` (the target's ``lm_head``; wide rows of
        :meth:`hidden` are read up to ``H``)."""
        return self.model.lm_head(hidden[..., : self.model.config.hidden_size].contiguous()).float()

    def keep_path(self, context: int, path: list[int]) -> None:
        """After a tree forward, keep the cached context, the root and the accepted nodes, contiguous.

        Args:
            context: cached tokens before the root (the root is at cache index ``context``; the tree's
                N nodes follow it, node i at ``context + 1 + i``).
            path: accepted node indices, root to leaf; their keys/values move to ``context + 1 ..`` and
                everything after them is dropped.
        """
        keep_len = context + 1 + len(path)
        moved = [context + 1 + i for i in path]
        needs_move = moved != list(range(context + 1, keep_len))
        for layer in self.cache.layers:
            if needs_move:
                index = torch.tensor(moved, dtype=torch.long)
                layer.keys[:, :, context + 1 : keep_len] = layer.keys.index_select(2, index)
                layer.values[:, :, context + 1 : keep_len] = layer.values.index_select(2, index)
            layer.keys = layer.keys[:, :, :keep_len]
            layer.values = layer.values[:, :, :keep_len]

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (no-op when the cache is not longer)."""
        excess = self.length - length
        if excess > 0:
            self.cache.crop(-excess)
