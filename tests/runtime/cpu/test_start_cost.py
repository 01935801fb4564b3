"""The adaptive rule charges a request's first drafts for its drafter's catching up on the whole context,
spread over the steps requests draft in (``StartCost``), and the scheduler measures both."""

import pytest
from batch_helpers import make_engine, prompts, scheduler_for, submit

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.scheduler import policy as policy_module
from specpipe.runtime.cpu.scheduler.adaptive import (
    IDLE_FORGETTING,
    DraftCandidate,
    NodeAcceptance,
    StartCost,
    choose_draft_lengths,
)
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel

pytestmark = pytest.mark.usefixtures("single_thread")


def test_the_start_is_charged_per_context_token_over_the_steps_requests_draft_in():
    start = StartCost()
    assert start.charge(100, 128) == 0.0  # nothing timed yet: the first request starts free
    start.started(0.5, 50)  # a catch-up over 50 tokens took half a step
    assert start.seconds_per_token == pytest.approx(0.01)
    assert start.charge(100, 128) == pytest.approx(1.0)  # no request finished yet: all on one step
    for _ in range(200):  # requests that drafted did so in 20 steps each
        start.request_ended(20)
    assert start.drafting_steps == pytest.approx(20.0, rel=1e-3)
    assert start.charge(100, 128) == pytest.approx(0.05, rel=1e-3)
    assert start.charge(100, 4) == pytest.approx(0.25)  # 4 tokens left: at most 4 drafting steps to spread it over
    assert start.charge(40, 128) == pytest.approx(0.02, rel=1e-3)  # a shorter context costs less


def test_a_start_charged_in_full_does_not_pay_and_one_spread_over_its_steps_does():
    # each verified token costs a tenth of a step; the first node is accepted half the time
    cost = ForwardCostModel((1, 64), (1.0, 7.3))
    acceptance = NodeAcceptance(base=0.5)
    start = StartCost()
    start.started(0.5, 50)
    assert choose_draft_lengths(
        cost, [DraftCandidate.of(acceptance, [1], 0.0, start.charge(50, 100))], fixed_tokens=1
    ) == [0]
    for _ in range(200):
        start.request_ended(10)
    assert choose_draft_lengths(
        cost, [DraftCandidate.of(acceptance, [1], 0.0, start.charge(50, 100))], fixed_tokens=1
    ) == [1]


def test_the_scheduler_times_first_catch_ups_and_counts_each_requests_drafting_steps(monkeypatch):
    charged = []  # per decision for a request that has not drafted: (start cost charged, the charge then)

    def draft_always(cost, candidates, fixed_tokens, *args, **kwargs):
        for request, c in zip([r for r in scheduler.active if not r.prefilling], candidates):
            if len(c.draft_seconds) > 1 and request.fresh:
                per_depth = request.draft_seconds_per_depth or scheduler.policy.draft_seconds_per_depth
                charged.append(
                    (
                        c.draft_seconds[1] - per_depth,
                        scheduler.policy.start_cost.charge(len(request.context) - 1, request.stop.remaining),
                    )
                )
        return [len(c.expected) - 1 for c in candidates]

    monkeypatch.setattr(policy_module, "choose_draft_lengths", draft_always)
    scheduler = scheduler_for(make_engine("draft-model"))
    first, out = submit(scheduler, prompts(2)[1], SamplingParams(max_tokens=12))
    scheduler.run_until_idle()
    assert out.error is None and first.drafting_steps > 0 and not first.fresh
    assert scheduler.policy.start_cost.seconds_per_token > 0  # its catch-up over the prompt was timed
    assert scheduler.policy.start_cost.drafting_steps == first.drafting_steps  # recorded when it finished
    assert len(charged) == 1 and charged[0][0] == pytest.approx(0.0, abs=1e-12)  # the very first start is free
    second, out = submit(scheduler, prompts(2)[0], SamplingParams(max_tokens=12))
    scheduler.run_until_idle()
    assert out.error is None and len(charged) == 2
    assert charged[1][1] > 0 and charged[1][0] == pytest.approx(charged[1][1], rel=1e-9)


def test_an_inflated_start_estimate_is_forgotten_while_requests_do_not_start(monkeypatch):
    """A start the charge prevents is never timed: the estimate decays by IDLE_FORGETTING in each step in
    which a request that has not drafted yet could start and did not, so one slow catch-up cannot stop
    drafting for good."""
    could_start = []

    def never_draft(cost, candidates, fixed_tokens, *args, **kwargs):
        could_start.append(any(len(c.expected) > 1 for c in candidates))
        return [0] * len(candidates)

    monkeypatch.setattr(policy_module, "choose_draft_lengths", never_draft)
    scheduler = scheduler_for(make_engine("eagle"))
    scheduler.policy.start_cost = StartCost(seconds_per_token=0.05, drafting_steps=4.0)
    request, out = submit(scheduler, prompts(2)[1], SamplingParams(max_tokens=16))
    scheduler.run_until_idle()
    assert out.error is None and request.fresh and sum(could_start) >= 10
    assert scheduler.policy.start_cost.seconds_per_token == pytest.approx(
        0.05 * (1 - IDLE_FORGETTING) ** sum(could_start)
    )
