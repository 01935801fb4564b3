"""The accept rule: the only place where a verified block of drafts becomes committed tokens.

A block is a :class:`~specpipe.runtime.cpu.verify.tree_accept.DraftTree`; a chain of drafts is a tree whose
every node has one child (:func:`chain_tree`). The target scored it in one forward: row 0 after the
newest committed token (the root), row ``i + 1`` after node ``i``. Two rules:

* **exact** (:func:`follow_choices`): the target chooses a token at each row (greedy: the processed
  argmax; sampled: a draw keyed by the request's seed and the row's output index,
  :mod:`~specpipe.runtime.cpu.scheduler.batch_request`); from the root, the walk moves to the child whose
  token is the target's choice, and stops at a row none of whose children is; that row's choice is the
  token the step adds. With deterministic drafts this is speculative sampling with one-hot proposals
  (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"; SpecInfer, Miao
  et al. 2024, §4.2, for trees): every committed token is the target's own choice, so a greedy text is
  plain decoding's and a seeded one does not depend on what was drafted.
* **typical** (:func:`typical_accept`; Medusa, Cai et al. 2024, arXiv:2401.10774, §2.3.1), opt-in for
  sampled requests of tree deployments: a child is accepted when the target gives it more than
  ``min(epsilon, delta * exp(-H(p)))``; faster at high temperature, but **not** distributed as the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from specpipe.runtime.cpu.verify.tree_accept import DraftTree
from specpipe.speculative import ACCEPTANCE_RULES


def chain_tree(drafts: Sequence[int]) -> DraftTree:
    """The chain ``d1 .. dk`` as a tree: node ``i``'s parent is node ``i - 1`` (the root for ``d1``)."""
    return DraftTree(list(drafts), list(range(-1, len(drafts) - 1)))


def follow_choices(
    tree: DraftTree, choice: Sequence[int] | torch.Tensor | Callable[[int], int]
) -> tuple[list[int], int]:
    """The exact rule: follow, from the root, the child whose token is the target's choice at its parent's row.

    Args:
        tree: the verified block (``N`` nodes).
        choice: the target's token at each row ``0 .. N`` (int64 ``[N + 1]`` or a sequence), or a function
            of the row giving it, called only for the rows on the accepted path, in order.

    Returns:
        (accepted node indices from the root down, the target's token after the last of them).
    """
    choose = choice if callable(choice) else (lambda row: int(choice[row]))
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        want = choose(row)
        nxt = next((c for c in kids[row] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        row = nxt + 1


def typical_accept(
    probs: torch.Tensor, tree: DraftTree, generator: torch.Generator, epsilon: float = 0.09, delta: float = 0.3
) -> tuple[list[int], int]:
    """Medusa's typical acceptance (module doc): at each node accept the first child c with
    ``p(c) > min(epsilon, delta * exp(-H(p)))``; the token after the path is sampled from p.

    Args:
        probs: float ``[N + 1, vocab]`` processed target distributions at the root and each node.
        tree: the verified block; generator: the random source of the final draw.

    Returns:
        (accepted node indices, the committed token after them).
    """
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        p = probs[row]
        entropy = float(-(p * torch.log(p.clamp_min(1e-30))).sum())
        threshold = min(epsilon, delta * math.exp(-entropy))
        nxt = next((c for c in kids[row] if float(p[tree.tokens[c]]) > threshold), None)
        if nxt is None:
            return path, int(torch.multinomial(p, 1, generator=generator)[0])
        path.append(nxt)
        row = nxt + 1


def accept_block(
    tree: DraftTree, logits: torch.Tensor, chooser, first_position: int, rule: str = ACCEPTANCE_RULES[0]
) -> tuple[list[int], int]:
    """Which drafts of a verified block a request commits, and the token the target adds after them.

    Args:
        tree: the verified block (a chain: :func:`chain_tree`), ``N`` nodes.
        logits: float ``[N + 1, vocab]``, the target's raw logits at the root and each node.
        chooser: the request's token choice (``greedy``, ``seed``, ``choose_at(logits, positions, paths)``
            and ``sampler.distributions``: :class:`~specpipe.runtime.cpu.scheduler.batch_request.PositionKeyedChooser`).
        first_position: output index of the token chosen at the root (row ``r`` is at
            ``first_position + depth``).
        rule: ``"exact"`` or ``"typical"`` (used for sampled requests only; greedy ones are exact).

    Returns:
        (accepted node indices from the root down, the committed token after them).
    """
    paths = tree.row_paths()
    if chooser.greedy or rule != "typical":
        positions = [first_position + depth for depth in [0, *tree.depths()]]
        return follow_choices(tree, chooser.choose_at(logits, positions, paths))
    generator = torch.Generator().manual_seed(chooser.seed + first_position)
    return typical_accept(chooser.sampler.distributions(logits, paths), tree, generator)
