"""Load-adaptive speculation: each scheduler step, choose how many draft tokens every running request
verifies.

How it decides (issue 11, item 3). A step's wall time is one batched target forward plus the drafting
done for the step; the step commits, per request, one target token plus the drafts it accepts. The rule
picks, per request, the number ``m_i`` of draft tokens to verify (0 = plain decoding; for a token tree,
its first ``m_i`` nodes breadth-first) that maximises the batch's expected tokens per second::

    rate(m) = (P + sum_i E_i(m_i)) / (C(N_0 + sum_i m_i) + sum_i [m_i > 0] (depth_i(m_i) * c + r_i))

* ``C(N)``: seconds of one batched target forward over N packed tokens, with logits for them all
  (:class:`~specpipe.runtime.cpu.scheduler.forward_cost.ForwardCostModel`), measured at load time (a few N from
  1 to 64, spread over up to ``max_batch_size`` requests, sizes interleaved over rounds, the fastest of
  each made non-decreasing), interpolated linearly, and scaled while serving by the machine's speed
  learnt from the scheduler's own timed forwards. Attention is grouped so that one request's chain or
  tree does not pad the others' queries (:func:`~specpipe.runtime.cpu.model.attention_groups.attention_groups`):
  a forward's cost then depends on its total tokens far more than on how they are spread over requests. ``N_0``
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
  tokens committed meanwhile, is timed apart);
* ``r_i``: the drafter's catching up before it drafts. A request resuming after a pause catches up on
  the tokens committed meanwhile, once per run of drafting steps: charged the deployment's mean resume
  seconds over its mean run length (:class:`ResumeCost`). A request that has not drafted yet catches
  up on its whole context, once: charged the mean first catch-up per token times its context, over the
  mean number of steps finished requests drafted in (:class:`StartCost`). Uncharged, the whole batch
  waits for catch-ups the rule did not expect.

No request *starts* drafting in a step that prefills a prompt chunk: beside the chunk's tens of tokens
a few verified tokens look nearly free, but such a start first catches up on the whole context and its
run ends at the next step. Requests already drafting go on. Figures for each of these choices are in
``docs/experiments.md``.

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

from dataclasses import dataclass, field

from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel


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
    def of(
        cls, acceptance: NodeAcceptance, node_depths: list[int], seconds_per_depth: float, start_seconds: float = 0.0
    ) -> "DraftCandidate":
        """Options ``0 .. len(node_depths)`` for a drafter whose first ``m`` nodes reach depth
        ``node_depths[m - 1]``, drafting at ``seconds_per_depth`` per depth after ``start_seconds`` (the
        resume cost charged to any draft, see :class:`ResumeCost`)."""
        return cls(
            acceptance.expected_tokens(len(node_depths)),
            [0.0, *(start_seconds + d * seconds_per_depth for d in node_depths)],
        )


def ewma(average: float, value: float, weight: float) -> float:
    """``average`` moved towards ``value`` by ``weight``; ``value`` itself when ``average`` is 0 (unset)."""
    return value if average == 0.0 else average + weight * (value - average)


@dataclass
class ResumeCost:
    """What resuming drafts costs a request that paused (module doc, ``r_i``), deployment-wide.

    Attributes:
        seconds: EWMA of a resuming drafter's catch-up seconds (0 until one is seen).
        run_steps: EWMA of the length, in steps, of the runs of drafting steps that ended (1 until one is
            seen: the whole cost charged to one step).
    """

    seconds: float = 0.0
    run_steps: float = 1.0

    def charge(self) -> float:
        """Seconds charged to one drafting step of a resuming request: :attr:`seconds` over :attr:`run_steps`."""
        return self.seconds / max(self.run_steps, 1.0)

    def resumed(self, seconds: float) -> None:
        """A paused request's drafter caught up in ``seconds`` before drafting again."""
        self.seconds = ewma(self.seconds, seconds, 0.05)

    def run_ended(self, steps: int) -> None:
        """A request decoded plainly after ``steps`` drafting steps in a row."""
        self.run_steps += 0.05 * (steps - self.run_steps)


@dataclass
class StartCost:
    """What a request's first drafting step costs beyond the drafting itself (module doc, ``r_i`` of a
    request that has not drafted yet), deployment-wide: its drafter first catches up on the request's
    whole context (a draft model's forward over it, EAGLE's head over the prompt's features). That is
    paid once per request and buys every step it drafts afterwards, so it is spread over the steps a
    request drafts in all (at most the tokens it may still emit).

    Attributes:
        seconds_per_token: EWMA of first catch-ups' seconds per context token (0 until one is seen).
        drafting_steps: EWMA of the steps in which the finished requests that drafted at all drafted (0
            until one finishes: the whole cost is charged to one step).
    """

    seconds_per_token: float = 0.0
    drafting_steps: float = 0.0

    def charge(self, context_tokens: int, remaining_tokens: int) -> float:
        """Seconds charged to one drafting step of a request that has not drafted yet, with
        ``context_tokens`` to catch up on and at most ``remaining_tokens`` to emit."""
        steps = min(max(self.drafting_steps, 1.0), max(remaining_tokens, 1))
        return self.seconds_per_token * context_tokens / steps

    def started(self, seconds: float, context_tokens: int) -> None:
        """A request's drafter caught up on its ``context_tokens`` in ``seconds`` before its first draft."""
        self.seconds_per_token = ewma(self.seconds_per_token, seconds / max(context_tokens, 1), 0.1)

    def request_ended(self, drafting_steps: int) -> None:
        """A request that drafted in ``drafting_steps`` steps (>= 1) finished."""
        self.drafting_steps = ewma(self.drafting_steps, float(drafting_steps), 0.1)

    def forget(self, factor: float) -> None:
        """Scale :attr:`seconds_per_token` by ``factor``: the scheduler does it by
        :data:`IDLE_FORGETTING` in every step in which a request that has not drafted yet could start and
        did not. A start the charge prevents is never timed, so without forgetting, one catch-up slowed
        by a busy machine would keep every later request from drafting for good."""
        self.seconds_per_token *= factor


#: Drafting must raise the batch's expected tokens per second by this share over plain decoding: the
#: estimates are noisy, and a gain within their noise is as likely a loss. The margin is on the batch's
#: rate and each request is weighed alone, so under load only drafts expected to pay well are verified
#: (0.08 against 0.03: ``docs/experiments.md``).
DRAFT_MARGIN = 0.08


def choose_draft_lengths(
    cost: ForwardCostModel,
    candidates: list[DraftCandidate],
    fixed_tokens: int,
    fixed_outputs: int = 0,
    sweeps: int = 3,
    margin: float = DRAFT_MARGIN,
    prefill: bool = False,
) -> list[int]:
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
        seconds = self.cost.cost(
            self.fixed_tokens + sum(choice), self._mixed(drafting, len(choice) - drafting), drafting=drafting > 0
        )
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
                    seconds = (
                        self.cost.cost(base_tokens + k, mixed, drafting=others_drafting + (k > 0) > 0)
                        + base_draft
                        + c.draft_seconds[k]
                    )
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
