"""Token trees on CPU: the proposed tree and its attention mask.

A tree step (SpecInfer, Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with
Tree-based Speculative Inference and Verification"; Medusa, Cai et al. 2024, arXiv:2401.10774, §2.1.2;
EAGLE, Li et al. 2024, arXiv:2401.15077) verifies a :class:`DraftTree` in one target forward with tree
position ids and the mask of :func:`tree_attention`; :mod:`~specpipe.runtime.cpu.verify.accept` then
decides the accepted path, and the batched target compacts its keys/values
(:meth:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM.keep_paths`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class DraftTree:
    """A proposed token tree.

    Attributes:
        tokens: target token id per node (breadth-first: parents before children).
        parents: parent index per node, ``-1`` for children of the root.
    """

    tokens: list[int]
    parents: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def children(self) -> list[list[int]]:
        """Child node indices of the root (entry 0) and of each node (entry i + 1), in node order."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    def row_paths(self) -> list[list[int]]:
        """Per row of a tree verification (the root, then each node): the draft tokens between the
        committed history and that row, ``[]`` for the root, then each node's ancestors' tokens and
        its own (the history that penalties and ``min_tokens`` see at that row)."""
        paths: list[list[int]] = [[]]
        for token, parent in zip(self.tokens, self.parents):
            paths.append([*paths[parent + 1], token])
        return paths

    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it (a chain, or no nodes)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def first_children(self) -> "DraftTree":
        """The chain that follows, from the root, each node's first child (the drafters list a node's
        children most likely first). Its rows verify with the keys of a plain causal chain, laid out as
        plain decoding lays them out, so their logits are bitwise those of plain decoding, which a seeded
        sampled request needs; a wider tree's rows interleave masked siblings among their keys, which
        changes the attention's rounding."""
        kids, path, node = self.children(), [], -1
        while kids[node + 1]:
            node = kids[node + 1][0]
            path.append(node)
        return DraftTree([self.tokens[i] for i in path], list(range(-1, len(path) - 1)))

    def prune(self, max_depth: int, max_nodes: int | None = None) -> "DraftTree":
        """Drop nodes deeper than ``max_depth`` and, breadth-first, those past ``max_nodes``."""
        depths = self.depths()
        keep = [i for i in range(len(self.tokens)) if depths[i] <= max_depth]
        if max_nodes is not None:
            keep = keep[:max_nodes]
        new_index = {old: new for new, old in enumerate(keep)}
        return DraftTree(
            [self.tokens[i] for i in keep], [new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep]
        )


def tree_attention(parents: Sequence[int], context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and position offsets of ``[root, node_1 .. node_N]`` after ``context`` cached tokens.

    The tree part (who sees whom among root and nodes) depends only on ``parents`` and is computed once
    per tree shape (:func:`_tree_part`, cached: a static tree has one shape), the context part is a block
    of ones.

    Returns:
        bool ``[1, 1, N + 1, context + N + 1]`` (True = may attend): every row sees the cached context,
        the root, its ancestors and itself; and int64 ``[N + 1]`` depths (0 for the root), to add to
        the root's position.
    """
    tree, depth = _tree_part(tuple(parents))
    allow = torch.cat([torch.ones(tree.shape[0], context, dtype=torch.bool), tree], dim=1)
    return allow[None, None], depth


@functools.lru_cache(maxsize=256)
def _tree_part(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """bool ``[N + 1, N + 1]`` (root and nodes: ancestors and self) and int64 ``[N + 1]`` depths."""
    n = len(parents)
    allow = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allow[:, 0] = True
    depth = torch.zeros(n + 1, dtype=torch.long)
    for i, p in enumerate(parents):
        row = i + 1
        if p >= 0:
            allow[row, 1:] = allow[p + 1, 1:]
        allow[row, row] = True
        depth[row] = depth[p + 1] + 1
    return allow, depth
