"""A static draft tree laid out once as index tensors, so that drafting it level by level (EAGLE) needs
no Python loop per node: which nodes a level expands, where their parents' features are, which draft-cache
entries each may attend to, and where each child's token comes from in the level's top-k table.

Built once per (tree, depth limit) and cached (:func:`static_levels`); drafting then runs a handful of
tensor ops per level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from specpipe.runtime.cpu.drafters.tree_drafter import StaticTree


@dataclass(frozen=True)
class Level:
    """One expansion step of a static tree (the nodes of one depth that have children).

    Attributes:
        nodes: int64 ``[L]`` the expanded nodes (breadth-first indices).
        parent_feature: int64 ``[L]`` row of each node's parent feature in the features table (row 0: the
            root's predicted feature; row ``1 + s``: the feature predicted by draft-cache slot ``s``).
        visible: bool ``[L, S]`` which of the ``S`` draft-cache slots written by earlier levels each node
            attends to (its ancestors').
        child_nodes: int64 ``[C]`` the nodes whose tokens this level's predictions choose.
        child_rows: int64 ``[C]`` each child's parent row in this level (``0 .. L-1``).
        child_ranks: int64 ``[C]`` each child's candidate rank among its parent's top-k.
    """

    nodes: torch.Tensor
    parent_feature: torch.Tensor
    visible: torch.Tensor
    child_nodes: torch.Tensor
    child_rows: torch.Tensor
    child_ranks: torch.Tensor


@dataclass(frozen=True)
class StaticLevels:
    """The whole plan: the root's children (nodes and ranks, chosen from the root's top-k) and the levels."""

    first_nodes: torch.Tensor
    first_ranks: torch.Tensor
    levels: tuple[Level, ...]


def _long(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long)


@functools.lru_cache(maxsize=32)
def static_levels(tree: StaticTree, depth: int) -> StaticLevels:
    """The plan of ``tree`` drafted ``depth`` levels deep (nodes deeper than ``depth`` are left out)."""
    parents, depths, ranks = tree.parents, tree.depths, tree.ranks
    has_children = {p for i, p in enumerate(parents) if p >= 0 and depths[i] <= depth}
    first = [i for i in range(tree.num_nodes) if depths[i] == 1]
    slot: dict[int, int] = {}
    levels = []
    for d in range(1, depth):
        level = [i for i in range(tree.num_nodes) if depths[i] == d and i in has_children]
        if not level:
            break
        base = len(slot)
        visible = torch.zeros(len(level), base, dtype=torch.bool)
        for row, node in enumerate(level):
            p = parents[node]
            while p >= 0:
                visible[row, slot[p]] = True
                p = parents[p]
        feature = [0 if parents[i] < 0 else 1 + slot[parents[i]] for i in level]
        for row, node in enumerate(level):
            slot[node] = base + row
        row_of = {node: row for row, node in enumerate(level)}
        children = [j for j in range(tree.num_nodes) if depths[j] == d + 1 and parents[j] in row_of]
        levels.append(
            Level(
                _long(level),
                _long(feature),
                visible,
                _long(children),
                _long(row_of[parents[j]] for j in children),
                _long(ranks[j] for j in children),
            )
        )
    return StaticLevels(_long(first), _long(ranks[i] for i in first), tuple(levels))


def draft_mask(context: int, visible: torch.Tensor) -> torch.Tensor:
    """Attention mask bool ``[1, 1, L, context + S + L]`` of L draft inputs over ``context`` stable
    entries (all visible), ``S`` earlier draft entries (``visible`` ``[L, S]``) and themselves (diagonal)."""
    rows = visible.shape[0]
    return torch.cat([torch.ones(rows, context, dtype=torch.bool), visible, torch.eye(rows, dtype=torch.bool)], dim=1)[
        None, None
    ]
