"""The CPU speculative decoding engine: draft, verify all drafts in one target forward, roll back.

Algorithm: Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", and
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling". Each step:

1. the drafter proposes K tokens ``d1..dK`` after the committed context;
2. the target scores ``[last_committed, d1..dK]`` in one forward pass over its KV cache (positions
   continue the context), giving K + 1 next-token distributions;
3. greedy: drafts are accepted while they equal the target's argmax; sampling: the speculative sampling
   rule (see :mod:`specpipe.runtime.cpu.verify.sampling`); either way the target adds one token (a
   replacement or a bonus), so a step commits 1 .. K + 1 tokens;
4. the rejected drafts' keys/values are cropped from the target cache (and the drafter's).

The target cache holds every committed token but the newest one, which is the first input of the next
verification.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.runtime.cpu.drafters.drafters import Draft, Drafter
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.validation import validate_request


@dataclass
class ActiveRequest:
    """The state of the request an engine is serving: committed context (prompt + output), token choice,
    stop conditions and cumulative stats."""

    context: list[int]
    sampler: TokenSampler
    stop: StopConditions
    stats: RequestStats


def _end_ids(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    return frozenset(eos_token_id)


class SpeculativeEngine:
    """Generates tokens for one request at a time with speculative decoding on CPU (fp32).

    Args:
        target: the target causal LM (``LlamaForCausalLM``), in eval mode.
        drafter: proposes draft tokens (:class:`~specpipe.runtime.cpu.drafters.drafters.NoDrafter` for plain
            decoding).
        max_draft_len: most draft tokens verified per step (>= 0).
        max_context: most tokens (prompt + output) per request; default the target's
            ``max_position_embeddings``.
        eos_token_id: end id(s) used when a request gives no ``end_id``; default the target config's
            ``eos_token_id``.

    Raises:
        ValueError: a negative ``max_draft_len``, ``max_context < 2``, or a drafter whose vocabulary
            size differs from the target's.

    Attributes:
        target: the target wrapped with its KV cache (:class:`CachedLM`); between steps it holds the
            committed tokens but the newest.
        drafter, max_draft_len, max_context: as given (``max_context`` resolved).
        default_end_ids: end ids used when a request gives no ``end_id``.

    One engine serves one request at a time, from one thread; starting a request abandons the
    previous one (resuming its generator raises ``RuntimeError``).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: Drafter,
        max_draft_len: int,
        max_context: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
    ):
        self.target = CachedLM(target)
        self.drafter = drafter
        self.max_draft_len = max_draft_len
        self.max_context = max_context if max_context is not None else int(target.config.max_position_embeddings)
        self.default_end_ids = _end_ids(eos_token_id if eos_token_id is not None else target.config.eos_token_id)
        if max_draft_len < 0:
            raise ValueError(f"max_draft_len must be >= 0, got {max_draft_len}")
        if self.max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {self.max_context}")
        if drafter.vocab_size is not None and drafter.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary has {drafter.vocab_size} tokens, the target's "
                f"{self.target.vocab_size}: a draft model must share the target's vocabulary"
            )
        self._current: ActiveRequest | None = None

    def generate(self, input_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
        """Generate tokens after ``input_ids``, one :class:`StepOutput` per engine step.

        The first step is the prefill (one target forward over the prompt, one token); each later step
        commits 1 .. ``max_draft_len + 1`` tokens. The last output has ``finished=True`` and a
        ``finish_reason``: ``"stop"`` (end id or stop word, neither returned) or ``"length"``
        (``max_tokens`` reached or the context is full). Stats are cumulative.

        Raises:
            ValueError: invalid request (empty prompt, prompt not shorter than ``max_context``, ids
                outside the vocabulary, ``max_tokens <= 0``, ``top_k < 0``, ``top_p`` outside (0, 1],
                ``temperature <= 0`` when sampling); raised here, before the first step.
        """
        input_ids = list(input_ids)
        validate_request(input_ids, params, vocab_size=self.target.vocab_size, max_context=self.max_context)
        generator = torch.Generator()
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        end_ids = params.end_ids(self.default_end_ids)
        request = ActiveRequest(
            context=input_ids,
            sampler=TokenSampler(params, generator, history=input_ids, end_ids=end_ids),
            stop=StopConditions(end_ids, params.stop_words, params.max_tokens),
            stats=RequestStats(num_input_tokens=len(input_ids)),
        )
        self._current = request
        return self._steps(request)

    def generate_all(self, input_ids: list[int], params: SamplingParams) -> tuple[list[int], RequestStats]:
        """Run a request to completion; returns all returned tokens and the final stats.

        Raises:
            ValueError: as :meth:`generate`.
        """
        tokens: list[int] = []
        stats = RequestStats()
        for step in self.generate(input_ids, params):
            tokens += step.token_ids
            stats = step.stats
        return tokens, stats

    def _steps(self, request: ActiveRequest) -> Iterator[StepOutput]:
        self._ensure_current(request)
        committed = self._prefill(request)
        while True:
            tokens, reason = request.stop.push(committed)
            if reason is None and len(request.context) >= self.max_context:
                tokens += request.stop.finish()
                reason = "length"
            request.stats.num_output_tokens = request.stop.returned
            yield StepOutput(tokens, reason is not None, reason, replace(request.stats))
            if reason is not None:
                return
            self._ensure_current(request)
            committed = self._decode_step(request)

    def _ensure_current(self, request: ActiveRequest) -> None:
        if self._current is not request:
            raise RuntimeError("another request was started on this engine; this one was abandoned")

    @torch.inference_mode()
    def _prefill(self, request: ActiveRequest) -> list[int]:
        self.target.reset()
        self.drafter.reset(list(request.context))
        logits = self.target.forward(request.context, last_only=True)
        request.stats.target_forwards += 1
        token, _ = request.sampler.choose(logits)
        request.context.append(token)
        self.drafter.commit(request.context)
        return [token]

    @torch.inference_mode()
    def _decode_step(self, request: ActiveRequest) -> list[int]:
        context = request.context
        # Each step also commits one target token, so K + 1 must fit the token budget and the context.
        k = min(self.max_draft_len, request.stop.remaining - 1, self.max_context - len(context) - 1)
        draft = self.drafter.propose(context, k, request.sampler) if k > 0 else Draft([])
        drafts = draft.tokens[:k]
        draft_probs = draft.probs[: len(drafts)] if draft.probs is not None else None

        logits = self.target.forward([context[-1], *drafts])
        accepted, token = request.sampler.verify(logits, drafts, draft_probs)
        self.target.truncate(len(context) + accepted)

        committed = [*drafts[:accepted], token]
        context.extend(committed)
        self.drafter.commit(context)
        stats = request.stats
        stats.target_forwards += 1
        stats.total_draft_tokens += len(drafts)
        stats.total_accepted_draft_tokens += accepted
        return committed
