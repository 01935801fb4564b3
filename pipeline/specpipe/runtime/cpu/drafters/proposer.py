"""The one protocol every drafter serves the batch scheduler through: :class:`Proposer`.

A chain of drafts is a token tree whose every node has one child, so every drafter proposes a
:class:`~specpipe.runtime.cpu.verify.tree_accept.DraftTree` (vLLM v1 proposers and Hugging Face's
``CandidateGenerator`` take the same view of a chain; EAGLE and Medusa propose wider trees). Per request
(:meth:`Proposer.fork` of the deployment's template): :meth:`~Proposer.reset` with the prompt; each step
that drafts, :meth:`~Proposer.catch_up` then :meth:`~Proposer.propose`; after the prefill and after each
verification, :meth:`~Proposer.commit` with the committed context and, where :attr:`~Proposer.reads_features`,
the target's features of the positions just added to its cache.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree


class Proposer(ABC):
    """Proposes the draft tokens a request verifies in a step, as a token tree (a chain: one child each).

    Attributes:
        vocab_size: the vocabulary a draft model scores (must equal the target's), ``None`` where the
            drafter scores the target's own.
        reads_features: :meth:`commit` needs the target's final hidden states of the committed positions
            (EAGLE, Medusa); otherwise it gets ``None`` and the scheduler keeps no features for it.
        trees: proposals may branch (a deployment of this drafter may accept sampled requests by Medusa's
            typical rule); ``False``: every proposal is a chain.
        capture_layers: target layers whose outputs :meth:`commit`'s features must carry after the final
            hidden state (EAGLE-3's fused features), ``()`` for none.
    """

    vocab_size: int | None = None
    reads_features: bool = False
    trees: bool = False
    capture_layers: tuple[int, ...] = ()

    def reset(self, prompt_ids: list[int]) -> None:
        """Forget the previous request; a new one starts with ``prompt_ids``."""

    def fork(self) -> "Proposer":
        """A drafter for one request: shares this one's weights, owns its per-request state (reset)."""
        clone = copy.copy(self)
        clone.reset([])
        return clone

    def catch_up(self, context_ids: list[int]) -> None:
        """Bring the drafter's own state up to ``context_ids`` before a :meth:`propose` (a draft model or an
        EAGLE head caches the committed tokens it has not seen yet), so that the proposal's time depends on
        the draft only; the scheduler times the two apart. Optional: :meth:`propose` catches up itself."""

    @abstractmethod
    def propose(
        self, context_ids: list[int], max_nodes: int, max_depth: int, sampler: TokenSampler | None = None
    ) -> DraftTree:
        """The draft tree below ``context_ids[-1]``, nodes breadth-first (parents before children).

        Args:
            context_ids: the committed context, prompt + output; it extends the previous call's context.
            max_nodes: most nodes (>= 1); max_depth: most levels (a chain's ``max_nodes``).
            sampler: the request's token choice (a draft model draws its tokens with it; a drafter of
                deterministic proposals ignores it).

        Returns:
            at most ``max_nodes`` nodes at most ``max_depth`` deep (possibly none).
        """

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        """The scheduler committed ``context_ids`` (previous context + accepted drafts + one target token).

        Args:
            features: with :attr:`reads_features`, float ``[n, H]`` (``[n, (1 + k) H]`` with
                :attr:`capture_layers`) for the n positions added to the target's cache since the last
                call; else ``None``.
        """

    def node_depths(self, max_nodes: int, latest: list[int] | None) -> list[int]:
        """The depth of each node the next proposal may hold, in node order, at most ``max_nodes``
        (the planner chooses how many of them to verify). A chain: ``1 .. max_nodes``.

        Args:
            latest: the depths of the latest proposal's nodes, ``None`` before the first.
        """
        return list(range(1, max_nodes + 1))

    def draft_models(self) -> list[torch.nn.Module]:
        """The drafter's own causal LMs (a draft model), whose decoder layers may keep dense weight copies."""
        return []
