"""Tree speculation on CPU: many draft continuations verified in one target forward pass.

A step (SpecInfer, Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with
Tree-based Speculative Inference and Verification"; Medusa, Cai et al. 2024, arXiv:2401.10774, §2.1.2;
EAGLE, Li et al. 2024, arXiv:2401.15077):

1. a tree drafter proposes a token tree below the newest committed token (the *root*): node i has a
   token and a parent (the root or an earlier node); a path from the root is one continuation;
2. the target runs once over ``[root, node_1 .. node_N]`` after its KV cache, with **tree position ids**
   (``context length - 1 + depth``) and a **tree attention mask** (each node sees the cached context,
   the root and its own ancestors), giving next-token logits and hidden states for every node;
3. acceptance walks down from the root: greedy follows the child whose token is the target's argmax;
   sampling uses multi-draft speculative sampling (SpecInfer §4.2; EAGLE's tree sampling) with
   deterministic candidates: at a node with target distribution p, child c is accepted with probability
   p(c) / sum(p); on rejection c is removed from p (``p <- norm(max(p - onehot(c), 0))``) and the next
   child is tried; when none is accepted the committed token is drawn from what is left of p. The
   committed tokens are then distributed exactly as sampling from the target. Medusa's *typical
   acceptance* (Cai et al. 2024, §2.3.1) is an explicit opt-in: it accepts a child c when
   ``p(c) > min(epsilon, delta * exp(-H(p)))``; it is faster but does **not** preserve the target's
   distribution;
4. the keys/values of the accepted path are moved next to the context (KV compaction) and the rest of
   the tree is dropped; one more token (the target's choice after the path) is committed.

Trees come as TensorRT-LLM's ``eagle_choices`` / ``medusa_choices``: a list of paths, each a list of
candidate ranks per depth (``[[0], [0, 0], [1]]``: the top-1 and top-2 candidates at depth 1, and the
top-1 child of the first). EAGLE-2's dynamic tree (Li et al. 2024, arXiv:2406.16858) is built by draft
confidence instead (:class:`EagleTreeDrafter` with ``dynamic=True``).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from specpipe.errors import SpecpipeError

#: Small trees suited to CPU verification cost (a target forward over 8 tokens costs ~1.35 single steps).
CPU_DEFAULT_CHOICES: list[list[int]] = [
    [0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0],
]


def parse_choices(choices: str | Sequence[Sequence[int]]) -> list[list[int]]:
    """Parse ``eagle_choices``/``medusa_choices`` given as a Python/JSON list of paths, or TensorRT-LLM's
    Triton syntax ``{0, 0, 0}, {0, 1}``.

    Raises:
        SpecpipeError: not a list of non-empty lists of non-negative integers.
    """
    if isinstance(choices, str):
        text = choices.strip()
        if text.startswith("{"):
            text = "[" + text.replace("{", "[").replace("}", "]") + "]"
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as exc:
            raise SpecpipeError(f"choices {choices!r} is not a list of paths like [[0], [0, 0], [1]]") from exc
    else:
        value = choices
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecpipeError(f"choices {choices!r} must be a non-empty list of paths like [[0], [0, 0], [1]]")
    paths = []
    for path in value:
        if (
            not isinstance(path, (list, tuple)) or not path
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in path)
        ):
            raise SpecpipeError(f"choices path {path!r} must be a non-empty list of non-negative integers")
        paths.append(list(path))
    return paths


@dataclass(frozen=True)
class TreeSpec:
    """A static tree from a choices list, nodes in breadth-first order (parents before children).

    Attributes:
        paths: the path of each node (ranks per depth).
        parents: parent node index per node, ``-1`` for children of the root.
        depths: depth per node (1 for children of the root).
        ranks: candidate rank of each node among its parent's candidates (``path[-1]``).
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def from_choices(cls, choices, *, max_depth: int | None = None, max_nodes: int | None = None, what: str = "choices") -> "TreeSpec":
        """Validate and order a choices tree.

        Args:
            choices: list of paths (or its string form, see :func:`parse_choices`).
            max_depth: deepest path allowed (Medusa: the number of heads), or ``None``.
            max_nodes: most nodes allowed (``max_draft_len``), or ``None``.

        Raises:
            SpecpipeError: duplicate paths, a path whose parent path is missing, a tree deeper than
                ``max_depth`` or with more nodes than ``max_nodes``.
        """
        paths = parse_choices(choices)
        unique = {tuple(p) for p in paths}
        if len(unique) != len(paths):
            raise SpecpipeError(f"{what} lists a path twice: every path must be unique")
        ordered = sorted(unique, key=lambda p: (len(p), p))
        for path in ordered:
            if len(path) > 1 and path[:-1] not in unique:
                raise SpecpipeError(f"{what} path {list(path)} lacks its parent path {list(path[:-1])}: add it")
        depth = max(len(p) for p in ordered)
        if max_depth is not None and depth > max_depth:
            raise SpecpipeError(
                f"{what} tree is {depth} deep but the draft heads predict only {max_depth} tokens ahead: "
                f"use paths of at most {max_depth} entries"
            )
        if max_nodes is not None and len(ordered) > max_nodes:
            raise SpecpipeError(
                f"{what} tree has {len(ordered)} nodes, more than max_draft_len={max_nodes}: remove nodes "
                f"or raise --max-draft-len"
            )
        index = {p: i for i, p in enumerate(ordered)}
        return cls(
            paths=tuple(ordered),
            parents=tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered),
            depths=tuple(len(p) for p in ordered),
            ranks=tuple(p[-1] for p in ordered),
        )

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    def max_rank(self) -> int:
        """Candidates needed per node: 1 + the highest rank."""
        return 1 + max(self.ranks)


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

    def prune(self, max_depth: int, max_nodes: int | None = None) -> "DraftTree":
        """Drop nodes deeper than ``max_depth`` and, breadth-first, those past ``max_nodes``."""
        depths = self.depths()
        keep = [i for i in range(len(self.tokens)) if depths[i] <= max_depth]
        if max_nodes is not None:
            keep = keep[:max_nodes]
        new_index = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep], [new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep])


def tree_attention(parents: Sequence[int], context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and position offsets of ``[root, node_1 .. node_N]`` after ``context`` cached tokens.

    Returns:
        bool ``[1, 1, N + 1, context + N + 1]`` (True = may attend): every row sees the cached context,
        the root, its ancestors and itself; and int64 ``[N + 1]`` depths (0 for the root), to add to
        the root's position.
    """
    n = len(parents)
    allow = torch.zeros(n + 1, context + n + 1, dtype=torch.bool)
    allow[:, : context + 1] = True
    depth = torch.zeros(n + 1, dtype=torch.long)
    for i, p in enumerate(parents):
        row = i + 1
        if p >= 0:
            allow[row, context + 1 : context + n + 1] = allow[p + 1, context + 1 : context + n + 1]
        allow[row, context + row] = True
        depth[row] = depth[p + 1] + 1
    return allow[None, None], depth


def greedy_tree_accept(best: torch.Tensor, tree: DraftTree) -> tuple[list[int], int]:
    """Greedy tree acceptance: follow, from the root, the child whose token is the target's argmax.

    Args:
        best: int64 ``[N + 1]`` the target's argmax at the root (row 0) and at each node.
        tree: the drafted tree.

    Returns:
        (accepted node indices from the root down, the target's token after the last of them).
    """
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        want = int(best[row])
        nxt = next((c for c in kids[row] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        row = nxt + 1


def sampled_tree_accept(probs: torch.Tensor, tree: DraftTree, generator: torch.Generator) -> tuple[list[int], int]:
    """Multi-draft speculative sampling over a tree of deterministic candidates (SpecInfer §4.2).

    At a node with processed target distribution p (row of ``probs``), children are tried in order:
    child c is accepted with probability ``p(c) / sum(p)``; on rejection ``p(c)`` is set to 0. When a
    child is accepted the walk continues below it with that node's own distribution; when none is, the
    committed token is drawn from the remaining (renormalised) p. Each committed token is therefore
    distributed as the target's p (the rule of Leviathan et al. 2023 with q one-hot on each candidate).

    Args:
        probs: float ``[N + 1, vocab]`` processed target distributions at the root and each node.
        tree: the drafted tree.
        generator: the request's random source.

    Returns:
        (accepted node indices, committed token after them).
    """
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        p = probs[row].clone()
        accepted = None
        for c in kids[row]:
            token = tree.tokens[c]
            mass = float(p.sum())
            if mass <= 0:
                break
            if float(torch.rand((), generator=generator)) * mass < float(p[token]):
                accepted = c
                break
            p[token] = 0.0
        if accepted is None:
            if float(p.sum()) <= 0:  # only rounding can empty p; fall back to the full distribution
                p = probs[row]
            return path, int(torch.multinomial(p / p.sum(), 1, generator=generator)[0])
        path.append(accepted)
        row = accepted + 1


def typical_tree_accept(
    probs: torch.Tensor, tree: DraftTree, generator: torch.Generator, epsilon: float = 0.09, delta: float = 0.3
) -> tuple[list[int], int]:
    """Medusa's typical acceptance (Cai et al. 2024, §2.3.1), opt-in: at each node accept the first child c
    with ``p(c) > min(epsilon, delta * exp(-H(p)))``; the token after the path is sampled from p.

    Faster than exact sampling at high temperature, but the output is **not** distributed as the target's.
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


def compact_cache(cache, context: int, path: Sequence[int]) -> None:
    """Keep the cached context, the root and the accepted nodes' keys/values, contiguous.

    Args:
        cache: a ``transformers`` ``DynamicCache`` whose last ``N + 1`` entries are ``[root, nodes]``
            (the root at index ``context``).
        context: cached tokens before the root.
        path: accepted node indices (node i is at cache index ``context + 1 + i``).
    """
    keep_len = context + 1 + len(path)
    moved = [context + 1 + i for i in path]
    needs_move = moved != list(range(context + 1, keep_len))
    for layer in cache.layers:
        if needs_move:
            index = torch.tensor(moved, dtype=torch.long)
            layer.keys[:, :, context + 1 : keep_len] = layer.keys.index_select(2, index)
            layer.values[:, :, context + 1 : keep_len] = layer.values.index_select(2, index)
        layer.keys = layer.keys[:, :, :keep_len]
        layer.values = layer.values[:, :, :keep_len]


# ---------------------------------------------------------------------------------------------------
# Tree drafters: they read the target's hidden states (features) of committed positions.
# ---------------------------------------------------------------------------------------------------


class TreeDrafter:
    """Protocol of drafters for :class:`TreeSpeculativeEngine`.

    Per request: :meth:`reset`; after the prefill and after each step :meth:`commit` with the context
    and the target's features (final hidden states, after the final norm) of the positions just added to
    the target's cache; :meth:`propose` returns the tree below the newest token.

    Attributes:
        max_depth: deepest tree the drafter can fill (``None``: unbounded).
    """

    max_depth: int | None = None
    vocab_size: int | None = None

    def reset(self, prompt_ids: list[int]) -> None:
        """Forget the previous request."""

    def commit(self, context_ids: list[int], features: torch.Tensor) -> None:
        """``features``: float ``[n, H]`` for the last n cached positions (those added since the last call)."""

    def propose(self, context_ids: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        raise NotImplementedError


def _topk_ids(logits: torch.Tensor, k: int, lm) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids, log-probabilities) of the k best draft-vocabulary entries per row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, index = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return lm.to_target_ids(index), values


class MedusaTreeDrafter(TreeDrafter):
    """Medusa heads on a static choices tree: node ``path`` gets the ``path[-1]``-th best token of head
    ``len(path) - 1`` read from the newest feature (Cai et al. 2024, §2.1.2).

    Args:
        heads: trained :class:`~specpipe.runtime.cpu.heads.MedusaHeads` (eval).
        lm: the target's lm_head restricted to the draft vocabulary
            (:class:`~specpipe.runtime.cpu.heads.ReducedLMHead`).
        tree: the static tree; its depth must not exceed the number of heads.

    Raises:
        SpecpipeError: a tree deeper than the heads.
    """

    def __init__(self, heads, lm, tree: TreeSpec):
        if tree.depth > heads.num_heads:
            raise SpecpipeError(
                f"medusa_choices tree is {tree.depth} deep but there are only {heads.num_heads} Medusa heads: "
                f"use paths of at most {heads.num_heads} entries"
            )
        self.heads, self.lm, self.tree = heads, lm, tree
        self.max_depth = heads.num_heads
        self._feature: torch.Tensor | None = None

    def reset(self, prompt_ids: list[int]) -> None:
        self._feature = None

    def commit(self, context_ids: list[int], features: torch.Tensor) -> None:
        self._feature = features[-1]

    @torch.inference_mode()
    def propose(self, context_ids: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        if self._feature is None:
            return DraftTree([], [])
        feats = self.heads(self._feature[None])[: self.tree.depth, 0]  # [depth, H]
        ids, _ = _topk_ids(self.lm.logits(feats), self.tree.max_rank(), self.lm)
        tokens = [int(ids[d - 1, r]) for d, r in zip(self.tree.depths, self.tree.ranks)]
        return DraftTree(tokens, list(self.tree.parents)).prune(max_depth, max_nodes)


class EagleTreeDrafter(TreeDrafter):
    """EAGLE head drafting a tree autoregressively over features (Li et al. 2024; EAGLE-2 dynamic trees,
    arXiv:2406.16858).

    State: the head's keys/values for every committed position t whose input ``(f_t, x_{t+1})`` is
    known (the *stable* cache). A proposal feeds the inputs not yet seen, predicts f_n for the newest
    token, and expands the tree depth by depth, each node's input being its parent's predicted feature
    and its own token; draft entries are discarded after the proposal.

    Args:
        head: a trained :class:`~specpipe.runtime.cpu.heads.EagleHead` (eval, fp32).
        embed: float ``[V, H]`` the target's token embedding.
        lm: the target's lm_head over the draft vocabulary.
        tree: a static tree (``eagle_choices``), or ``None`` with ``dynamic=True``.
        dynamic: EAGLE-2: expand the ``top_k`` most confident nodes per depth (cumulative draft
            log-probability), ``depth`` levels, then keep the ``max_nodes`` best nodes.
        top_k, depth: dynamic-tree width per expansion and depth.
    """

    def __init__(self, head, embed: torch.Tensor, lm, tree: TreeSpec | None = None, *, dynamic: bool = False, top_k: int = 4, depth: int = 4):
        if tree is None and not dynamic:
            raise SpecpipeError("an EAGLE drafter needs eagle_choices or dynamic=True")
        self.head, self.embed, self.lm, self.tree = head, embed, lm, tree
        self.dynamic, self.top_k, self.depth_limit = dynamic, top_k, depth
        self.max_depth = None
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._stable = 0  # head entries in the stable cache (positions 0 .. stable - 1)
        self._features: list[torch.Tensor] = []  # target features f_t not yet fed, with their positions
        self._first_pending = 0
        self._f_last: torch.Tensor | None = None  # predicted f_n for the newest token

    def commit(self, context_ids: list[int], features: torch.Tensor) -> None:
        self._features.append(features)

    @torch.inference_mode()
    def _advance(self, context_ids: list[int]) -> None:
        """Feed the stable inputs ``(f_t, x_{t+1})`` for every position with a known feature."""
        if not self._features:
            return
        feats = torch.cat(self._features)
        self._features = []
        start = self._stable
        n = feats.shape[0]
        tokens = torch.tensor(context_ids[start + 1 : start + 1 + n], dtype=torch.long)
        out, k, v = self.head(
            feats[None].float(), self.embed[tokens][None], torch.arange(start, start + n), self._k, self._v
        )
        self._k, self._v = k, v
        self._stable = start + n
        self._f_last = out[0, -1]

    @torch.inference_mode()
    def _expand(self, parent_feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, dk, dv, masks) -> tuple:
        """One draft forward for some nodes; returns their predicted features and the grown draft cache."""
        s = self._k.shape[2]
        past_k = self._k if dk is None else torch.cat([self._k, dk], dim=2)
        past_v = self._v if dv is None else torch.cat([self._v, dv], dim=2)
        n_draft = 0 if dk is None else dk.shape[2]
        mask = torch.zeros(1, 1, tokens.numel(), s + n_draft + tokens.numel(), dtype=torch.bool)
        mask[..., :s] = True
        for row, draft_visible in enumerate(masks):
            for j in draft_visible:
                mask[0, 0, row, s + j] = True
            mask[0, 0, row, s + n_draft + row] = True
        out, k, v = self.head(parent_feats[None], self.embed[tokens][None], positions, past_k, past_v, mask)
        return out[0], k[:, :, s:], v[:, :, s:]

    @torch.inference_mode()
    def propose(self, context_ids: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        self._advance(context_ids)
        if self._f_last is None or max_nodes <= 0 or max_depth <= 0:
            return DraftTree([], [])
        n = len(context_ids) - 1  # position of the newest token x_n; its head entry is at n - 1
        if self.dynamic:
            return self._propose_dynamic(n, max_nodes, max_depth)
        return self._propose_static(n, max_nodes, max_depth)

    def _propose_static(self, n: int, max_nodes: int, max_depth: int) -> DraftTree:
        tree = self.tree
        depth = min(tree.depth, max_depth)
        width = tree.max_rank()
        tokens = [0] * tree.num_nodes
        ids, _ = _topk_ids(self.lm.logits(self._f_last[None]), width, self.lm)
        for i in range(tree.num_nodes):
            if tree.depths[i] == 1:
                tokens[i] = int(ids[0, tree.ranks[i]])
        has_children = {p for p in tree.parents if p >= 0}
        slot: dict[int, int] = {}  # node -> index in the draft cache
        pred: dict[int, torch.Tensor] = {}  # node -> predicted feature for its children
        dk = dv = None
        for d in range(1, depth):
            level = [i for i in range(tree.num_nodes) if tree.depths[i] == d and i in has_children]
            if not level:
                break
            parent_feats = torch.stack([self._f_last if tree.parents[i] < 0 else pred[tree.parents[i]] for i in level])
            visible = [self._ancestors(i, tree.parents, slot) for i in level]
            base = 0 if dk is None else dk.shape[2]
            out, dk, dv = self._expand(parent_feats, torch.tensor([tokens[i] for i in level]), torch.full((len(level),), n + d - 1), dk, dv, visible)
            for row, i in enumerate(level):
                slot[i] = base + row
                pred[i] = out[row]
            child_ids, _ = _topk_ids(self.lm.logits(out), width, self.lm)
            for j in range(tree.num_nodes):
                p = tree.parents[j]
                if p in slot and tree.depths[j] == d + 1:
                    tokens[j] = int(child_ids[level.index(p), tree.ranks[j]])
        return DraftTree(tokens, list(tree.parents)).prune(depth, max_nodes)

    @staticmethod
    def _ancestors(node: int, parents, slot: dict[int, int]) -> list[int]:
        out = []
        p = parents[node]
        while p >= 0:
            out.append(slot[p])
            p = parents[p]
        return out

    def _propose_dynamic(self, n: int, max_nodes: int, max_depth: int) -> DraftTree:
        """EAGLE-2: expand the ``top_k`` best nodes per level by cumulative log-probability, then keep the
        ``max_nodes`` best of all drafted nodes (an ancestor always scores at least as high as its
        descendants, so the kept set is a tree)."""
        k = self.top_k
        depth = min(self.depth_limit, max_depth)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        ids, logp = _topk_ids(self.lm.logits(self._f_last[None]), k, self.lm)
        frontier = []
        for j in range(ids.shape[1]):
            tokens.append(int(ids[0, j])); parents.append(-1); scores.append(float(logp[0, j])); depths.append(1)
            frontier.append(len(tokens) - 1)
        slot: dict[int, int] = {}
        pred: dict[int, torch.Tensor] = {}
        dk = dv = None
        for d in range(1, depth):
            parent_feats = torch.stack([self._f_last if parents[i] < 0 else pred[parents[i]] for i in frontier])
            visible = [self._ancestors(i, parents, slot) for i in frontier]
            base = 0 if dk is None else dk.shape[2]
            out, dk, dv = self._expand(parent_feats, torch.tensor([tokens[i] for i in frontier]), torch.full((len(frontier),), n + d - 1), dk, dv, visible)
            child_ids, child_logp = _topk_ids(self.lm.logits(out), k, self.lm)
            candidates = []
            for row, i in enumerate(frontier):
                slot[i] = base + row
                pred[i] = out[row]
                for j in range(child_ids.shape[1]):
                    tokens.append(int(child_ids[row, j])); parents.append(i)
                    scores.append(scores[i] + float(child_logp[row, j])); depths.append(d + 1)
                    candidates.append(len(tokens) - 1)
            frontier = sorted(candidates, key=lambda c: -scores[c])[:k]
        order = sorted(range(len(tokens)), key=lambda c: (-scores[c], depths[c]))[:max_nodes]
        chosen = set(order)
        for c in list(order):  # guard against ties breaking ancestor closure
            p = parents[c]
            while p >= 0 and p not in chosen:
                chosen.add(p)
                p = parents[p]
        keep = sorted(chosen, key=lambda c: (depths[c], c))[:max_nodes]
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree([tokens[c] for c in keep], [index[parents[c]] if parents[c] >= 0 else -1 for c in keep])


# ---------------------------------------------------------------------------------------------------
# The engine: the linear-chain engine's request handling, with tree steps.
# ---------------------------------------------------------------------------------------------------

ACCEPTANCE_RULES = ("exact", "typical")


def _engine_base():
    from specpipe.runtime.cpu.engine import SpeculativeEngine

    return SpeculativeEngine


class TreeSpeculativeEngine(_engine_base()):
    """:class:`~specpipe.runtime.cpu.engine.SpeculativeEngine` with tree steps and a feature-reading
    drafter (Medusa, EAGLE).

    Args:
        target: the target causal LM (``LlamaForCausalLM``), fp32, eval.
        drafter: a :class:`TreeDrafter`.
        max_draft_len: most tree nodes verified per step (the tree is pruned breadth-first to it).
        acceptance: ``"exact"`` (greedy, or multi-draft speculative sampling that preserves the target's
            distribution) or ``"typical"`` (Medusa's typical acceptance for sampled requests; opt-in,
            does not preserve the distribution; greedy requests stay exact).
        max_context, eos_token_id: as for the linear engine.

    Raises:
        ValueError: unknown acceptance rule, or as the linear engine.
    """

    def __init__(self, target, drafter: TreeDrafter, max_draft_len: int, *, acceptance: str = "exact",
                 max_context: int | None = None, eos_token_id=None):
        from specpipe.runtime.cpu.drafters import NoDrafter

        super().__init__(target, NoDrafter(), max_draft_len, max_context=max_context, eos_token_id=eos_token_id)
        if acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {acceptance!r}")
        self.tree_drafter = drafter
        self.acceptance = acceptance

    @torch.inference_mode()
    def _forward(self, token_ids: list[int], positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                 last_logits_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward after the cache; returns (float32 logits ``[n or 1, V]``, hidden ``[n, H]``)."""
        lm = self.target
        start = lm.length
        if positions is None:
            positions = torch.arange(start, start + len(token_ids), dtype=torch.long)
        kwargs = {lm._cache_argument: lm.cache}
        if mask is not None:
            kwargs["attention_mask"] = mask
        hidden = lm.model.model(
            input_ids=torch.tensor([token_ids], dtype=torch.long), position_ids=positions[None], use_cache=True, **kwargs
        ).last_hidden_state[0]
        rows = hidden[-1:] if last_logits_only else hidden
        return lm.model.lm_head(rows).float(), hidden

    @torch.inference_mode()
    def _prefill(self, request) -> list[int]:
        self.target.reset()
        self.tree_drafter.reset(list(request.context))
        logits, hidden = self._forward(request.context, last_logits_only=True)
        request.stats.target_forwards += 1
        token, _ = request.sampler.choose(logits)
        request.context.append(token)
        self.tree_drafter.commit(request.context, hidden)
        return [token]

    @torch.inference_mode()
    def _decode_step(self, request) -> list[int]:
        context = request.context
        cached = len(context) - 1
        room = min(request.stop.remaining - 1, self.max_context - len(context) - 1)
        nodes = min(self.max_draft_len, room if room > 0 else 0)
        tree = self.tree_drafter.propose(context, nodes, room) if nodes > 0 else DraftTree([], [])
        tree = tree.prune(max(room, 0), nodes)
        mask, depth = tree_attention(tree.parents, cached)
        logits, hidden = self._forward([context[-1], *tree.tokens], positions=cached + depth, mask=mask)
        sampler = request.sampler
        if sampler.greedy:
            from specpipe.runtime.cpu.sampling import mask_tokens

            path, token = greedy_tree_accept(mask_tokens(logits, sampler.banned).argmax(-1), tree)
        elif self.acceptance == "typical":
            path, token = typical_tree_accept(sampler.distributions(logits), tree, sampler.generator)
        else:
            path, token = sampled_tree_accept(sampler.distributions(logits), tree, sampler.generator)
        compact_cache(self.target.cache, cached, path)
        committed = [*(tree.tokens[i] for i in path), token]
        context.extend(committed)
        self.tree_drafter.commit(context, hidden[[0, *(i + 1 for i in path)]])
        stats = request.stats
        stats.target_forwards += 1
        stats.total_draft_tokens += len(tree)
        stats.total_accepted_draft_tokens += len(path)
        return committed


def load_tree_drafter(draft_dir, method: str, target, speculative: dict) -> TreeDrafter:
    """Build the Medusa or EAGLE tree drafter of an engine directory's ``draft/`` folder.

    Args:
        draft_dir: folder with the compact heads file (``medusa_heads.safetensors`` /
            ``eagle_heads.safetensors``).
        method: ``medusa`` or ``eagle``.
        target: the loaded target model (its embedding and lm_head are shared with the heads).
        speculative: the manifest's ``speculative`` block: ``choices`` (list of paths),
            ``max_draft_len``, and for EAGLE ``dynamic_tree``, ``dynamic_top_k``, ``dynamic_depth``;
            ``draft_vocab`` (``true``: score the heads' reduced vocabulary, the default).

    Raises:
        SpecpipeError: missing/corrupt heads, a tree deeper than the heads or larger than max_draft_len.
        CompatibilityError: heads trained for another target.
    """
    from pathlib import Path

    from specpipe.runtime.cpu.heads import EagleConfig, EagleHead, MedusaHeads, ReducedLMHead
    from specpipe.runtime.cpu.prepack import prepack_linear_layers
    from specpipe.training.export import COMPACT_FILES, check_for_target, load_compact

    path = Path(draft_dir) / COMPACT_FILES[method]
    tensors, meta = load_compact(path, method)
    check_for_target(meta, target.config, path)
    vocab = tensors.pop("draft_vocab", None)
    if vocab is not None and not speculative.get("draft_vocab", True):
        vocab = None
    lm = ReducedLMHead(target.get_output_embeddings().weight, vocab)
    lm.prepack()
    tensors = {k: v.float() for k, v in tensors.items()}
    max_nodes = int(speculative.get("max_draft_len", 0)) or None
    dynamic = bool(speculative.get("dynamic_tree", False))
    tree = None
    if not dynamic:
        tree = TreeSpec.from_choices(
            speculative.get("choices") or CPU_DEFAULT_CHOICES,
            max_depth=int(meta["num_heads"]) if method == "medusa" else None,
            max_nodes=max_nodes,
            what=f"{method}_choices",
        )
    try:
        if method == "medusa":
            heads = MedusaHeads(int(meta["hidden_size"]), int(meta["num_heads"]), int(meta["num_layers"]))
            heads.load_flat(tensors)
            prepack_linear_layers(heads)
            return MedusaTreeDrafter(heads.eval(), lm, tree)
        head = EagleHead(EagleConfig.from_target(target.config))
        head.load_state_dict(tensors)
        prepack_linear_layers(head)
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch
        raise SpecpipeError(f"{path} does not hold {method} heads of the expected shape ({exc}): retrain or rebuild") from exc
    return EagleTreeDrafter(
        head.eval(), target.get_input_embeddings().weight.detach(), lm, tree, dynamic=dynamic,
        top_k=int(speculative.get("dynamic_top_k", 4)), depth=int(speculative.get("dynamic_depth", 4)),
    )
