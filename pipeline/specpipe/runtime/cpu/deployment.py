"""A loaded CPU deployment: the target, the drafter and the settings the batch scheduler serves with.

It holds no decoding loop: every request, one or many, is served by
:class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler` (one request alone:
:mod:`~specpipe.runtime.cpu.scheduler.one_request`). Every drafter is a
:class:`~specpipe.runtime.cpu.drafters.proposer.Proposer`: chain drafters (none, n-gram, draft model) propose
one-child trees, tree drafters (Medusa, EAGLE) branching ones over the target's hidden states
(see :mod:`specpipe.runtime.cpu.verify.tree_accept`).
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedModel

from specpipe.runtime.cpu.drafters.proposer import Proposer
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.speculative import ACCEPTANCE_RULES


def _end_ids(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    return frozenset(eos_token_id)


class Deployment:
    """The target, drafter and speculative settings of one loaded CPU engine directory.

    Args:
        target: the target causal LM (``LlamaForCausalLM``), fp32 (or weight-only quantized), eval mode.
        drafter: the :class:`~specpipe.runtime.cpu.drafters.proposer.Proposer` every request's drafter is
            forked from (``NoDrafter`` for plain decoding).
        max_draft_len: most draft tokens (tree: nodes) verified per step (>= 0).
        acceptance: ``"exact"`` (greedy, or sampling that preserves the target's distribution) or
            ``"typical"`` (Medusa's typical acceptance for sampled requests; opt-in, tree drafters only:
            a chain deployment accepts exactly whatever the manifest says).
        max_context: most tokens (prompt + output) per request; default the target's ``max_position_embeddings``.
        eos_token_id: end id(s) used when a request gives no ``end_id``; default the target config's.

    Raises:
        ValueError: a negative ``max_draft_len``, ``max_context < 2``, an unknown acceptance rule, or a
            drafter whose vocabulary size differs from the target's.

    Attributes:
        target: the target wrapped as a one-sequence :class:`CachedLM` (its ``model``, ``vocab_size``,
            ``capture_layers``: EAGLE-3's fused feature layers); external drafts verify on it.
        tree: whether the drafter's proposals may branch (:attr:`~specpipe.runtime.cpu.drafters.proposer.Proposer.trees`).
        default_end_ids: end ids used when a request gives no ``end_id``.
        drafter, max_draft_len, acceptance, max_context: as given (``max_context`` resolved).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: Proposer,
        max_draft_len: int,
        *,
        acceptance: str = ACCEPTANCE_RULES[0],
        max_context: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
    ):
        self.target = CachedLM(target)
        self.drafter = drafter
        self.tree = drafter.trees
        self.max_draft_len = max_draft_len
        self.acceptance = acceptance if self.tree else ACCEPTANCE_RULES[0]
        self.max_context = max_context if max_context is not None else int(target.config.max_position_embeddings)
        self.default_end_ids = _end_ids(eos_token_id if eos_token_id is not None else target.config.eos_token_id)
        if max_draft_len < 0:
            raise ValueError(f"max_draft_len must be >= 0, got {max_draft_len}")
        if self.max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {self.max_context}")
        if acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {acceptance!r}")
        if drafter.vocab_size is not None and drafter.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary has {drafter.vocab_size} tokens, the target's "
                f"{self.target.vocab_size}: a draft model must share the target's vocabulary"
            )
        self.target.capture_layers = tuple(drafter.capture_layers)  # EAGLE-3: fused features
