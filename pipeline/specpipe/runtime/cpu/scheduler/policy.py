"""The batch scheduler's draft policy: how many draft tokens each decoding request verifies in a step, and
everything it learns to decide that (:class:`DraftPolicy`), apart from the serving loop in
:mod:`~specpipe.runtime.cpu.scheduler.scheduler`.

Per request: the depth of every draft node it may verify (its drafter's
:meth:`~specpipe.runtime.cpu.drafters.proposer.Proposer.node_depths`, within ``max_draft_len``, the tokens it may
still emit and the context), then, with the adaptive rule on, the lengths the rule chooses for the whole batch
(:func:`~specpipe.runtime.cpu.scheduler.adaptive.choose_draft_lengths`) from each request's acceptance, drafting
speed and the charge for its drafter catching up first. What it learns: the forward cost
(:class:`~specpipe.runtime.cpu.scheduler.forward_cost.ForwardCostModel`), the deployment's acceptance (the prior
of every request's), drafting seconds per depth, and the catch-up costs of resuming and starting
(:class:`~specpipe.runtime.cpu.scheduler.adaptive.ResumeCost`, :class:`~specpipe.runtime.cpu.scheduler.adaptive.StartCost`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.runtime.cpu.scheduler.adaptive import (
    IDLE_FORGETTING,
    DraftCandidate,
    NodeAcceptance,
    ResumeCost,
    StartCost,
    choose_draft_lengths,
    ewma,
    shared_acceptance,
)
from specpipe.runtime.cpu.scheduler.batch_request import BatchRequest
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel


@dataclass(frozen=True)
class DraftStart:
    """A request's state as a drafting step began (what :meth:`DraftPolicy.drafted` charges its catch-up to)."""

    paused: bool
    fresh: bool
    continuing: bool


class DraftPolicy:
    """Plans each step's draft lengths and learns from every step (module doc).

    Args:
        cost_model: forward cost against tokens (refined by :meth:`observe_forward`).
        max_draft_len: most draft tokens (tree: nodes) a request verifies per step.
        max_context: most tokens per request.
        adaptive: choose the lengths by the rule; ``False``: every request drafts all it may.

    Attributes:
        shared_acceptance: the deployment's per-node acceptance, every request's prior.
        draft_seconds_per_depth: the deployment's drafting seconds per depth, for requests that have not drafted.
        resume_cost, start_cost: what catching up costs a paused and a fresh request.
    """

    def __init__(self, cost_model: ForwardCostModel, max_draft_len: int, max_context: int, adaptive: bool = True):
        self.cost_model, self.adaptive = cost_model, adaptive
        self.max_draft_len, self.max_context = max_draft_len, max_context
        self.shared_acceptance = shared_acceptance()
        self.draft_seconds_per_depth = 0.0
        self.resume_cost, self.start_cost = ResumeCost(), StartCost()

    # --- requests ------------------------------------------------------------------------------

    def admit(self, request: BatchRequest) -> None:
        """A request got a slot: its acceptance starts from the deployment's."""
        request.acceptance = NodeAcceptance(shared=self.shared_acceptance)

    def request_ended(self, request: BatchRequest) -> None:
        """A request leaves the batch (finished, failed or cancelled)."""
        if request.drafting_steps and not request.done:
            self.start_cost.request_ended(request.drafting_steps)

    # --- plan ------------------------------------------------------------------------------------

    def plan(self, decoding: list[BatchRequest], prefill_tokens: int, prefill_outputs: int) -> list[tuple[int, int]]:
        """``(draft tokens, draft depth)`` per decoding request (0 tokens: plain decoding).

        Args:
            decoding: the requests past their prompt, in batch order.
            prefill_tokens: prompt tokens this step's forward also holds; prefill_outputs: prompts it ends.
        """
        depths = [self._node_depths(request) for request in decoding]
        if not self.adaptive:
            return [(len(d), d[-1] if d else 0) for d in depths]
        if prefill_tokens:  # beside a prompt chunk only requests already drafting draft (adaptive module doc)
            depths = [d if request.draft_length else [] for request, d in zip(decoding, depths)]
        candidates = [
            DraftCandidate.of(
                request.acceptance,
                d,
                request.draft_seconds_per_depth or self.draft_seconds_per_depth,
                self._catch_up_charge(request),
            )
            for request, d in zip(decoding, depths)
        ]
        chosen = choose_draft_lengths(
            self.cost_model, candidates, prefill_tokens + len(decoding), prefill_outputs, prefill=prefill_tokens > 0
        )
        if any(request.fresh and d and not m for request, d, m in zip(decoding, depths, chosen)):
            self.start_cost.forget(1.0 - IDLE_FORGETTING)
        return [(m, d[m - 1] if m else 0) for m, d in zip(chosen, depths)]

    def _catch_up_charge(self, request: BatchRequest) -> float:
        """Seconds charged to a drafting step of ``request`` for its drafter's catching up first (resume, start)."""
        if request.paused:
            return self.resume_cost.charge()
        return self.start_cost.charge(len(request.context) - 1, request.stop.remaining) if request.fresh else 0.0

    def _node_depths(self, request: BatchRequest) -> list[int]:
        """Depth of each draft node the request may verify this step, in its drafter's node order, within
        ``max_draft_len``, the tokens it may still emit and the context."""
        room = max(0, min(request.stop.remaining - 1, self.max_context - len(request.context) - 1))
        depths = request.drafter.node_depths(self.max_draft_len, request.node_depths)
        return [d for d in depths[: self.max_draft_len] if d <= room]

    # --- observe -----------------------------------------------------------------------------------

    def start_draft(self, request: BatchRequest, nodes: int) -> DraftStart | None:
        """``request`` drafts ``nodes`` tokens this step (0: none): its drafting streak; returns what
        :meth:`drafted` needs where it drafts, ``None`` where it does not."""
        start = DraftStart(request.paused, request.fresh, request.draft_length > 0)
        request.draft_length = nodes
        if nodes == 0:
            if start.continuing:  # a run of drafting steps ended
                self.resume_cost.run_ended(request.draft_streak)
                request.draft_streak = 0
            return None
        request.draft_streak += 1
        request.drafting_steps += 1
        return start

    def drafted(self, request: BatchRequest, start: DraftStart, catch_up: float, propose: float, depth: int) -> None:
        """``request``'s drafter caught up in ``catch_up`` seconds, then proposed ``depth`` levels in
        ``propose``. Catching up on tokens committed while not drafting (the prompt, a pause) is charged to
        starting or resuming; a continuing request's counts as drafting."""
        if start.continuing:
            propose += catch_up
        elif start.paused:
            self.resume_cost.resumed(catch_up)
        elif start.fresh:
            self.start_cost.started(catch_up, len(request.context) - 1)
        seconds = propose / depth
        request.draft_seconds_per_depth = ewma(request.draft_seconds_per_depth, seconds, 0.2)
        self.draft_seconds_per_depth = ewma(self.draft_seconds_per_depth, seconds, 0.05)

    def observe_accept(self, request: BatchRequest, verified: int, path: list[int]) -> None:
        """``request`` verified ``verified`` draft nodes and accepted the nodes ``path``."""
        request.acceptance.observe(verified, path)
        if verified:
            self.shared_acceptance.observe(verified, path)

    def observe_forward(self, tokens: int, seconds: float, *, mixed: bool, drafting: bool, timed: bool) -> None:
        """One step's target forward: ``tokens`` tokens in ``seconds``; ``mixed``: plain and drafting
        entries together; ``drafting``: some request verified drafts; ``timed``: every token had logits,
        as in the cost model's measurements (otherwise the time teaches it nothing)."""
        if timed:
            self.cost_model.observe(tokens, seconds, mixed=mixed, drafting=drafting)
        if not drafting:
            self.shared_acceptance.forget(1.0 - IDLE_FORGETTING)
