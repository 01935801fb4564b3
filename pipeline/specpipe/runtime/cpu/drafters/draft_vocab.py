"""The draft vocabulary: the target's most frequent tokens, which draft heads score instead of all of them.

As in FR-Spec (Zhao et al. 2025, arXiv:2502.14856) and EAGLE-3's ``d2t`` map. The 49152 x 576 lm_head of
SmolLM2 costs about 10 ms per row on 2 CPU cores; 8192 rows cost a sixth of that. Drafted ids are always
target ids, so verification is unchanged. Training picks the list (:func:`frequent_tokens`); the heads
file carries it (``draft_vocab``, int64 target ids).
"""

from __future__ import annotations

import math

import torch

from specpipe.runtime.cpu.model.prepack import PrepackedLinear, bf16_prepack_available, prepack_available


class ReducedLMHead:
    """The target's lm_head restricted to a draft vocabulary (frozen; fp32, or bf16 for cheaper drafts).

    Args:
        weight: float ``[V, H]`` the target's lm_head weight.
        draft_vocab: int64 ``[V']`` target ids scored by the draft, or ``None`` for all ``V``.
        dtype: the scoring dtype (``torch.bfloat16`` halves the bytes streamed per draft step; drafts are
            proposals, the target verifies in fp32, so greedy output is unchanged).
    """

    def __init__(
        self, weight: torch.Tensor, draft_vocab: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
    ):
        # a copy: the list may view a heads file's memory map, which would keep the whole file resident
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(torch.long).clone()
        w = weight.detach()
        self.dtype = dtype
        self.weight: torch.Tensor | None = (w[draft_vocab] if draft_vocab is not None else w).to(dtype).contiguous()
        self._size = int(self.weight.shape[0])
        self._packed: PrepackedLinear | None = None

    def prepack(self) -> None:
        """Score with a prepacked oneDNN copy of the weight and drop the dense one (inference only; see
        :mod:`specpipe.runtime.cpu.model.prepack`). A no-op where oneDNN is unavailable."""
        if prepack_available() and (self.dtype == torch.float32 or bf16_prepack_available()):
            self.use_packed(PrepackedLinear.from_weight(self.weight))

    def use_packed(self, packed: PrepackedLinear) -> None:
        """Score with ``packed`` (a prepacked ``[V', H]`` layer computing these logits, e.g. the target's own
        prepacked lm_head when the draft vocabulary is the full one) and drop the dense weight."""
        if packed.out_features != self._size:
            raise ValueError(f"a packed lm_head of {packed.out_features} rows cannot score {self._size} draft tokens")
        self._packed, self.weight = packed, None

    @property
    def size(self) -> int:
        return self._size

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., V']`` logits (in :attr:`dtype`) of features ``[..., H]`` over the draft vocabulary."""
        if self._packed is not None:
            return self._packed(x)
        return x.to(self.dtype) @ self.weight.T

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary indices to target token ids."""
        return self.draft_vocab[index] if self.draft_vocab is not None else index


def frequent_tokens(labels: torch.Tensor, vocab_size: int, size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The ``size`` most frequent ids in ``labels`` (ties by id), plus ``always``, sorted by id.

    Args:
        labels: int64 token ids (e.g. the target's greedy tokens over the training corpus).
        vocab_size: ids are in ``[0, vocab_size)``.
        size: draft vocabulary size; ``>= vocab_size`` returns every id.
        always: ids to include regardless of frequency (end tokens).

    Returns:
        int64 ``[min(size, vocab_size)]`` sorted ascending.
    """
    if size >= vocab_size:
        return torch.arange(vocab_size)
    counts = torch.bincount(labels.flatten(), minlength=vocab_size).double()
    counts -= torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # stable tie-break: lower ids first
    for token in always:
        counts[token] = math.inf
    return torch.topk(counts, size).indices.sort().values
