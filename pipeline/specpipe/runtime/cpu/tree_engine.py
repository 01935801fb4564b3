"""The tree engine: :class:`~specpipe.runtime.cpu.engine.SpeculativeEngine`'s request handling with tree
steps and a feature-reading drafter (Medusa, EAGLE).

A step (see :mod:`specpipe.runtime.cpu.verify.tree_accept` for the papers):

1. the tree drafter proposes a token tree below the newest committed token (the *root*);
2. the target runs once over ``[root, node_1 .. node_N]`` after its KV cache, with tree position ids
   (``context length - 1 + depth``) and the tree attention mask, giving next-token logits and hidden
   states for every node;
3. acceptance walks down from the root (greedy, exact multi-draft sampling, or opt-in typical);
4. the accepted path's keys/values are compacted next to the context and one more token (the target's
   choice after the path) is committed; the drafter gets the features of the committed positions.
"""

from __future__ import annotations

import torch

from specpipe.runtime.cpu.engine import SpeculativeEngine, ActiveRequest
from specpipe.runtime.cpu.verify.tree_accept import (
    DraftTree, greedy_tree_accept, sampled_tree_accept, tree_attention, typical_tree_accept,
)
from specpipe.runtime.cpu.drafters.tree_drafter import TreeDrafter
from specpipe.speculative import ACCEPTANCE_RULES


class TreeSpeculativeEngine(SpeculativeEngine):
    """:class:`~specpipe.runtime.cpu.engine.SpeculativeEngine` with tree steps and a feature-reading
    drafter (Medusa, EAGLE).

    Args:
        target: the target causal LM (``LlamaForCausalLM``), fp32, eval.
        drafter: a :class:`~specpipe.runtime.cpu.drafters.tree_drafter.TreeDrafter` (kept as :attr:`drafter`).
        max_draft_len: most tree nodes verified per step (the tree is pruned breadth-first to it).
        acceptance: ``"exact"`` (greedy, or multi-draft speculative sampling that preserves the target's
            distribution) or ``"typical"`` (Medusa's typical acceptance for sampled requests; opt-in,
            does not preserve the distribution; greedy requests stay exact).
        max_context, eos_token_id: as for the linear engine.

    Raises:
        ValueError: unknown acceptance rule, or as the linear engine.
    """

    drafter: TreeDrafter

    def __init__(self, target, drafter: TreeDrafter, max_draft_len: int, *, acceptance: str = ACCEPTANCE_RULES[0],
                 max_context: int | None = None, eos_token_id=None):
        super().__init__(target, drafter, max_draft_len, max_context=max_context, eos_token_id=eos_token_id)
        if acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {acceptance!r}")
        self.acceptance = acceptance
        self.target.capture_layers = tuple(getattr(drafter, "capture_layers", ()))  # EAGLE-3: fused features

    @torch.inference_mode()
    def _prefill(self, request: ActiveRequest) -> list[int]:
        self.target.reset()
        self.drafter.reset(list(request.context))
        hidden = self.target.hidden(request.context)
        logits = self.target.project(hidden[-1:])
        request.stats.target_forwards += 1
        token, _ = request.sampler.choose(logits)
        request.context.append(token)
        self.drafter.commit(request.context, hidden)
        return [token]

    @torch.inference_mode()
    def _decode_step(self, request: ActiveRequest) -> list[int]:
        context = request.context
        cached = len(context) - 1
        room = min(request.stop.remaining - 1, self.max_context - len(context) - 1)
        nodes = min(self.max_draft_len, room if room > 0 else 0)
        tree = self.drafter.propose(context, nodes, room) if nodes > 0 else DraftTree([], [])
        tree = tree.prune(max(room, 0), nodes)
        mask, depth = tree_attention(tree.parents, cached)
        hidden = self.target.hidden([context[-1], *tree.tokens], positions=cached + depth, mask=mask)
        logits = self.target.project(hidden)
        sampler = request.sampler
        paths = tree.row_paths() if sampler.params.penalised or sampler.params.min_tokens > 0 else None
        if sampler.greedy:
            path, token = greedy_tree_accept(sampler.greedy_logits(logits, paths).argmax(-1), tree)
        elif self.acceptance == "typical":
            path, token = typical_tree_accept(sampler.distributions(logits, paths), tree, sampler.generator)
        else:
            path, token = sampled_tree_accept(sampler.distributions(logits, paths), tree, sampler.generator)
        self.target.keep_path(cached, path)
        committed = [*(tree.tokens[i] for i in path), token]
        context.extend(committed)
        self.drafter.commit(context, hidden[[0, *(i + 1 for i in path)]])
        stats = request.stats
        stats.target_forwards += 1
        stats.total_draft_tokens += len(tree)
        stats.total_accepted_draft_tokens += len(path)
        return committed

