"""The draft-target loop of ``tensorrt_llm_bls``, independent of Triton.

Each step (TensorRT-LLM's draft-target BLS flow, tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` ``_spec_generate`` @ c2e65b8,
re-implemented):

1. the draft engine continues the committed sequence by ``k = min(num_draft_tokens, remaining - 1)``
   tokens (greedy);
2. the target engine receives the sequence with those tokens as ``draft_input_ids`` and returns the
   tokens it commits: the accepted drafts, then its own token (TensorRT-LLM may continue past a
   rejection up to ``k + 1`` tokens; whatever it returns is the target's own output);
3. the returned tokens go through the request's stop conditions (end id, stop words, ``max_tokens``;
   :class:`~specpipe.generation.stopping.StopConditions`) and are emitted as one chunk.

The request ends when a stop condition fires, or when the target returned only drafts (its own token
was an end id or stop word that it removed): nothing more would be generated. Acceptance counters:
accepted = the length of the common prefix of drafts and returned tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from specpipe.generation.stopping import StopConditions


@dataclass
class LoopStats:
    """Counters of one request (tokens): drafts proposed, drafts accepted, target steps run."""

    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    target_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed drafts in [0, 1]; 0.0 before any draft."""
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0


@dataclass
class Chunk:
    """Tokens one step adds to the output (after stop conditions), whether the request is done, why."""

    tokens: list[int]
    finished: bool
    reason: str | None
    stats: LoopStats


def accepted_prefix(drafts: list[int], returned: list[int]) -> int:
    """How many leading drafts the target returned unchanged."""
    count = 0
    for draft, token in zip(drafts, returned):
        if draft != token:
            break
        count += 1
    return count


class DraftTargetLoop:
    """Runs the loop above.

    Args:
        draft: ``draft(sequence, k) -> tokens``: up to ``k`` draft tokens after ``sequence``.
        verify: ``verify(sequence, drafts) -> tokens``: the target's committed tokens after ``sequence``.
    """

    def __init__(
        self, draft: Callable[[list[int], int], list[int]], verify: Callable[[list[int], list[int]], list[int]]
    ):
        self.draft = draft
        self.verify = verify

    def run(
        self,
        prompt: list[int],
        max_tokens: int,
        num_draft_tokens: int,
        end_ids: Iterable[int] = (),
        stop_words: Iterable[Iterable[int]] = (),
    ) -> Iterator[Chunk]:
        """One :class:`Chunk` per target step; the last has ``finished=True``.

        Raises:
            ValueError: ``max_tokens < 1`` or ``num_draft_tokens < 0``.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
        stop = StopConditions(end_ids, stop_words, max_tokens)
        sequence = list(prompt)
        stats = LoopStats()
        while True:
            k = max(0, min(num_draft_tokens, stop.remaining - 1))
            drafts = list(self.draft(sequence, k))[:k] if k > 0 else []
            returned = list(self.verify(sequence, drafts))
            stats.target_steps += 1
            stats.total_draft_tokens += len(drafts)
            stats.total_accepted_draft_tokens += accepted_prefix(drafts, returned)
            target_ended = len(returned) <= len(drafts) and returned == drafts[: len(returned)]
            tokens, reason = stop.push(returned)
            sequence.extend(returned)
            if reason is None and target_ended:
                tokens += stop.finish()
                reason = "stop"
            yield Chunk(tokens, reason is not None, reason, replace(stats))
            if reason is not None:
                return
