"""What tree drafters (Medusa, EAGLE) share: their base on the proposer protocol, a static tree laid out
for drafting, top-k candidate selection, and reading a heads file for a loaded target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specpipe.heads_format import COMPACT_FILES, check_for_target, load_compact
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.proposer import Proposer
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree
from specpipe.tree import Tree


class TreeDrafter(Proposer):
    """A :class:`~specpipe.runtime.cpu.drafters.proposer.Proposer` of token trees over the target's features
    (Medusa, EAGLE): :meth:`commit` gets the target's final hidden states (after the final norm) of the
    positions just added to its cache; :meth:`propose` returns the tree below the newest token.

    Attributes:
        max_depth: deepest tree the drafter can fill (``None``: unbounded).
    """

    reads_features = True
    trees = True
    max_depth: int | None = None

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        """``features``: float ``[n, H]`` for the last n cached positions (those added since the last call)."""

    def propose(
        self, context_ids: list[int], max_nodes: int, max_depth: int, sampler: TokenSampler | None = None
    ) -> DraftTree:
        """The tree below ``context_ids[-1]``: at most ``max_nodes`` nodes, at most ``max_depth`` deep
        (``sampler`` unused: tree drafts are deterministic)."""
        raise NotImplementedError

    def node_depths(self, max_nodes: int, latest: list[int] | None) -> list[int]:
        """A tree whose shape changes (no static tree): the latest tree's depths, then an even spread of
        ``max_nodes`` over the depth limit (:attr:`max_depth`, else ``max_nodes``)."""
        return spread_depths(max_nodes, self.max_depth or max_nodes, latest)


def spread_depths(max_nodes: int, limit: int, latest: list[int] | None) -> list[int]:
    """Depths of ``max_nodes`` nodes of a dynamic tree ``limit`` deep: the latest tree's (``latest``), then
    an even spread over the levels, never shallower than the latest tree's deepest node."""
    width = max(1, max_nodes // max(limit, 1))
    spread = [min(limit, 1 + i // width) for i in range(max_nodes)]
    latest = latest or []
    return latest + [max(latest[-1] if latest else 1, d) for d in spread[len(latest) :]]


@dataclass(frozen=True)
class StaticTree:
    """A :class:`~specpipe.tree.Tree` laid out for drafting: nodes breadth-first (parents before children).

    Attributes:
        paths: the path of each node (ranks per depth).
        parents: parent node index per node, ``-1`` for children of the root.
        depths: depth per node (1 for children of the root).
        ranks: candidate rank of each node among its parent's candidates (``path[-1]``).
        depth: the deepest node's depth; max_rank: candidates needed per node (1 + the highest rank).
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    depth: int
    max_rank: int

    @classmethod
    def of(cls, tree: Tree) -> "StaticTree":
        """Lay out ``tree`` (any node order) breadth-first, by depth then path."""
        ordered = tree.breadth_first()
        return cls(
            paths=ordered.paths,
            parents=ordered.parents,
            depths=tuple(len(p) for p in ordered.paths),
            ranks=tuple(p[-1] for p in ordered.paths),
            depth=ordered.depth,
            max_rank=ordered.max_rank,
        )

    @property
    def num_nodes(self) -> int:
        """Draft tokens in the tree."""
        return len(self.paths)


def topk_ids(logits: torch.Tensor, k: int, lm: ReducedLMHead) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best draft-vocabulary entries per row of ``logits`` ``[n, V']``: (int64 target ids ``[n, k]``,
    float32 log-probabilities ``[n, k]``), best first (k is capped at ``V'``)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, index = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return lm.to_target_ids(index), values


@dataclass
class HeadsFile:
    """A heads file read for a loaded target.

    Attributes:
        path: the compact file.
        tensors: the heads' tensors as float32 (``draft_vocab`` removed).
        meta: its metadata (``hidden_size``, ``vocab_size``, ``num_heads``, ``num_layers`` ...).
        lm: the target's lm_head over the draft vocabulary (prepacked where oneDNN allows).
    """

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    lm: ReducedLMHead


def read_heads(
    draft_dir: Path, method: str, target, *, draft_vocab: bool, prepack: bool = True, dtype: torch.dtype = torch.float32
) -> HeadsFile:
    """Read ``draft_dir``'s compact ``method`` file (:data:`~specpipe.heads_format.COMPACT_FILES`) for
    ``target`` (a ``LlamaForCausalLM``, whose lm_head the heads share).

    Args:
        draft_vocab: score the file's reduced vocabulary (if it has one) rather than the full one.
        prepack: score with a prepacked oneDNN copy of the lm_head rows (inference only).
        dtype: the drafts' dtype (the reduced lm_head's; the caller casts the heads).

    Raises:
        SpecpipeError: a missing or corrupt file, or one of another method.
        CompatibilityError: heads trained for another target (hidden size or vocabulary).
    """
    path = Path(draft_dir) / COMPACT_FILES[method]
    tensors, meta = load_compact(path, method)
    check_for_target(meta, target.config, path)
    vocab = tensors.pop("draft_vocab", None)
    if vocab is not None and not draft_vocab:
        vocab = None
    lm = ReducedLMHead(target.get_output_embeddings().weight, vocab, dtype=dtype)
    if prepack:
        lm.prepack()
    return HeadsFile(path, {k: v.float() for k, v in tensors.items()}, meta, lm)
