"""Stop conditions (end id, stop words, max_tokens, context limit) and request validation."""

from __future__ import annotations

import math

import pytest
from reference_decoding import greedy_reference
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.scheduler.one_request import generate, generate_all, solo_scheduler

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = [10, 11, 12, 13, 10, 11, 12]
MAX_TOKENS = 40
MAX_DRAFT_LEN = 4


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return greedy_reference(target, PROMPT, MAX_TOKENS)


def self_draft_engine(target, **kwargs):
    """Accepts every draft, so steps commit MAX_DRAFT_LEN + 1 tokens at known boundaries."""
    return Deployment(target, DraftModelDrafter(target), MAX_DRAFT_LEN, **kwargs)


def chunk_starts(max_tokens: int) -> list[int]:
    """Output offsets where the steps of a self-draft run start: 0 (prefill), 1, 6, 11, ..."""
    return [0, *range(1, max_tokens, MAX_DRAFT_LEN + 1)]


def first_new_index(tokens: list[int], candidates) -> int:
    """First index in ``candidates`` whose token does not occur earlier in ``tokens``."""
    return next(i for i in candidates if tokens[i] not in tokens[:i])


def run_steps(engine, params):
    steps = list(generate(solo_scheduler(engine), PROMPT, params))
    tokens = [t for step in steps for t in step.token_ids]
    return steps, tokens


# ---- end id ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["none", "self-draft"])
def test_end_id_stops_and_is_not_returned(drafter, target, reference):
    # An end token in the middle of a multi-token step (offset 3 of the chunk starting at 1).
    end_at = first_new_index(reference, range(4, MAX_TOKENS))
    engine = Deployment(target, NoDrafter(), 0) if drafter == "none" else self_draft_engine(target)
    steps, tokens = run_steps(engine, SamplingParams(max_tokens=MAX_TOKENS, end_id=reference[end_at]))
    assert tokens == reference[:end_at]
    assert (steps[-1].finished, steps[-1].finish_reason) == (True, "stop")
    assert steps[-1].stats.num_output_tokens == end_at
    assert not any(step.finished for step in steps[:-1])


def test_default_end_id_comes_from_constructor_then_config(reference):
    config_end, constructor_end, request_end = (first_new_index(reference, range(i, MAX_TOKENS)) for i in (9, 5, 2))
    assert request_end < constructor_end < config_end
    configured = tiny_llama(seed=0, eos_token_id=reference[config_end])
    tokens, _ = generate_all(
        solo_scheduler(Deployment(configured, NgramDrafter(), 3)), PROMPT, SamplingParams(max_tokens=40)
    )
    assert tokens == reference[:config_end]
    engine = Deployment(configured, NgramDrafter(), 3, eos_token_id=reference[constructor_end])
    assert generate_all(solo_scheduler(engine), PROMPT, SamplingParams(max_tokens=40))[0] == reference[:constructor_end]
    params = SamplingParams(max_tokens=40, end_id=reference[request_end])
    assert generate_all(solo_scheduler(engine), PROMPT, params)[0] == reference[:request_end]


# ---- stop words -----------------------------------------------------------------------------------


def test_stop_word_inside_a_multi_token_step_is_not_leaked(target, reference):
    # A 2-token stop word strictly inside the chunk that starts at output offset 6 (offsets 6..10).
    start = next(i for i in range(7, 9) if reference[i : i + 2] not in [reference[j : j + 2] for j in range(i)])
    stop_word = tuple(reference[start : start + 2])
    steps, tokens = run_steps(self_draft_engine(target), SamplingParams(max_tokens=MAX_TOKENS, stop_words=(stop_word,)))
    assert tokens == reference[:start]
    assert steps[-1].finish_reason == "stop"
    assert steps[-1].stats.num_output_tokens == start
    assert len(steps) == 3  # prefill, chunk 1..5, then the chunk where the stop word completed


def test_stop_word_spanning_two_steps_is_held_back(target, reference):
    # Chunk boundary at offset 6: the stop word is the last token of one step + first of the next.
    start = 5
    stop_word = tuple(reference[start : start + 2])
    assert stop_word not in {tuple(reference[j : j + 2]) for j in range(start)}
    steps, tokens = run_steps(self_draft_engine(target), SamplingParams(max_tokens=MAX_TOKENS, stop_words=(stop_word,)))
    assert tokens == reference[:start]
    assert steps[1].token_ids == reference[1:start]  # reference[5] was held back, then dropped
    assert steps[-1].finish_reason == "stop"


def test_unfinished_stop_word_prefix_is_released(target, reference):
    absent = next(t for t in range(target.config.vocab_size) if t not in reference)
    stop_word = (reference[5], absent)
    steps, tokens = run_steps(self_draft_engine(target), SamplingParams(max_tokens=MAX_TOKENS, stop_words=(stop_word,)))
    assert tokens == reference
    assert steps[-1].finish_reason == "length"


def test_stop_conditions_trim_the_longest_completed_stop_word():
    stop = StopConditions(end_ids=(), stop_words=[(3,), (2, 3), ()], max_tokens=10)
    assert stop.push([1, 2, 3, 4]) == ([1], "stop")
    assert stop.returned == 1


def test_stop_conditions_hold_back_possible_stop_word_prefixes():
    stop = StopConditions(end_ids=(99,), stop_words=[(5, 6, 7)], max_tokens=10)
    assert stop.push([1, 5]) == ([1], None)
    assert stop.push([6]) == ([], None)
    assert stop.push([5]) == ([5, 6], None)  # [5, 6, 5] can only still complete as [5, 6, 7]
    assert stop.push([99, 4]) == ([5], "stop")  # end id: held tokens are real output
    assert stop.committed == 5


def test_stop_conditions_budget():
    stop = StopConditions(end_ids=(), stop_words=[(2, 9)], max_tokens=3)
    assert stop.push([1]) == ([1], None)
    assert stop.remaining == 2
    assert stop.push([2, 3, 4]) == ([2, 3], "length")


# ---- max_tokens and context limit ---------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 7, 11])
def test_max_tokens_is_exact(max_tokens, target, reference):
    steps, tokens = run_steps(self_draft_engine(target), SamplingParams(max_tokens=max_tokens))
    assert tokens == reference[:max_tokens]
    assert steps[-1].finish_reason == "length"
    stats = steps[-1].stats
    assert stats.num_output_tokens == max_tokens
    # Drafts never exceed the remaining budget, so every proposed draft was accepted and used.
    assert stats.total_accepted_draft_tokens == stats.total_draft_tokens == max_tokens - stats.target_forwards
    assert stats.target_forwards == 1 + math.ceil((max_tokens - 1) / (MAX_DRAFT_LEN + 1))


@pytest.mark.parametrize("max_tokens", [1, 4, 9])
def test_max_tokens_with_rejecting_drafters(max_tokens, target, reference):
    for drafter in (NgramDrafter(), DraftModelDrafter(tiny_llama(seed=3, num_layers=1))):
        tokens, stats = generate_all(
            solo_scheduler(Deployment(target, drafter, 6)), PROMPT, SamplingParams(max_tokens=max_tokens)
        )
        assert tokens == reference[:max_tokens]
        assert stats.num_output_tokens == max_tokens


@pytest.mark.parametrize("room", [1, 2, 5, 9])
def test_context_limit_finishes_with_length(room, target, reference):
    engine = self_draft_engine(target, max_context=len(PROMPT) + room)
    steps, tokens = run_steps(engine, SamplingParams(max_tokens=MAX_TOKENS))
    assert tokens == reference[:room]
    assert steps[-1].finish_reason == "length"


def test_max_context_defaults_to_max_position_embeddings(target):
    assert Deployment(target, NoDrafter(), 0).max_context == target.config.max_position_embeddings


# ---- request validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "input_ids, params, message",
    [
        ([], SamplingParams(max_tokens=4), "empty"),
        (list(range(20)), SamplingParams(max_tokens=4), "context limit"),
        ([1, 64], SamplingParams(max_tokens=4), "vocabulary"),
        ([1, -1], SamplingParams(max_tokens=4), "vocabulary"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2], SamplingParams(max_tokens=-3), "max_tokens"),
        ([1, 2], SamplingParams(max_tokens=4, greedy=False, top_k=-1), "top_k"),
        ([1, 2], SamplingParams(max_tokens=4, greedy=False, top_p=0.0), "top_p"),
        ([1, 2], SamplingParams(max_tokens=4, greedy=False, top_p=1.5), "top_p"),
        ([1, 2], SamplingParams(max_tokens=4, greedy=False, temperature=0.0), "temperature"),
        ([1, 2], SamplingParams(max_tokens=4, greedy=False, temperature=-1.0), "temperature"),
        ([1, 2], SamplingParams(max_tokens=4, bad_words=((100,),)), "bad_words"),
    ],
)
def test_invalid_requests_raise_value_error_at_once(input_ids, params, message, target):
    engine = Deployment(target, NoDrafter(), 0, max_context=20)
    with pytest.raises(ValueError, match=message):
        generate(solo_scheduler(engine), input_ids, params)


def test_greedy_ignores_temperature(target, reference):
    engine = Deployment(target, NoDrafter(), 0)
    tokens, _ = generate_all(solo_scheduler(engine), PROMPT, SamplingParams(max_tokens=5, temperature=0.0))
    assert tokens == reference[:5]


@pytest.mark.parametrize("max_draft_len, max_context", [(-1, None), (2, 1)])
def test_invalid_engine_settings(max_draft_len, max_context, target):
    with pytest.raises(ValueError):
        Deployment(target, NoDrafter(), max_draft_len, max_context=max_context)
