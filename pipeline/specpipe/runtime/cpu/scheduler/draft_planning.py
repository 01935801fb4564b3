"""How many draft tokens each decoding request verifies in a step: the batch scheduler's planning half
(:class:`DraftPlanning`), apart from its serving half in :mod:`~specpipe.runtime.cpu.scheduler.scheduler`.

Per request: the depth of every draft node it may verify (:meth:`DraftPlanning._node_depths`, within
``max_draft_len``, the tokens it may still emit and the context), then, with the adaptive rule on, the
lengths the rule chooses for the whole batch (:func:`~specpipe.runtime.cpu.scheduler.adaptive.choose_draft_lengths`)
with each request's acceptance, drafting speed and the charge for its drafter catching up first.
"""

from __future__ import annotations

from specpipe.runtime.cpu.scheduler.adaptive import IDLE_FORGETTING, DraftCandidate, choose_draft_lengths
from specpipe.runtime.cpu.scheduler.batch_request import BatchRequest


class DraftPlanning:
    """The draft-length planning of :class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler`, which
    it is mixed into: it reads the scheduler's ``adaptive``, ``cost_model``, ``max_draft_len``,
    ``max_context``, ``tree``, ``draft_seconds_per_depth``, ``start_cost`` and ``resume_cost``."""

    def _draft_lengths(
        self, decoding: list[BatchRequest], prefill_tokens: int, prefill_outputs: int
    ) -> list[tuple[int, int]]:
        """``(draft tokens, draft depth)`` per decoding request, by the adaptive rule (module doc)."""
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
        """Depth of each draft node the request may verify this step, in the drafter's node order (chain:
        1, 2, ...; tree: breadth-first), within ``max_draft_len``, the tokens it may still emit and the context."""
        room = max(0, min(request.stop.remaining - 1, self.max_context - len(request.context) - 1))
        if not self.tree:
            return list(range(1, min(self.max_draft_len, room) + 1))
        static = None if getattr(request.drafter, "dynamic", False) else getattr(request.drafter, "tree", None)
        if static is not None:
            depths = list(static.depths)
        else:  # a dynamic tree: the latest tree's depths, then an even spread over the depth limit
            limit = self._tree_depth(request.drafter)
            width = max(1, self.max_draft_len // max(limit, 1))
            spread = [min(limit, 1 + i // width) for i in range(self.max_draft_len)]
            latest = request.node_depths or []
            depths = latest + [max(latest[-1] if latest else 1, d) for d in spread[len(latest) :]]
        return [d for d in depths[: self.max_draft_len] if d <= room]

    def _tree_depth(self, drafter) -> int:
        return int(getattr(drafter, "depth_limit", None) or getattr(drafter, "max_depth", None) or self.max_draft_len)
