"""Speculation trees (``eagle_choices`` / ``medusa_choices``): parsing and the facts checks need.

A tree is a list of paths; ``[0, 1]`` is the second-best candidate after the best first token. The
depth is the longest path, the node count the number of paths (= draft tokens verified per step).

Source of the default tree: ``mc_sim_7b_63``, the tree TensorRT-LLM and the Triton backend use when
no choices are given (TensorRT-LLM ``examples/eagle/README.md`` @ 585c756579dc4d01f21fc13c2f604cdb461ac4f0,
which lists it in full; Medusa's ``medusa_choices.py`` is its origin).
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

from specpipe.errors import CompatibilityError

MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0),
    (0, 5), (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0),
    (0, 9), (8,), (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5),
    (0, 0, 0, 0), (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9),
    (6, 0), (0, 4, 0), (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5),
    (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

NAMED_TREES = {"mc_sim_7b_63": MC_SIM_7B_63}


@dataclass(frozen=True)
class Tree:
    """A speculation tree and its shape: ``depth`` (levels), ``nodes`` (draft tokens),
    ``max_non_leaves`` (most nodes with children on one level)."""

    paths: tuple[tuple[int, ...], ...]

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def nodes(self) -> int:
        return len(self.paths)

    @property
    def max_non_leaves(self) -> int:
        parents = {p[:-1] for p in self.paths if len(p) > 1}
        per_level = Counter(len(p) for p in parents)
        return max(per_level.values(), default=0)

    def as_text(self) -> str:
        """The ``{0, 0}, {0, 1}``-free list syntax: ``[[0], [0, 0], ...]``."""
        return "[" + ", ".join("[" + ", ".join(str(i) for i in p) + "]" for p in self.paths) + "]"


def parse_tree(text: str) -> Tree:
    """Parse a tree given as a Python-literal list of paths or a named tree (``mc_sim_7b_63``).

    Raises:
        CompatibilityError: not a non-empty list of non-empty integer paths, a duplicate path, or a
            path whose parent is missing.
    """
    if text in NAMED_TREES:
        return Tree(NAMED_TREES[text])
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise CompatibilityError(f"--choices {text!r} is not a list of paths such as '[[0], [0, 0], [1]]'") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise CompatibilityError(f"--choices must be a non-empty list of paths, got {text!r}")
    paths: list[tuple[int, ...]] = []
    for item in value:
        if not isinstance(item, (list, tuple)) or not item or not all(isinstance(i, int) and i >= 0 for i in item):
            raise CompatibilityError(f"--choices: {item!r} is not a non-empty path of non-negative integers")
        paths.append(tuple(item))
    if len(set(paths)) != len(paths):
        raise CompatibilityError("--choices lists a path twice: every path must be unique")
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise CompatibilityError(f"--choices: path {list(p)} has no parent {list(p[:-1])} in the tree: add it")
    return Tree(tuple(paths))
