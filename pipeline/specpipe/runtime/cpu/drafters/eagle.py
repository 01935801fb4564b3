"""EAGLE and EAGLE-2 tree drafting on CPU (Li et al. 2024, arXiv:2401.15077; EAGLE-2 dynamic trees,
arXiv:2406.16858): the head (:mod:`specpipe.runtime.cpu.drafters.eagle_head`) drafts a token tree autoregressively
over the target's features, on a static ``eagle_choices`` tree or a dynamic, confidence-ranked one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig, EagleHead
from specpipe.runtime.cpu.drafters.tree_drafter import StaticTree, TreeDrafter, read_heads, spread_depths, topk_ids
from specpipe.runtime.cpu.drafters.tree_plan import draft_mask, static_levels
from specpipe.runtime.cpu.model.prepack import prepack_linear_layers
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree
from specpipe.speculative import DYNAMIC_TREE_DEFAULTS
from specpipe.tree import Tree


class EagleTreeDrafter(TreeDrafter):
    """EAGLE head drafting a tree autoregressively over features (Li et al. 2024; EAGLE-2 dynamic trees,
    arXiv:2406.16858).

    State: the head's keys/values for every committed position t whose input ``(f_t, x_{t+1})`` is
    known (the *stable* cache). A proposal feeds the inputs not yet seen, predicts f_n for the newest
    token, and expands the tree depth by depth, each node's input being its parent's predicted feature
    and its own token; draft entries are discarded after the proposal.

    Args:
        head: a trained :class:`~specpipe.runtime.cpu.drafters.eagle_head.EagleHead` (eval, fp32).
        embed: float ``[V, H]`` the target's token embedding.
        lm: the target's lm_head over the draft vocabulary.
        tree: a static tree (``eagle_choices``), or ``None`` with ``dynamic=True``.
        dynamic: EAGLE-2: expand the ``top_k`` most confident nodes per depth (cumulative draft
            log-probability), ``depth`` levels, then keep the ``max_nodes`` best nodes.
        top_k, depth: dynamic-tree width per expansion and depth.
        dtype: the head's dtype (its inputs, the target's fp32 features and embeddings, are cast to it).
    """

    def __init__(
        self,
        head,
        embed: torch.Tensor,
        lm,
        tree: Tree | None = None,
        *,
        dynamic: bool = False,
        top_k: int = DYNAMIC_TREE_DEFAULTS[0],
        depth: int = DYNAMIC_TREE_DEFAULTS[1],
        dtype: torch.dtype = torch.float32,
    ):
        if tree is None and not dynamic:
            raise SpecpipeError("an EAGLE drafter needs eagle_choices or dynamic=True")
        self.head, self.embed, self.lm, self.dtype = head, embed, lm, dtype
        self.tree = StaticTree.of(tree) if tree is not None else None
        self.dynamic, self.top_k, self.depth_limit = dynamic, top_k, depth
        self.max_depth = None
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._stable = 0  # head entries in the stable cache (positions 0 .. stable - 1)
        self._features: list[torch.Tensor] = []  # target features f_t not yet fed, with their positions
        self._f_last: torch.Tensor | None = None  # predicted f_n for the newest token

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._features.append(features)

    def node_depths(self, max_nodes: int, latest: list[int] | None) -> list[int]:
        """The static tree's depths; a dynamic tree's: :func:`spread_depths` over its depth limit."""
        if self.dynamic or self.tree is None:
            return spread_depths(max_nodes, self.depth_limit or max_nodes, latest)
        return list(self.tree.depths)

    def catch_up(self, context_ids: list[int]) -> None:
        self._advance(context_ids)

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
            feats[None].to(self.dtype),
            self.embed[tokens][None].to(self.dtype),
            torch.arange(start, start + n),
            self._k,
            self._v,
        )
        self._k, self._v = k, v
        self._stable = start + n
        self._f_last = out[0, -1]

    @torch.inference_mode()
    def _expand(
        self, parent_feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, dk, dv, visible
    ) -> tuple:
        """One draft forward for L nodes; ``visible`` bool ``[L, S]`` (or per node the list of earlier draft
        entries) marks what each attends to. Returns their predicted features and the grown draft cache."""
        if not isinstance(visible, torch.Tensor):
            lists, visible = visible, torch.zeros(len(visible), 0 if dk is None else dk.shape[2], dtype=torch.bool)
            for row, entries in enumerate(lists):
                visible[row, list(entries)] = True
        s = self._k.shape[2]
        past_k = self._k if dk is None else torch.cat([self._k, dk], dim=2)
        past_v = self._v if dv is None else torch.cat([self._v, dv], dim=2)
        mask = draft_mask(s, visible)
        out, k, v = self.head(
            parent_feats[None], self.embed[tokens][None].to(self.dtype), positions, past_k, past_v, mask
        )
        return out[0], k[:, :, s:], v[:, :, s:]

    @torch.inference_mode()
    def propose(
        self, context_ids: list[int], max_nodes: int, max_depth: int, sampler: TokenSampler | None = None
    ) -> DraftTree:
        self._advance(context_ids)
        if self._f_last is None or max_nodes <= 0 or max_depth <= 0:
            return DraftTree([], [])
        n = len(context_ids) - 1  # position of the newest token x_n; its head entry is at n - 1
        if self.dynamic:
            return self._propose_dynamic(n, max_nodes, max_depth)
        return self._propose_static(n, max_nodes, max_depth)

    def _propose_static(self, n: int, max_nodes: int, max_depth: int) -> DraftTree:
        """The static tree, level by level, with its layout precomputed as tensors (:mod:`tree_plan`)."""
        tree = self.tree
        depth = min(tree.depth, max_depth)
        plan = static_levels(tree, depth)
        tokens = torch.zeros(tree.num_nodes, dtype=torch.long)
        ids, _ = topk_ids(self.lm.logits(self._f_last[None]), tree.max_rank, self.lm)
        tokens[plan.first_nodes] = ids[0, plan.first_ranks]
        features = self._f_last[None]  # row 0: the root's; row 1 + s: draft-cache slot s's prediction
        dk = dv = None
        for d, level in enumerate(plan.levels, start=1):
            out, dk, dv = self._expand(
                features[level.parent_feature],
                tokens[level.nodes],
                torch.full((level.nodes.numel(),), n + d - 1),
                dk,
                dv,
                level.visible,
            )
            features = torch.cat([features, out])
            child_ids, _ = topk_ids(self.lm.logits(out), tree.max_rank, self.lm)
            tokens[level.child_nodes] = child_ids[level.child_rows, level.child_ranks]
        return DraftTree(tokens.tolist(), list(tree.parents)).prune(depth, max_nodes)

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
        ids, logp = topk_ids(self.lm.logits(self._f_last[None]), k, self.lm)
        frontier = []
        for j in range(ids.shape[1]):
            tokens.append(int(ids[0, j]))
            parents.append(-1)
            scores.append(float(logp[0, j]))
            depths.append(1)
            frontier.append(len(tokens) - 1)
        slot: dict[int, int] = {}
        pred: dict[int, torch.Tensor] = {}
        dk = dv = None
        for d in range(1, depth):
            parent_feats = torch.stack([self._f_last if parents[i] < 0 else pred[parents[i]] for i in frontier])
            base = 0 if dk is None else dk.shape[2]
            visible = [self._ancestors(i, parents, slot) for i in frontier]
            out, dk, dv = self._expand(
                parent_feats,
                torch.tensor([tokens[i] for i in frontier]),
                torch.full((len(frontier),), n + d - 1),
                dk,
                dv,
                visible,
            )
            child_ids, child_logp = topk_ids(self.lm.logits(out), k, self.lm)
            candidates = []
            for row, i in enumerate(frontier):
                slot[i] = base + row
                pred[i] = out[row]
                for j in range(child_ids.shape[1]):
                    tokens.append(int(child_ids[row, j]))
                    parents.append(i)
                    scores.append(scores[i] + float(child_logp[row, j]))
                    depths.append(d + 1)
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


def load_eagle_drafter(
    draft_dir: Path,
    target,
    tree: Tree | None,
    *,
    draft_vocab: bool,
    dynamic: bool,
    top_k: int,
    depth: int,
    prepack: bool = True,
    dtype: torch.dtype = torch.float32,
) -> EagleTreeDrafter:
    """The EAGLE drafter of an engine's ``draft/`` folder (``eagle_heads.safetensors``) for ``target``.

    Args:
        target: the loaded target (its config shapes the head; its embedding and lm_head are shared).
        tree: the static tree, or ``None`` with ``dynamic``.
        draft_vocab: score the head's reduced vocabulary (if the file has one).
        prepack: prepack the head's linear layers (inference only; see :mod:`specpipe.runtime.cpu.model.prepack`).
        dynamic, top_k, depth: EAGLE-2's dynamic tree, candidates per expansion and levels.
        dtype: the head's and the reduced lm_head's dtype (bf16: cheaper drafts; verification stays fp32).

    Raises:
        SpecpipeError: missing or corrupt heads, heads of an unexpected shape, or no tree without ``dynamic``.
        CompatibilityError: heads trained for another target.
    """
    heads_file = read_heads(draft_dir, "eagle", target, draft_vocab=draft_vocab, prepack=prepack, dtype=dtype)
    try:
        head = EagleHead(EagleConfig.from_target(target.config))
        head.load_state_dict(heads_file.tensors)
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch
        raise SpecpipeError(
            f"{heads_file.path} does not hold eagle heads of the expected shape ({exc}): retrain or rebuild"
        ) from exc
    head = head.to(dtype)
    if prepack:
        prepack_linear_layers(head)
    return EagleTreeDrafter(
        head.eval(),
        target.get_input_embeddings().weight.detach(),
        heads_file.lm,
        tree,
        dynamic=dynamic,
        top_k=top_k,
        depth=depth,
        dtype=dtype,
    )
