"""KV caches: rollback after rejected drafts must leave exactly the committed tokens' keys/values."""

from __future__ import annotations

import pytest
import torch
from reference_decoding import greedy_reference, next_token_logits
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter
from specpipe.runtime.cpu.model.batched_lm import BatchEntry
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.runtime.cpu.scheduler.one_request import generate, generate_all, solo_scheduler

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = [4, 8, 15, 16, 23, 42, 4, 8, 15, 16]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def draft():
    # Milder weights: the draft agrees with the target sometimes, so steps both accept and reject.
    return tiny_llama(seed=5, num_layers=1, init_std=0.2)


def continue_logits(lm: CachedLM, context: list[int]) -> torch.Tensor:
    """Logits after ``context`` computed from ``lm``'s cache plus the context tokens it lacks; the cache
    is then restored."""
    cached = lm.length
    assert cached < len(context)
    logits = lm.forward(context[cached:], last_only=True)[0]
    lm.truncate(cached)
    return logits


def continue_batched_logits(scheduler, slot: int, context: list[int]) -> torch.Tensor:
    """As :func:`continue_logits`, from the scheduler's cache slot ``slot``."""
    cached = scheduler.lm.lengths[slot]
    hidden = scheduler.lm.hidden([BatchEntry(slot, context[cached:])])
    scheduler.lm.truncate(slot, cached)
    return scheduler.lm.project(hidden[-1:])[0]


@pytest.mark.parametrize("greedy", [True, False])
def test_caches_hold_committed_tokens_after_rejection(greedy, target, draft):
    scheduler = solo_scheduler(Deployment(target, DraftModelDrafter(draft), 4))
    params = SamplingParams(max_tokens=40, greedy=greedy, seed=2)
    context = list(PROMPT)
    previous = None
    checked = 0
    for step in generate(scheduler, PROMPT, params):
        context += step.token_ids
        stats = step.stats
        rejected = previous is not None and (
            stats.total_draft_tokens - previous.total_draft_tokens
            > stats.total_accepted_draft_tokens - previous.total_accepted_draft_tokens
        )
        previous = stats
        if not rejected or step.finished:
            continue
        # Target: everything committed but the newest token, which the next verification feeds.
        (request,) = scheduler.active
        assert scheduler.lm.lengths[request.slot] == len(context) - 1
        drafter = request.drafter
        assert drafter.lm.length <= len(context) - 1
        # Continuing from the caches gives what a fresh prefill of the committed tokens gives.
        assert torch.allclose(
            continue_batched_logits(scheduler, request.slot, context), next_token_logits(target, context), atol=1e-4
        )
        assert torch.allclose(continue_logits(drafter.lm, context), next_token_logits(draft, context), atol=1e-4)
        checked += 1
        break
    assert checked == 1, "no step rejected a draft: the test did not exercise rollback"


def test_rollback_then_continue_matches_fresh_prefill(target):
    lm = CachedLM(target)
    first = lm.forward(PROMPT[:6])
    assert first.shape == (6, target.config.vocab_size)
    lm.forward([1, 2, 3])
    lm.truncate(6)
    assert lm.length == 6
    continued = lm.forward(PROMPT[6:])
    fresh = CachedLM(target).forward(PROMPT)
    assert torch.allclose(continued, fresh[6:], atol=1e-5)
    assert torch.allclose(first, fresh[:6], atol=1e-5)
    lm.truncate(100)
    assert lm.length == len(PROMPT)


def test_last_only_projects_one_row(target):
    lm = CachedLM(target)
    logits = lm.forward(PROMPT, last_only=True)
    assert logits.shape == (1, target.config.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.allclose(logits[0], next_token_logits(target, PROMPT), atol=1e-5)


def test_a_solo_scheduler_is_reusable_across_requests(target, draft):
    scheduler = solo_scheduler(Deployment(target, DraftModelDrafter(draft), 3))
    other_prompt = [9, 9, 1, 2]
    first, _ = generate_all(scheduler, PROMPT, SamplingParams(max_tokens=20))
    second, _ = generate_all(scheduler, other_prompt, SamplingParams(max_tokens=20))
    assert first == greedy_reference(target, PROMPT, 20)
    assert second == greedy_reference(target, other_prompt, 20)


def test_a_busy_solo_scheduler_refuses_a_second_request_until_the_first_is_closed(target):
    scheduler = solo_scheduler(Deployment(target, NgramDrafter(), 3))
    old = generate(scheduler, PROMPT, SamplingParams(max_tokens=20))
    assert not scheduler.has_work  # queued at the first next()
    next(old)
    with pytest.raises(RuntimeError, match="serving other requests"):
        generate(scheduler, PROMPT[:5], SamplingParams(max_tokens=10))
    old.close()
    assert not scheduler.has_work and scheduler.lm.free_slots == 1
    new_tokens, _ = generate_all(scheduler, PROMPT[:5], SamplingParams(max_tokens=10))
    assert new_tokens == greedy_reference(target, PROMPT[:5], 10)


def test_draft_cache_catches_up_after_all_drafts_accepted(target):
    """With the target as its own draft every draft is accepted; the last draft and the bonus token
    are then both unseen by the draft cache and must be fed together, keeping it in sync."""
    deployment = Deployment(target, DraftModelDrafter(target), 3)
    context = list(PROMPT)
    steps = list(generate(solo_scheduler(deployment), PROMPT, SamplingParams(max_tokens=17)))
    assert steps[-1].stats.acceptance_rate == 1.0
    scheduler = solo_scheduler(deployment)
    checked = 0
    for step in generate(scheduler, PROMPT, SamplingParams(max_tokens=17)):
        context += step.token_ids
        if len(context) - len(PROMPT) > 1 and not step.finished:
            lm = scheduler.active[0].drafter.lm
            assert lm.length <= len(context) - 1
            assert torch.allclose(continue_logits(lm, context), next_token_logits(target, context), atol=1e-4)
            checked += 1
    assert checked > 0
