"""Verify draft tokens proposed outside the engine (draft-target through a BLS model) with one target forward.

TensorRT-LLM's ``draft_tokens_external`` mode takes the draft tokens of a request in its
``draft_input_ids`` input and, without draft logits, accepts them while each equals the token the
target picks at that position (TensorRT-LLM ``examples/draft_target_model/README.md`` @ 567239f:
"greedy" acceptance). :class:`DraftVerifier` does the same on the CPU engine's target: one forward
pass over ``prompt + drafts`` (K + 1 next-token rows after the prompt), accept the longest prefix of
drafts matching the target's choices, then add the target's own next token (the exact rule of
:mod:`~specpipe.runtime.cpu.verify.accept`, on the drafts as a chain); so a request commits
``accepted + 1`` tokens (1 .. K + 1). Greedy requests pick the argmax; sampling requests draw each
position on the accepted path, in order, from the request's processed distribution with the request's
own ``torch.Generator`` (not the scheduler's position-keyed draws).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.validation import validate_request
from specpipe.runtime.cpu.verify.accept import chain_tree, follow_choices
from specpipe.runtime.cpu.verify.sampling import TokenSampler


class DraftVerifier:
    """Serves one request whose drafts come from outside, with a ``generate(input_ids, params)`` that
    yields exactly one final :class:`StepOutput` (the Triton worker's one-request shape).

    A request with external drafts is one verification and no decoding loop, so it does not go through
    the batch scheduler: its drafts start at the first output token, before any token the scheduler's
    prefill commits, and it uses the one-sequence :class:`~specpipe.runtime.cpu.model.cached_lm.CachedLM`
    of the deployment, on the serving thread, between scheduler steps.

    Args:
        engine: a loaded :class:`~specpipe.runtime.cpu.deployment.Deployment` (its target is used; its
            own drafter is not).
        draft_ids: the K draft tokens (K >= 0).
    """

    def __init__(self, engine, draft_ids: list[int]):
        self.engine = engine
        self.draft_ids = [int(t) for t in draft_ids]

    def generate(self, input_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
        """Verify the drafts after ``input_ids``; see the module docstring.

        Drafts beyond ``max_tokens - 1`` or beyond the context limit are dropped (the step must also
        fit its own target token).

        Raises:
            ValueError: an invalid request (as the engine's) or draft ids outside the vocabulary.
        """
        target = self.engine.target
        input_ids = [int(t) for t in input_ids]
        validate_request(input_ids, params, vocab_size=target.vocab_size, max_context=self.engine.max_context)
        outside = [t for t in self.draft_ids if not 0 <= t < target.vocab_size]
        if outside:
            raise ValueError(
                f"draft_input_ids contains ids outside the vocabulary [0, {target.vocab_size}): {outside[:5]}"
            )
        room = min(params.max_tokens - 1, self.engine.max_context - len(input_ids) - 1)
        drafts = self.draft_ids[: max(0, room)]
        return self._step(input_ids, drafts, params)

    def _step(self, input_ids: list[int], drafts: list[int], params: SamplingParams) -> Iterator[StepOutput]:
        generator = torch.Generator()
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        end_ids = params.end_ids(self.engine.default_end_ids)
        sampler = TokenSampler(params, generator, history=list(input_ids), end_ids=end_ids)
        target = self.engine.target
        with torch.inference_mode():
            target.reset()
            logits = target.forward(input_ids + drafts)[len(input_ids) - 1 :]  # [K + 1, vocab]
            target.reset()
        chain = chain_tree(drafts)
        paths = chain.row_paths()
        path, token = follow_choices(chain, lambda row: sampler.choose(logits[row : row + 1], path=paths[row])[0])
        accepted, committed = len(path), [*drafts[: len(path)], token]
        stop = StopConditions(end_ids, params.stop_words, params.max_tokens)
        tokens, reason = stop.push(committed)
        if reason is None:
            tokens += stop.finish()
        # as the scheduler counts (RequestStats): a draft that ends the request is the step's own token
        stats = RequestStats(
            num_input_tokens=len(input_ids),
            num_output_tokens=len(tokens),
            num_generated_tokens=stop.committed,
            total_draft_tokens=len(drafts),
            total_accepted_draft_tokens=min(accepted, stop.committed - 1),
            target_forwards=1,
        )
        yield StepOutput(tokens, True, reason or "length", stats)
