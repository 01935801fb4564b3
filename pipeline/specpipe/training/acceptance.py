"""Held-out acceptance of a head in training, measured through the run-time drafting code.

The prompts of held-out sequences (never trained on) are decoded greedily, one at a time, by the CPU
runtime's batch scheduler (:func:`~specpipe.runtime.cpu.scheduler.one_request.solo_scheduler`) with the
head's drafter, drafting the whole tree every step; the figure
is the mean accepted length, tokens committed per target forward after the prefill
(``1 + accepted drafts / decoding forwards``), the number speculative decoding's speed-up follows.
"""

from __future__ import annotations

from typing import Any

import torch

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.tree_drafter import TreeDrafter
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.training.features import Features
from specpipe.tree import Tree

#: The tree of the measurement: a chain of 4 drafts (at most 5 tokens per forward).
ACCEPTANCE_TREE = Tree.parse([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def heldout_prompts(held: Features, count: int, min_tokens: int = 4) -> list[list[int]]:
    """Up to ``count`` prompts from held-out sequences: a chat sequence's prompt part (before its answer),
    preferred, or the first half of a text chunk.

    Returns:
        token-id lists, each at least ``min_tokens`` long, in sequence order.
    """
    ends = torch.unique(held.seq_end).tolist()
    chats, texts = [], []
    for start, end in zip([0, *ends[:-1]], ends):
        answer = held.is_answer[start:end].nonzero()
        if answer.numel():
            cut, bucket = start + int(answer[0, 0]), chats
        else:
            cut, bucket = start + (end - start) // 2, texts
        if cut - start >= min_tokens:
            bucket.append(held.tokens[start:cut].tolist())
    return (chats + texts)[:count]


@torch.no_grad()
def mean_accepted_length(
    target, drafter: TreeDrafter, prompts: list[list[int]], max_tokens: int, tree: Tree = ACCEPTANCE_TREE
) -> dict[str, Any]:
    """Decode ``prompts`` greedily with ``drafter`` on ``tree`` and measure the accepted length.

    Args:
        target: the target ``LlamaForCausalLM`` (fp32, eval).
        drafter: a tree drafter built on ``tree`` (e.g. ``task.drafter(ACCEPTANCE_TREE)``).
        max_tokens: tokens generated per prompt at most (an end token stops earlier).

    Returns:
        ``{"mean_accepted_length": float, "prompts": n, "tokens": generated, "forwards": decoding forwards}``.
    """
    scheduler = solo_scheduler(Deployment(target, drafter, len(tree.paths)))
    accepted = forwards = tokens = 0
    for prompt in prompts:
        out, stats = generate_all(scheduler, prompt, SamplingParams(max_tokens=max_tokens))
        accepted += stats.total_accepted_draft_tokens
        forwards += stats.target_forwards - 1
        tokens += len(out)
    mean = 1.0 + accepted / forwards if forwards else 1.0
    return {"mean_accepted_length": round(mean, 4), "prompts": len(prompts), "tokens": tokens, "forwards": forwards}
