"""The forward cost model of the load-adaptive rule (:mod:`specpipe.runtime.cpu.scheduler.adaptive`): seconds of one
batched target forward against the tokens it processes, measured at load time and scaled while serving
by the machine's speed learnt from the scheduler's own timed forwards."""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass

import torch

from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry

#: Token counts of the load-time forward measurements: every count up to 12, where GEMM row blocking
#: makes the curve step (8 rows to 9 cost a tenth of a step on the 2-core Xeon, not the 1/60 that a
#: line from 8 to 16 gives), then sparser.
MEASURED_TOKENS = (*range(1, 13), 16, 24, 32, 64)
#: Batch sizes at which the cost of mixing one-token and multi-token entries is measured.
MIXED_SIZES = (3, 5)


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of ``values`` (pool adjacent violators; Barlow et al. 1972):
    a forward over more tokens never costs less, so a noisy low or high median is averaged with its
    neighbours instead of bending the curve."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, c1), (m2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [mean for mean, count in blocks for _ in range(int(count))]


@dataclass
class ForwardCostModel:
    """Seconds of one batched target forward against the total tokens it processes.

    The curve's shape comes from the load-time measurement; while serving, only the machine's speed
    is learnt (:meth:`observe`), as one factor over the whole curve. Served forwards cluster at a few
    token counts (one per request when nothing drafts), so refining the points they hit one by one
    would let a busy stretch of a shared machine raise those points alone and make every other count,
    and so drafting, look cheap.

    Attributes:
        tokens: increasing token counts (>= 1).
        seconds: seconds per forward at each count (same length), as measured.
        learning_rate: weight of one observed forward in :meth:`observe` (0: the model stays fixed).
        mixed_seconds: extra seconds of a forward that mixes one-token entries (plain decoding) with
            multi-token ones (drafts, prompt chunks): their attention runs as two calls, with the rows
            gathered and scattered (:func:`~specpipe.runtime.cpu.model.attention_groups.attention_groups`).
        speed: factor applied to the measured seconds (1.0 as measured; > 1: the machine is slower now).
        draft_factor: further factor for forwards in which requests verify draft tokens, learnt from
            served ones: the curve is measured one token per request, and a batch of chains and trees
            (per-request masks, padded attention calls) can cost more than its token count says. At
            concurrency 8, n-gram's forwards took 7 % longer than plain ones for 3.5 % fewer steps;
            unlearnt, the rule drafted where it lost.
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    learning_rate: float = 0.0
    mixed_seconds: float = 0.0
    speed: float = 1.0
    draft_factor: float = 1.0

    def observe(self, n: int, seconds: float, mixed: bool = False, drafting: bool = False) -> None:
        """Learn from one timed forward over ``n`` tokens with logits for all of them (``mixed``: see
        :meth:`cost`), by ``learning_rate`` (exponentially weighted averages, each ratio clipped to
        0.5 - 2): a plain forward moves :attr:`speed` towards its ratio to the measured curve; a forward
        that verifies drafts (``drafting``) moves :attr:`speed` towards its ratio over
        :attr:`draft_factor`, and :attr:`draft_factor` towards its ratio over :attr:`speed`. (Plain
        forwards as measured and drafting ones 20 % above: ``speed`` 1, ``draft_factor`` 1.2.)"""
        if self.learning_rate <= 0 or seconds <= 0:
            return
        ratio = min(max(seconds / self._measured(n, mixed), 0.5), 2.0)
        if not drafting:
            self.speed += self.learning_rate * (ratio - self.speed)
            return
        speed, factor = self.speed, self.draft_factor
        self.speed += self.learning_rate * (min(max(ratio / factor, 0.5), 2.0) - speed)
        self.draft_factor += self.learning_rate * (min(max(ratio / speed, 0.5), 2.0) - factor)

    def cost(self, n: int, mixed: bool = False, drafting: bool = False) -> float:
        """Seconds for ``n`` tokens: linear between measurements, extrapolated from the last two, plus
        :attr:`mixed_seconds` when ``mixed`` (one-token and multi-token entries together), times
        :attr:`speed`, and times :attr:`draft_factor` when some request verifies drafts."""
        return self.speed * self._measured(n, mixed) * (self.draft_factor if drafting else 1.0)

    def _measured(self, n: int, mixed: bool = False) -> float:
        ts, ss = self.tokens, self.seconds
        extra = self.mixed_seconds if mixed else 0.0
        if n <= ts[0] or len(ts) == 1:
            return ss[0] + extra
        i = bisect_left(ts, n)
        if i == len(ts):
            i -= 1
        t0, t1, s0, s1 = ts[i - 1], ts[i], ss[i - 1], ss[i]
        return s0 + (s1 - s0) * (n - t0) / (t1 - t0) + extra

    def describe(self) -> str:
        """One line, e.g. ``1 tok 21.3 ms, 2 tok 22.0 ms, ...; mixed +1.2 ms; drafting x1.00`` (times
        :attr:`speed`)."""
        curve = ", ".join(f"{t} tok {self.cost(t) * 1e3:.1f} ms" for t in self.tokens)
        return (
            f"{curve}; one-token and multi-token entries mixed +{self.speed * self.mixed_seconds * 1e3:.1f} ms; "
            f"forwards verifying drafts x{self.draft_factor:.2f}"
        )

    @classmethod
    def unmeasured(cls) -> "ForwardCostModel":
        """A flat curve, not measured, for a scheduler without the adaptive rule (the rule is its only
        reader; the scheduler still feeds it its timed forwards, which it ignores)."""
        return cls((1, 64), (1.0, 1.0))

    @classmethod
    @torch.inference_mode()
    def measure(
        cls,
        lm: BatchedLM,
        token_counts=MEASURED_TOKENS,
        context: int = 64,
        repeats: int = 4,
        learning_rate: float = 0.05,
    ) -> "ForwardCostModel":
        """Time ``lm``'s batched forward (with greedy logits for every row: ``argmax_only`` rows of
        :meth:`BatchedLM.project`; served forwards teach the model what sampled rows add) at each total
        token count, spread over ``min(count, free slots)`` requests holding ``context`` cached tokens each, and at
        :data:`MIXED_SIZES` with one of the requests holding two tokens: one warm-up round, then
        ``repeats`` rounds over all the shapes (interleaved); per shape the fastest (load from other
        processes only ever adds time, and a median of a few runs still bent the curve flat or steep
        between loads on a shared machine), then :func:`non_decreasing`; :attr:`mixed_seconds` is the
        mean excess of a mixed shape over the same count spread one token per request. Uses free
        slots and gives them back. The model learns the machine's speed from served forwards at
        ``learning_rate``.
        """
        width = min(lm.free_slots, max(token_counts))
        slots = [lm.allocate() for _ in range(width)]
        shapes: dict[tuple[str, int], list[int]] = {}
        for n in token_counts:
            used = min(n, width)
            shapes[("spread", n)] = [n // used + (1 if i < n % used else 0) for i in range(used)]
        for n in MIXED_SIZES:
            if n <= width:
                shapes[("mixed", n)] = [1] * (n - 2) + [2]
        runs: dict[tuple[str, int], list[float]] = {key: [] for key in shapes}
        try:
            lm.hidden([BatchEntry(s, [0] * context) for s in slots])
            for round_index in range(repeats + 1):
                for key, split in shapes.items():
                    entries = [BatchEntry(s, [1] * k) for s, k in zip(slots, split)]
                    start = time.perf_counter()
                    hidden = lm.hidden(entries)
                    lm.project(hidden, [True] * len(hidden))
                    if round_index:
                        runs[key].append(time.perf_counter() - start)
                    for s in slots[: len(split)]:
                        lm.truncate(s, context)
        finally:
            for s in slots:
                lm.release(s)
        fastest = {key: min(times) for key, times in runs.items()}
        excess = [fastest[("mixed", n)] - fastest[("spread", n)] for n in MIXED_SIZES if ("mixed", n) in fastest]
        mixed = max(0.0, sum(excess) / len(excess)) if excess else 0.0
        curve = non_decreasing([fastest[("spread", n)] for n in token_counts])
        return cls(tuple(token_counts), tuple(curve), learning_rate, mixed_seconds=mixed)
