"""Load-adaptive speculation: each scheduler step, choose how many draft tokens every running request
verifies.

How it decides (issue 11, item 3). A step's wall time is one batched target forward plus the drafting
done for the step; the step commits, per request, one target token plus the drafts it accepts. The rule
picks, per request, the number ``m_i`` of draft tokens to verify (0 = plain decoding; for a token tree,
its first ``m_i`` nodes breadth-first) that maximises the batch's expected tokens per second::

    rate(m) = (P + sum_i E_i(m_i)) / (C(N_0 + sum_i m_i) + sum_i depth_i(m_i) * c)

* ``C(N)``: seconds of one batched target forward over N packed tokens, with logits for them all,
  measured at load time (:meth:`ForwardCostModel.measure`, a few N from 1 to 64, spread over up to
  ``max_batch_size`` requests, sizes interleaved over rounds, the fastest of each made non-decreasing),
  interpolated linearly, and scaled while serving by the machine's speed learnt from the scheduler's
  own timed forwards (:meth:`ForwardCostModel.observe`). Attention is grouped so that one request's chain or tree does not
  pad the others' queries (:func:`~specpipe.runtime.cpu.batched_lm.attention_groups`): a forward's
  cost then depends on its total tokens far more than on how they are spread over requests. ``N_0``
  counts the step's fixed tokens (prompt chunks and each decoding request's newest token), ``P`` the
  prompts that finish prefill this step;
* ``E_i(m) = 1 + p_0 + ... + p_{m-1}``: expected committed tokens, with ``p_j`` the probability that
  draft node j is on the accepted path (:class:`NodeAcceptance`: the request's exponentially decayed
  counts, with the deployment's shared estimate as prior). For a chain ``p_j`` is the chance that the
  first j + 1 drafts are accepted; for a tree, per node, so that the rule also chooses the tree's
  width: on a CPU, where each verified token costs a visible share of a forward, a tree's single most
  likely node often pays where the whole tree does not;
* ``depth_i(m)``: the depth of the request's first m nodes (m for a chain), ``c`` its measured
  drafting seconds per depth (EWMA of its proposals' time, with the drafter's catching up on the
  previous step's tokens; after steps without drafts that catching up, over the prompt or all the
  tokens committed meanwhile, is left out: it is the cost of having paused, not of drafting).

The maximum is found by coordinate ascent (each request in turn takes its best m with the others
fixed, until nothing changes; a few sweeps); a request drafts only where that beats its plain decoding
by :data:`DRAFT_MARGIN`. With a single request and cheap verification (``C(1 + m) ~ C(1)``) this drafts
as long as the nodes' acceptance makes the extra tokens pay; as the batch grows the forward becomes
compute-bound, ``C`` grows with every verified token and the rule falls back to ``m = 0``: a
speculative deployment then decodes like the baseline instead of slowing it down. Unlike vLLM's,
TensorRT-LLM's and SGLang's defaults (a fixed draft length, or speculation switched off above a fixed
batch size), the decision uses the measured cost curve and each request's own acceptance per node.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

import torch

from specpipe.runtime.cpu.batched_lm import BatchEntry, BatchedLM

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
            gathered and scattered (:func:`~specpipe.runtime.cpu.batched_lm.attention_groups`).
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
        return (f"{curve}; one-token and multi-token entries mixed +{self.speed * self.mixed_seconds * 1e3:.1f} ms; "
                f"forwards verifying drafts x{self.draft_factor:.2f}")

    @classmethod
    @torch.inference_mode()
    def measure(cls, lm: BatchedLM, token_counts=MEASURED_TOKENS, context: int = 64, repeats: int = 4,
                learning_rate: float = 0.05) -> "ForwardCostModel":
        """Time ``lm``'s batched forward (with logits for every row) at each total token count, spread
        over ``min(count, free slots)`` requests holding ``context`` cached tokens each, and at
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
                    lm.project(lm.hidden(entries))
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


@dataclass
class NodeAcceptance:
    """Running probability ``p_i`` that draft node ``i`` ends up on the accepted path, per node index.

    Node order is the drafter's: a chain's positions, or a token tree's breadth-first nodes (a static
    tree's fixed nodes; a dynamic tree's nodes by rank). The expected tokens a step commits when it
    drafts the first ``m`` nodes are then ``1 + p_0 + ... + p_{m-1}`` (each node adds one token exactly
    when it is on the accepted path), which holds for chains and trees alike.

    Each ``p_i`` comes from exponentially decayed counts (node i verified / on the accepted path) plus a
    prior of weight ``prior_weight``: the deployment's shared estimate when one is given (so a request
    starts from, and drifts back to, what the deployment's drafts achieve), else ``base ** (i + 1)``.

    Args:
        decay: factor applied to the counts at every :meth:`observe` (also steps without drafts).
    """

    base: float = 0.6
    prior_weight: float = 2.0
    decay: float = 0.9
    shared: "NodeAcceptance | None" = None
    accepted: list[float] = field(default_factory=list)
    tested: list[float] = field(default_factory=list)

    def rates(self, nodes: int) -> list[float]:
        """``[p_0 .. p_{nodes-1}]``."""
        prior = self.shared.rates(nodes) if self.shared is not None else [self.base ** (i + 1) for i in range(nodes)]
        out = []
        for i in range(nodes):
            accepted = self.accepted[i] if i < len(self.accepted) else 0.0
            tested = self.tested[i] if i < len(self.tested) else 0.0
            out.append((accepted + prior[i] * self.prior_weight) / (tested + self.prior_weight))
        return out

    def observe(self, verified: int, on_path: list[int]) -> None:
        """One step: nodes ``0 .. verified - 1`` were verified and the nodes ``on_path`` accepted
        (``verified`` 0: a step without drafts, which only decays the counts)."""
        if len(self.tested) < verified:
            self.tested += [0.0] * (verified - len(self.tested))
            self.accepted += [0.0] * (verified - len(self.accepted))
        self.accepted = [a * self.decay for a in self.accepted]
        self.tested = [t * self.decay for t in self.tested]
        for i in range(verified):
            self.tested[i] += 1.0
        for i in on_path:
            self.accepted[i] += 1.0

    def forget(self, factor: float) -> None:
        """Scale the counts by ``factor`` (towards the prior) without observing anything."""
        self.accepted = [a * factor for a in self.accepted]
        self.tested = [t * factor for t in self.tested]

    def expected_tokens(self, nodes: int) -> list[float]:
        """``[E(0) .. E(nodes)]`` with ``E(m) = 1 + p_0 + ... + p_{m-1}``: expected committed tokens."""
        out = [1.0]
        for p in self.rates(nodes):
            out.append(out[-1] + p)
        return out


#: Per step in which no request verified drafts, the deployment's estimate forgets this share of its
#: counts: nothing drafts while the estimate says drafting does not pay, so without forgetting a bad
#: start (a few prompts the drafter cannot predict) would stop a deployment from drafting for good.
#: After about 100 such steps the prior's optimism brings back a probe of a few steps.
IDLE_FORGETTING = 0.01


def shared_acceptance() -> NodeAcceptance:
    """A deployment-wide estimate (the prior of every request's): it learns from every verified step of
    every request (decay 0.98 per step with drafts) and drifts back to the base prior by
    :data:`IDLE_FORGETTING` per step without (see :meth:`NodeAcceptance.forget`)."""
    return NodeAcceptance(prior_weight=4.0, decay=0.98)


@dataclass
class DraftCandidate:
    """What the rule knows about one decoding request this step: its options, option ``j`` drafting
    ``j`` nodes (0 = plain decoding).

    Attributes:
        expected: expected committed tokens per option (``expected[0]`` = 1).
        draft_seconds: drafting seconds per option (``draft_seconds[0]`` = 0).
    """

    expected: list[float]
    draft_seconds: list[float]

    @classmethod
    def of(cls, acceptance: NodeAcceptance, node_depths: list[int], seconds_per_depth: float) -> "DraftCandidate":
        """Options ``0 .. len(node_depths)`` for a drafter whose first ``m`` nodes reach depth
        ``node_depths[m - 1]``, drafting at ``seconds_per_depth`` per depth."""
        return cls(acceptance.expected_tokens(len(node_depths)),
                   [0.0, *(d * seconds_per_depth for d in node_depths)])


#: Drafting must raise the batch's expected tokens per second by this share over plain decoding: the
#: estimates are noisy, and a gain within their noise is as likely a loss.
DRAFT_MARGIN = 0.03


def choose_draft_lengths(cost: ForwardCostModel, candidates: list[DraftCandidate], fixed_tokens: int,
                         fixed_outputs: int = 0, sweeps: int = 3, margin: float = DRAFT_MARGIN,
                         prefill: bool = False) -> list[int]:
    """Draft tokens per candidate maximising the batch's expected tokens per second (module doc).

    Coordinate ascent runs twice, from nobody drafting and from everybody drafting all it may (the
    cost of mixing plain and drafting requests couples them: from nobody drafting, no single request
    may find it worth being the first), and the better end point wins.

    Args:
        cost: the forward cost model.
        candidates: the decoding requests.
        fixed_tokens: tokens in the forward whatever the choice (prompt chunks + one per decoding request).
        fixed_outputs: tokens committed whatever the choice by requests outside ``candidates``.
        margin: a candidate drafts only where that beats its plain decoding by this share.
        prefill: the forward holds prompt chunks (multi-token entries whatever the choice).

    Returns:
        one option per candidate: the number of draft tokens (nodes) to verify, 0 = plain decoding.
    """
    problem = _Batch(cost, candidates, fixed_tokens, fixed_outputs, margin, prefill)
    best = problem.ascend([0] * len(candidates), sweeps)
    if any(len(c.expected) > 1 for c in candidates):
        full = problem.ascend([len(c.expected) - 1 for c in candidates], sweeps)
        if problem.rate(full) > problem.rate(best) * (1 + 1e-9):
            best = full
    return best


@dataclass
class _Batch:
    """One step's choice problem (:func:`choose_draft_lengths`)."""

    cost: ForwardCostModel
    candidates: list[DraftCandidate]
    fixed_tokens: int
    fixed_outputs: int
    margin: float
    prefill: bool

    def rate(self, choice: list[int]) -> float:
        """Expected tokens per second of the whole batch with ``choice``."""
        drafting = sum(k > 0 for k in choice)
        seconds = self.cost.cost(self.fixed_tokens + sum(choice), self._mixed(drafting, len(choice) - drafting),
                                 drafting=drafting > 0)
        seconds += sum(c.draft_seconds[k] for c, k in zip(self.candidates, choice))
        outputs = self.fixed_outputs + sum(c.expected[k] for c, k in zip(self.candidates, choice))
        return outputs / max(seconds, 1e-12)

    def _mixed(self, drafting: int, plain: int) -> bool:
        return (self.prefill or drafting > 0) and plain > 0

    def ascend(self, choice: list[int], sweeps: int) -> list[int]:
        """Coordinate ascent from ``choice``: each candidate in turn takes its best option with the others
        fixed (plain decoding unless drafting beats it by the margin), until nothing changes."""
        choice = list(choice)
        tokens = self.fixed_tokens + sum(choice)
        outputs = self.fixed_outputs + sum(c.expected[k] for c, k in zip(self.candidates, choice))
        draft_seconds = sum(c.draft_seconds[k] for c, k in zip(self.candidates, choice))
        drafting = sum(k > 0 for k in choice)
        for _ in range(sweeps):
            changed = False
            for i, c in enumerate(self.candidates):
                old = choice[i]
                base_tokens, base_outputs = tokens - old, outputs - c.expected[old]
                base_draft, others_drafting = draft_seconds - c.draft_seconds[old], drafting - (old > 0)
                others_plain = len(choice) - 1 - others_drafting
                best_k, best_rate = 0, -1.0
                for k in range(len(c.expected)):
                    mixed = self._mixed(others_drafting + (k > 0), others_plain + (k == 0))
                    seconds = (self.cost.cost(base_tokens + k, mixed, drafting=others_drafting + (k > 0) > 0)
                               + base_draft + c.draft_seconds[k])
                    rate = (base_outputs + c.expected[k]) / max(seconds, 1e-12)
                    if k == 0:
                        best_rate = rate * (1 + self.margin)
                    elif rate > best_rate * (1 + 1e-9):
                        best_k, best_rate = k, rate
                changed |= best_k != old
                choice[i] = best_k
                tokens, outputs = base_tokens + best_k, base_outputs + c.expected[best_k]
                draft_seconds, drafting = base_draft + c.draft_seconds[best_k], others_drafting + (best_k > 0)
            if not changed:
                break
        return choice
