"""Chain drafters: cheap proposers of a chain of tokens that the target model then verifies in one forward pass.

They serve the scheduler through the one :class:`~specpipe.runtime.cpu.drafters.proposer.Proposer` protocol,
their chain as a one-child tree: a :class:`Drafter` implements :meth:`Drafter.propose_chain` (the chain and,
for sampled drafts, its distributions) and :meth:`Drafter.commit` drops the state of rejected tokens.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specpipe.runtime.cpu.drafters.proposer import Proposer
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.runtime.cpu.verify.accept import chain_tree
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree
from specpipe.speculative import NGRAM_MATCH_DEFAULT


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distributions they were drawn from.

    Attributes:
        tokens: K proposed token ids (K may be below the requested k, or 0).
        probs: float32 ``[K, vocab]`` processed draft distributions q for sampled drafts; ``None`` when
            the tokens were chosen deterministically (q is one-hot on each token; also greedy mode).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


class Drafter(Proposer, ABC):
    """A :class:`~specpipe.runtime.cpu.drafters.proposer.Proposer` of chains: its proposal is the chain of
    :meth:`propose_chain` as a one-child tree; it reads no target features."""

    @abstractmethod
    def propose_chain(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        """Propose up to ``k`` tokens to follow ``context_ids``.

        Args:
            context_ids: the committed context, prompt + output; it extends the previous call's context.
            k: most tokens to propose (>= 1).
            sampler: the request's token choice (processing, greedy or sampling, generator).
        """

    def propose(
        self, context_ids: list[int], max_nodes: int, max_depth: int, sampler: TokenSampler | None = None
    ) -> DraftTree:
        """:meth:`propose_chain`'s first ``min(max_nodes, max_depth)`` tokens as a chain tree."""
        k = min(max_nodes, max_depth)
        return chain_tree(self.propose_chain(context_ids, k, sampler).tokens[:k])


class NoDrafter(Drafter):
    """Proposes nothing: the engine decodes one token per target forward (the baseline)."""

    def propose_chain(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        return Draft([])


class NgramDrafter(Drafter):
    """Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"): copy the tokens that followed the
    most recent earlier occurrence of the context's last n tokens, for n from
    ``max_matching_ngram_size`` down to 1.

    Unlike the leftmost match of Hugging Face's ``prompt_lookup_num_tokens``, the most recent occurrence
    is used (it was accepted more often in our measurements). Proposals are deterministic, so q is
    one-hot. An index from each n-gram to its latest start is extended incrementally, so a proposal
    costs O(max_matching_ngram_size) dictionary look-ups.
    """

    def __init__(self, max_matching_ngram_size: int = NGRAM_MATCH_DEFAULT):
        if max_matching_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be >= 1, got {max_matching_ngram_size}")
        self.max_matching_ngram_size = max_matching_ngram_size
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        # _latest_start[n - 1]: n-gram -> latest start index among occurrences followed by a token.
        self._latest_start: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_matching_ngram_size)]
        self._indexed_ends = 0

    def propose_chain(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        self._index(context_ids)
        longest = min(self.max_matching_ngram_size, len(context_ids) - 1)
        for n in range(longest, 0, -1):
            start = self._latest_start[n - 1].get(tuple(context_ids[-n:]))
            if start is not None:
                return Draft(context_ids[start + n : start + n + k])
        return Draft([])

    def _index(self, context_ids: list[int]) -> None:
        """Index the n-grams ending before the last token (those with a following token)."""
        for end in range(self._indexed_ends, len(context_ids) - 1):
            for n in range(1, min(self.max_matching_ngram_size, end + 1) + 1):
                self._latest_start[n - 1][tuple(context_ids[end - n + 1 : end + 1])] = end - n + 1
        self._indexed_ends = max(self._indexed_ends, len(context_ids) - 1)


class DraftModelDrafter(Drafter):
    """Draft-target speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a smaller causal LM
    with the target's vocabulary proposes k tokens autoregressively, each chosen like the target's
    (argmax, or a sample from the processed draft distribution q).

    The draft KV cache only ever holds committed tokens once a step is verified: rejected drafts are
    cropped in :meth:`commit`. Tokens it has not seen yet (the target's new token, and the last draft
    when all were accepted) are fed together in the next proposal's first forward pass.

    Args:
        draft_model: a ``LlamaForCausalLM``-style model with the target's vocabulary size, in eval mode.
    """

    def __init__(self, draft_model: PreTrainedModel):
        self.lm = CachedLM(draft_model)
        self.vocab_size = self.lm.vocab_size
        self._cached_ids: list[int] = []

    def reset(self, prompt_ids: list[int]) -> None:
        self.lm.reset()
        self._cached_ids = []

    def fork(self) -> "DraftModelDrafter":
        """A drafter for one request: the same draft model behind a KV cache of its own."""
        clone = copy.copy(self)
        clone.lm = CachedLM(self.lm.model)
        clone._cached_ids = []
        clone.reset([])
        return clone

    def draft_models(self) -> list[torch.nn.Module]:
        return [self.lm.model]

    def propose_chain(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        self._keep_common_prefix(context_ids)
        unseen = context_ids[len(self._cached_ids) :]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.lm.forward(unseen, last_only=True)
            self._cached_ids.extend(unseen)
            token, distribution = sampler.choose(logits)
            tokens.append(token)
            if distribution is not None:
                probs.append(distribution)
            unseen = [token]
        return Draft(tokens, torch.cat(probs) if probs else None)

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._keep_common_prefix(context_ids)

    def catch_up(self, context_ids: list[int]) -> None:
        self._keep_common_prefix(context_ids)
        unseen = context_ids[len(self._cached_ids) : -1]  # the newest token stays unseen: propose's first input
        if unseen:
            self.lm.hidden(unseen)
            self._cached_ids.extend(unseen)

    def _keep_common_prefix(self, context_ids: list[int]) -> None:
        """Crop the cache to its longest prefix that agrees with ``context_ids``, leaving at least one
        context token unseen (a forward pass needs an input)."""
        keep = min(len(self._cached_ids), len(context_ids) - 1)
        if context_ids[:keep] != self._cached_ids[:keep]:
            keep = next(i for i in range(keep) if context_ids[i] != self._cached_ids[i])
        self.lm.truncate(keep)
        del self._cached_ids[keep:]
