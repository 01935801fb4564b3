"""Load-adaptive speculation: each scheduler step, choose every running request's draft length.

How it decides (issue 11, item 3). A step's wall time is one batched target forward plus the drafting
done for the step; the step commits, per request, one target token plus the drafts it accepts. The rule
picks draft lengths ``k_i`` (0 = plain decoding) that maximise the batch's expected tokens per second::

    rate(k) = (P + sum_i E_i(k_i)) / (C(N_0 + sum_i n_i(k_i)) + sum_i k_i * c_i)

* ``C(N)``: seconds of one batched target forward over N packed tokens, with logits for them all,
  measured at load time (:meth:`ForwardCostModel.measure`, a few N from 1 to 64, spread over up to
  ``max_batch_size`` requests, sizes interleaved over rounds, medians made non-decreasing), interpolated
  linearly, and refined while serving from the scheduler's own timed forwards
  (:meth:`ForwardCostModel.observe`), so a curve measured while the machine was busy (several servers
  loading at once) does not mislead the rule for long; ``N_0`` counts the step's fixed tokens (prompt
  chunks and each decoding request's newest token), ``P`` the prompts that finish prefill this step;
* ``n_i(k)``: tokens request i adds to the forward with draft length k (k for a chain; the tree's node
  count down to depth k for a token tree);
* ``E_i(k) = 1 + a + a^2 + ... + a^k``: expected committed tokens, with ``a`` the request's running
  per-depth acceptance (:class:`AcceptanceEstimate`: exponentially decayed counts of accepted /
  tested draft depths with a weak prior, so that a request whose drafts stop being accepted drifts
  back towards the prior and probes again after a while);
* ``c_i``: the request's measured drafting seconds per draft depth (EWMA of its proposals' time, with
  the drafter's catching up on the previous step's tokens; after steps without drafts that catching
  up, over the prompt or all the tokens committed meanwhile, is left out: it is the cost of having
  paused, not of drafting).

The maximum is found by coordinate ascent (each request in turn takes its best k with the others
fixed, until nothing changes; a few sweeps). With a single request and cheap verification
(``C(1 + k) ~ C(1)``) this drafts as long as ``a`` makes the extra tokens pay; as the batch grows the
forward becomes compute-bound, ``C`` grows with every verified token and the rule falls back to
``k = 0``: a speculative deployment then decodes like the baseline instead of slowing it down.
Unlike vLLM's, TensorRT-LLM's and SGLang's defaults (a fixed draft length, or speculation switched
off above a fixed batch size), the decision uses the measured cost curve and each request's own
acceptance.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

import torch

from specpipe.runtime.cpu.batched_lm import BatchEntry, BatchedLM

#: Token counts of the load-time forward measurements.
MEASURED_TOKENS = (1, 2, 4, 8, 16, 32, 64)


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

    Attributes:
        tokens: increasing token counts (>= 1).
        seconds: seconds per forward at each count (same length).
        learning_rate: weight of one observed forward in :meth:`observe` (0: the model stays fixed).
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    learning_rate: float = 0.0

    def observe(self, n: int, seconds: float) -> None:
        """Refine the curve with one timed forward over ``n`` tokens with logits for all of them: move
        the two measured points around ``n`` towards it, each by its share of the linear interpolation
        (one step of least squares, the observation clipped to half / double the prediction), then keep
        the curve non-decreasing. Counts beyond the measured ones are ignored."""
        if self.learning_rate <= 0 or seconds <= 0 or n > self.tokens[-1]:
            return
        predicted = self.cost(n)
        error = min(max(seconds, 0.5 * predicted), 2.0 * predicted) - predicted
        ts, new = self.tokens, list(self.seconds)
        if n <= ts[0]:
            new[0] += self.learning_rate * error
        else:  # ts[0] < n <= ts[-1]: between ts[i - 1] and ts[i]
            i = bisect_left(ts, n)
            share = (n - ts[i - 1]) / (ts[i] - ts[i - 1])
            new[i - 1] += self.learning_rate * (1.0 - share) * error
            new[i] += self.learning_rate * share * error
        self.seconds = tuple(non_decreasing(new))

    def cost(self, n: int) -> float:
        """Seconds for ``n`` tokens: linear between measurements, extrapolated from the last two."""
        ts, ss = self.tokens, self.seconds
        if n <= ts[0] or len(ts) == 1:
            return ss[0]
        i = bisect_left(ts, n)
        if i == len(ts):
            i -= 1
        t0, t1, s0, s1 = ts[i - 1], ts[i], ss[i - 1], ss[i]
        return s0 + (s1 - s0) * (n - t0) / (t1 - t0)

    def describe(self) -> str:
        """One line, e.g. ``1 tok 21.3 ms, 2 tok 22.0 ms, ...``."""
        return ", ".join(f"{t} tok {s * 1e3:.1f} ms" for t, s in zip(self.tokens, self.seconds))

    @classmethod
    @torch.inference_mode()
    def measure(cls, lm: BatchedLM, token_counts=MEASURED_TOKENS, context: int = 64, repeats: int = 3,
                learning_rate: float = 0.05) -> "ForwardCostModel":
        """Time ``lm``'s batched forward (with logits for every row) at each total token count, spread
        over ``min(count, free slots)`` requests holding ``context`` cached tokens each: one warm-up
        round, then ``repeats`` rounds over all the counts (interleaved, so that a burst of load on the
        machine hits every count alike); per count the median, then :func:`non_decreasing`. Uses free
        slots and gives them back. The model learns from served forwards at ``learning_rate``.
        """
        width = min(lm.free_slots, max(token_counts))
        slots = [lm.allocate() for _ in range(width)]
        runs: dict[int, list[float]] = {n: [] for n in token_counts}
        try:
            lm.hidden([BatchEntry(s, [0] * context) for s in slots])
            for round_index in range(repeats + 1):
                for n in token_counts:
                    used = slots[: min(n, width)]
                    split = [n // len(used) + (1 if i < n % len(used) else 0) for i in range(len(used))]
                    entries = [BatchEntry(s, [1] * k) for s, k in zip(used, split)]
                    start = time.perf_counter()
                    lm.project(lm.hidden(entries))
                    if round_index:
                        runs[n].append(time.perf_counter() - start)
                    for s in used:
                        lm.truncate(s, context)
        finally:
            for s in slots:
                lm.release(s)
        medians = [sorted(runs[n])[len(runs[n]) // 2] for n in token_counts]
        return cls(tuple(token_counts), tuple(non_decreasing(medians)), learning_rate)


@dataclass
class AcceptanceEstimate:
    """A request's running per-depth acceptance ``a`` (probability that the draft at the next depth is
    accepted given the ones above it were), from exponentially decayed counts plus a prior.

    Args:
        prior: ``a`` before any observation; prior_weight: its weight in tested depths.
        decay: factor applied to the counts at every step (also steps without drafts).
    """

    prior: float = 0.6
    prior_weight: float = 2.0
    decay: float = 0.9
    accepted: float = 0.0
    tested: float = 0.0

    @property
    def rate(self) -> float:
        return (self.accepted + self.prior * self.prior_weight) / (self.tested + self.prior_weight)

    def observe(self, drafted_depth: int, accepted_depth: int) -> None:
        """One step: drafts down to ``drafted_depth`` were verified and ``accepted_depth`` accepted."""
        self.accepted *= self.decay
        self.tested *= self.decay
        if drafted_depth > 0:
            self.accepted += accepted_depth
            self.tested += min(accepted_depth + 1, drafted_depth)

    def expected_tokens(self, depth: int) -> float:
        """``1 + a + ... + a^depth``: expected tokens committed by a step drafting ``depth`` deep."""
        a = self.rate
        return sum(a**j for j in range(depth + 1))


@dataclass
class DraftCandidate:
    """What the rule knows about one decoding request this step.

    Attributes:
        tokens_by_depth: ``tokens_by_depth[k]`` = draft tokens verified with draft length k
            (``[0, 1, 2, ...]`` for a chain; cumulative node counts for a tree); its length - 1 is the
            most the request may draft now.
        acceptance: the request's estimate.
        seconds_per_depth: measured drafting seconds per draft depth.
    """

    tokens_by_depth: list[int]
    acceptance: AcceptanceEstimate
    seconds_per_depth: float = 0.0
    expected: list[float] = field(default_factory=list)


def choose_draft_lengths(cost: ForwardCostModel, candidates: list[DraftCandidate], fixed_tokens: int,
                         fixed_outputs: int = 0, sweeps: int = 3) -> list[int]:
    """Draft length per candidate maximising the batch's expected tokens per second (module doc).

    Args:
        cost: the forward cost model.
        candidates: the decoding requests.
        fixed_tokens: tokens in the forward whatever the choice (prompt chunks + one per decoding request).
        fixed_outputs: tokens committed whatever the choice by requests outside ``candidates``.

    Returns:
        one draft length per candidate (0 = plain decoding).
    """
    for c in candidates:
        c.expected = [c.acceptance.expected_tokens(k) for k in range(len(c.tokens_by_depth))]
    choice = [0] * len(candidates)
    tokens = fixed_tokens
    outputs = fixed_outputs + float(len(candidates))
    draft_seconds = 0.0
    for _ in range(sweeps):
        changed = False
        for i, c in enumerate(candidates):
            base_tokens = tokens - c.tokens_by_depth[choice[i]]
            base_outputs = outputs - c.expected[choice[i]]
            base_draft = draft_seconds - choice[i] * c.seconds_per_depth
            best_k, best_rate = choice[i], -1.0
            for k in range(len(c.tokens_by_depth)):
                seconds = cost.cost(base_tokens + c.tokens_by_depth[k]) + base_draft + k * c.seconds_per_depth
                rate = (base_outputs + c.expected[k]) / max(seconds, 1e-12)
                if rate > best_rate * (1 + 1e-9):
                    best_k, best_rate = k, rate
            if best_k != choice[i]:
                changed = True
            tokens = base_tokens + c.tokens_by_depth[best_k]
            outputs = base_outputs + c.expected[best_k]
            draft_seconds = base_draft + best_k * c.seconds_per_depth
            choice[i] = best_k
        if not changed:
            break
    return choice
