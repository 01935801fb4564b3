"""Speculation trees (``eagle_choices`` / ``medusa_choices``): one parser, one validator, one serialiser.

A tree is a list of paths; each path lists candidate ranks per depth, so ``[0, 1]`` is the second-best
candidate after the best first token. The depth is the longest path and the node count the number of
paths (the draft tokens verified per step). This module is free of torch: the CPU runtime turns a
:class:`Tree` into tensors itself.

Accepted spellings of a tree (:meth:`Tree.parse`):

* a Python/JSON list of paths, ``[[0], [0, 0], [1]]``;
* the tensorrtllm backend's parameter text, ``{0}, {0, 0}, {1}``;
* a named tree: ``mc_sim_7b_63``, the tree TensorRT-LLM and the Triton backend use when no choices are
  given (TensorRT-LLM ``examples/eagle/README.md`` @ 585c756579dc4d01f21fc13c2f604cdb461ac4f0, which
  lists it in full; Medusa's ``medusa_choices.py`` is its origin).

The backend reads its parameter text with ``utils::csvStrToVecVecInt``
(NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/utils.cc``; the same function in
triton-inference-server/tensorrtllm_backend ``inflight_batcher_llm/src/utils.cc`` @ c2e65b8): one brace
group per path and no outer braces (``{{0}, ...}`` would leave ``{0`` for ``std::stoi``), which is what
:meth:`Tree.to_backend_text` writes.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from specpipe.errors import CompatibilityError

Path = tuple[int, ...]

MC_SIM_7B_63: tuple[Path, ...] = (
    (0,),
    (0, 0),
    (1,),
    (0, 1),
    (2,),
    (0, 0, 0),
    (1, 0),
    (0, 2),
    (3,),
    (0, 3),
    (4,),
    (0, 4),
    (2, 0),
    (0, 5),
    (0, 0, 1),
    (5,),
    (0, 6),
    (6,),
    (0, 7),
    (0, 1, 0),
    (1, 1),
    (7,),
    (0, 8),
    (0, 0, 2),
    (3, 0),
    (0, 9),
    (8,),
    (9,),
    (1, 0, 0),
    (0, 2, 0),
    (1, 2),
    (0, 0, 3),
    (4, 0),
    (2, 1),
    (0, 0, 4),
    (0, 0, 5),
    (0, 0, 0, 0),
    (0, 1, 1),
    (0, 0, 6),
    (0, 3, 0),
    (5, 0),
    (1, 3),
    (0, 0, 7),
    (0, 0, 8),
    (0, 0, 9),
    (6, 0),
    (0, 4, 0),
    (1, 4),
    (7, 0),
    (0, 1, 2),
    (2, 0, 0),
    (3, 1),
    (2, 2),
    (8, 0),
    (0, 5, 0),
    (1, 5),
    (1, 0, 1),
    (0, 2, 1),
    (9, 0),
    (0, 6, 0),
    (0, 0, 0, 1),
    (1, 6),
    (0, 7, 0),
)

NAMED_TREES: dict[str, tuple[Path, ...]] = {"mc_sim_7b_63": MC_SIM_7B_63}

_EXAMPLE = "'[[0], [0, 0], [1]]' (or '{0}, {0, 0}, {1}', or a named tree: mc_sim_7b_63)"


class TreeError(CompatibilityError):
    """A choices tree that is malformed or does not fit the draft (depth, node count)."""


@dataclass(frozen=True)
class Tree:
    """A speculation tree: its paths in the order given, and the facts checks and runtimes need.

    Attributes:
        paths: the path of each node (candidate ranks per depth), in the order given.
    """

    paths: tuple[Path, ...]

    @classmethod
    def parse(cls, value: "str | Sequence[Sequence[int]] | Tree", *, what: str = "--choices") -> "Tree":
        """Parse and validate a tree given as text (see the module docstring) or as a list of paths.

        Args:
            value: the tree.
            what: how error messages name the input (``--choices``, ``eagle_choices`` ...).

        Raises:
            TreeError: not a non-empty list of non-empty paths of non-negative integers (``True`` is no
                integer here), a path listed twice, or a path whose parent path is missing.
        """
        if isinstance(value, Tree):
            return value
        if isinstance(value, str):
            if value.strip() in NAMED_TREES:
                return cls(NAMED_TREES[value.strip()])
            value = _literal(value, what)
        if not isinstance(value, (list, tuple)) or not value:
            raise TreeError(f"{what} must be a non-empty list of paths such as {_EXAMPLE}, got {value!r}")
        paths: list[Path] = []
        for item in value:
            if (
                not isinstance(item, (list, tuple))
                or not item
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in item)
            ):
                raise TreeError(f"{what}: path {item!r} is not a non-empty list of non-negative integers")
            paths.append(tuple(item))
        if len(set(paths)) != len(paths):
            raise TreeError(f"{what} lists a path twice: every path must be unique")
        known = set(paths)
        for path in paths:
            if len(path) > 1 and path[:-1] not in known:
                raise TreeError(f"{what}: path {list(path)} has no parent {list(path[:-1])} in the tree: add it")
        return cls(tuple(paths))

    @property
    def depth(self) -> int:
        """Levels below the root (the longest path)."""
        return max(len(p) for p in self.paths)

    @property
    def nodes(self) -> int:
        """Draft tokens verified per step."""
        return len(self.paths)

    @property
    def max_non_leaves(self) -> int:
        """The most nodes with children on any one level (TensorRT-LLM's ``max_non_leaves_per_layer``)."""
        parents = {p[:-1] for p in self.paths if len(p) > 1}
        return max(Counter(len(p) for p in parents).values(), default=0)

    @property
    def max_rank(self) -> int:
        """Candidates needed per node: 1 + the highest rank on any path."""
        return 1 + max(p[-1] for p in self.paths)

    def breadth_first(self) -> "Tree":
        """The same tree with nodes ordered by depth, then path (parents before children)."""
        return Tree(tuple(sorted(self.paths, key=lambda p: (len(p), p))))

    @property
    def parents(self) -> tuple[int, ...]:
        """Index of each node's parent in :attr:`paths`, ``-1`` for children of the root."""
        index = {p: i for i, p in enumerate(self.paths)}
        return tuple(index[p[:-1]] if len(p) > 1 else -1 for p in self.paths)

    def check(
        self,
        *,
        max_depth: int | None = None,
        max_nodes: int | None = None,
        what: str = "--choices",
        depth_limit: str = "draft heads",
        fix_depth: str = "use paths of at most {limit} entries",
    ) -> "Tree":
        """Refuse a tree deeper than ``max_depth`` or with more nodes than ``max_nodes``; return it.

        Args:
            max_depth: levels the draft can predict (EAGLE layers, Medusa heads), or ``None``.
            max_nodes: ``max_draft_len`` in tokens, or ``None``.
            depth_limit: what ``max_depth`` counts, for the message.
            fix_depth: the fix for a too-deep tree, ``{limit}`` replaced by ``max_depth``.

        Raises:
            TreeError: naming both numbers and the fix.
        """
        if max_depth is not None and self.depth > max_depth:
            raise TreeError(
                f"the {what} tree is {self.depth} deep, the draft has {max_depth} {depth_limit} "
                f"(one level each): {fix_depth.format(limit=max_depth)}"
            )
        if max_nodes is not None and self.nodes > max_nodes:
            raise TreeError(
                f"the {what} tree has {self.nodes} nodes, max_draft_len is {max_nodes}: raise "
                f"--max-draft-len to {self.nodes} or give a smaller tree with --choices"
            )
        return self

    def truncate(self, nodes: int) -> "Tree":
        """The first ``nodes`` paths, in order, whose parent is already kept (still a valid tree)."""
        kept: list[Path] = []
        for path in self.paths:
            if len(kept) == nodes:
                break
            if len(path) == 1 or path[:-1] in kept:
                kept.append(path)
        return Tree(tuple(kept))

    def to_list(self) -> list[list[int]]:
        """JSON form, ``[[0], [0, 0], [1]]`` (manifests, ``model.yaml``)."""
        return [list(p) for p in self.paths]

    def to_backend_text(self) -> str:
        """The tensorrtllm backend's parameter text, ``{0}, {0, 0}, {1}``."""
        return ", ".join("{" + ", ".join(str(i) for i in p) + "}" for p in self.paths)


def _literal(text: str, what: str):
    stripped = text.strip()
    if stripped.startswith("{"):
        stripped = "[" + stripped.replace("{", "[").replace("}", "]") + "]"
    try:
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError):
        raise TreeError(f"{what} {text!r} is not a list of paths such as {_EXAMPLE}") from None
