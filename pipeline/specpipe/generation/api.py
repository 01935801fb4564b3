"""Request/response types shared by the CPU engine, the Triton models and in-process callers.

These mirror the per-request inputs and perf outputs of TensorRT-LLM's ``tensorrt_llm`` Triton model,
so that the Triton model of the CPU runtime is a thin translation layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    Attributes:
        max_tokens: new tokens to generate at most (>= 1).
        greedy: argmax decoding. As in TensorRT-LLM, a request that gives no sampling inputs, or
            ``top_k == 1``, is greedy.
        temperature: > 0; logits are divided by it before top-k/top-p.
        top_k: keep the k most likely tokens; 0 disables the filter.
        top_p: nucleus mass in (0, 1]; 1.0 disables the filter.
        seed: seed of the request's own ``torch.Generator`` (``None``: nondeterministic).
        end_id: end-of-sequence token id (``None``: the tokenizer's EOS).
        stop_words: token-id sequences; generation stops when the output ends with one of them, and
            the stop sequence itself is not returned.
        bad_words: token-id sequences that must not be generated: a single token's logit is masked
            everywhere, a longer sequence's last token wherever the tokens before end with the rest
            of it (TensorRT-LLM's ``banBadWords``; prompt and draft tokens count).
        repetition_penalty: > 0; 1.0 is off. The logit of every token that occurs in the prompt or the
            output so far is divided by it when positive, multiplied by it when negative.
        presence_penalty: subtracted once from the logit of every token that occurs so far; 0.0 is off.
        frequency_penalty: subtracted ``count`` times from the logit of a token that occurs ``count``
            times so far; 0.0 is off.
        min_tokens: the end ids cannot be generated before this many output tokens; 0 is off.

    The penalties and ``min_tokens`` follow TensorRT-LLM's ``batchApplyPenalty``
    (``cpp/tensorrt_llm/kernels/penaltyKernels.cu``): occurrences are counted over prompt and output
    tokens, and they are applied after the temperature, in the order repetition, presence, frequency.
    """

    max_tokens: int
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0

    def end_ids(self, default: frozenset[int]) -> frozenset[int]:
        """The token ids this request ends at: ``default`` (the tokenizer's) without an ``end_id``."""
        return default if self.end_id is None else frozenset((self.end_id,))

    @property
    def penalised(self) -> bool:
        """Whether any of the repetition, presence or frequency penalties is on."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass
class RequestStats:
    """Per-request speculative-decoding counters (TensorRT-LLM perf-metric names where they exist).

    Attributes:
        num_input_tokens: prompt length, tokens.
        num_output_tokens: tokens returned (after stop-word trimming).
        num_generated_tokens: tokens the request's steps committed, up to and including the one that ended
            it: ``num_output_tokens`` plus the end id or the stop word that ended the request (neither is
            returned).
        total_draft_tokens: draft tokens proposed to the target over the request.
        total_accepted_draft_tokens: draft tokens the target accepted and that a later token of the same step
            follows: a step that commits ``a`` drafts and its own token counts ``a``; a step the stop
            conditions end at its k-th token (the end id, a stop word's last token, the ``max_tokens``-th)
            counts ``k - 1``, that token being the step's own (the target chose it there), and the drafts
            after it none. So ``num_generated_tokens == target_forwards + total_accepted_draft_tokens``
            for every request of the batch scheduler and of the draft verifier (docs/metrics.md,
            "Semantics"); the one-request engines (``SpeculativeEngine.generate``) still count every
            accepted draft and leave ``num_generated_tokens`` at 0.
        target_forwards: target forward passes, the prefill included.
        draft_length: draft tokens (a tree's nodes) the batch scheduler chose to verify in the request's
            latest step (0 = plain decoding; the load-adaptive rule of :mod:`specpipe.runtime.cpu.scheduler.adaptive`).
    """

    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_generated_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    target_forwards: int = 0
    draft_length: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens in [0, 1]; 0.0 when nothing was proposed."""
        if self.total_draft_tokens == 0:
            return 0.0
        return self.total_accepted_draft_tokens / self.total_draft_tokens

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per decoding target forward (accepted drafts + the one target token):
        ``(num_generated_tokens - 1) / (target_forwards - 1)`` where the counters are the scheduler's.

        1.0 for plain decoding and when no decode step ran; the prefill forward is not counted.
        """
        decode_forwards = self.target_forwards - 1
        if decode_forwards <= 0:
            return 1.0
        return (self.total_accepted_draft_tokens + decode_forwards) / decode_forwards


@dataclass
class StepOutput:
    """What one engine step produced for a request.

    Attributes:
        token_ids: tokens released by this step, after stop-word handling. A step commits 1 ..
            max_draft_len + 1 tokens, but trailing tokens that could still grow into a stop word
            are held back until they cannot (so a stop word spanning two steps never leaks); a step
            may therefore release fewer tokens than it committed, or none.
        finished: the request is complete after this step.
        finish_reason: ``"length"``, ``"stop"`` (end id or stop word) or ``None`` while running.
        stats: cumulative counters of the request so far.
    """

    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stats: RequestStats = field(default_factory=RequestStats)
