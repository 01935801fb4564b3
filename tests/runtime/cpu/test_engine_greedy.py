"""Greedy speculative decoding must reproduce plain greedy decoding of the target, token for token."""

from __future__ import annotations

import math

import pytest
import torch
from reference_decoding import greedy_reference
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.scheduler.one_request import generate, generate_all, solo_scheduler
from specpipe.runtime.cpu.verify.sampling import TokenSampler

pytestmark = pytest.mark.usefixtures("single_thread")


PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
REPETITIVE_PROMPT = [5, 6, 7, 8] * 6
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def other_draft():
    return tiny_llama(seed=1, num_layers=1)


@pytest.fixture(scope="module")
def reference(target):
    return greedy_reference(target, PROMPT, MAX_TOKENS)


def make_drafter(kind, target, other_draft):
    return {
        "none": lambda: NoDrafter(),
        "ngram": lambda: NgramDrafter(max_matching_ngram_size=3),
        "draft-model": lambda: DraftModelDrafter(other_draft),
        "self-draft": lambda: DraftModelDrafter(target),
    }[kind]()


@pytest.mark.parametrize("max_draft_len", [1, 3, 5])
@pytest.mark.parametrize("kind", ["none", "ngram", "draft-model", "self-draft"])
def test_greedy_matches_plain_decoding(kind, max_draft_len, target, other_draft, reference):
    engine = Deployment(target, make_drafter(kind, target, other_draft), max_draft_len)
    tokens, stats = generate_all(solo_scheduler(engine), PROMPT, SamplingParams(max_tokens=MAX_TOKENS))
    assert tokens == reference
    assert stats.num_output_tokens == MAX_TOKENS
    assert stats.total_accepted_draft_tokens <= stats.total_draft_tokens
    if kind == "none":
        assert stats.total_draft_tokens == 0
        assert stats.target_forwards == MAX_TOKENS


def test_reference_agrees_with_transformers_generate(target, reference):
    generated = target.generate(
        torch.tensor([PROMPT]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert generated[0, len(PROMPT) :].tolist() == reference


def test_speculative_matches_transformers_generate(target, other_draft):
    generated = target.generate(
        torch.tensor([REPETITIVE_PROMPT]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    engine = Deployment(target, DraftModelDrafter(other_draft), 4)
    tokens, _ = generate_all(solo_scheduler(engine), REPETITIVE_PROMPT, SamplingParams(max_tokens=24))
    assert tokens == generated[0, len(REPETITIVE_PROMPT) :].tolist()


def test_self_draft_accepts_everything(target):
    max_draft_len = 4
    engine = Deployment(target, DraftModelDrafter(target), max_draft_len)
    tokens, stats = generate_all(solo_scheduler(engine), PROMPT, SamplingParams(max_tokens=MAX_TOKENS))
    assert stats.total_draft_tokens > 0
    assert stats.acceptance_rate == 1.0
    # Prefill gives 1 token, then every step commits max_draft_len + 1 (the last step fewer).
    assert stats.target_forwards == 1 + math.ceil((MAX_TOKENS - 1) / (max_draft_len + 1))
    assert stats.mean_accepted_length > max_draft_len


def test_ngram_drafts_are_accepted_on_repetitive_text():
    target = tiny_llama(seed=0, init_std=0.2)
    reference = greedy_reference(target, REPETITIVE_PROMPT, 48)
    engine = Deployment(target, NgramDrafter(), 4)
    tokens, stats = generate_all(solo_scheduler(engine), REPETITIVE_PROMPT, SamplingParams(max_tokens=48))
    assert tokens == reference
    assert stats.total_accepted_draft_tokens > 0
    assert stats.target_forwards < 48


@pytest.mark.parametrize("kind", ["none", "ngram", "self-draft"])
def test_bad_words_are_never_generated(kind, target, other_draft, reference):
    banned = (reference[0], reference[3])
    params = SamplingParams(max_tokens=MAX_TOKENS, bad_words=((banned[0],), (banned[1],), (1, 2)))
    engine = Deployment(target, make_drafter(kind, target, other_draft), 4)
    tokens, stats = generate_all(solo_scheduler(engine), PROMPT, params)
    assert tokens == greedy_reference(target, PROMPT, MAX_TOKENS, banned_ids=banned)
    assert not set(banned) & set(tokens)
    if kind == "self-draft":
        # The draft masks bad words too, otherwise it would propose them and be rejected.
        assert stats.acceptance_rate == 1.0


def test_top_k_one_is_greedy(target, reference):
    engine = Deployment(target, NgramDrafter(), 3)
    params = SamplingParams(max_tokens=MAX_TOKENS, greedy=False, top_k=1, temperature=0.7, seed=3)
    tokens, _ = generate_all(solo_scheduler(engine), PROMPT, params)
    assert tokens == reference


def test_stats_are_cumulative_and_consistent(target, other_draft):
    engine = Deployment(target, DraftModelDrafter(other_draft), 3)
    steps = list(generate(solo_scheduler(engine), REPETITIVE_PROMPT, SamplingParams(max_tokens=30)))
    returned = 0
    for number, step in enumerate(steps, start=1):
        returned += len(step.token_ids)
        assert 1 <= len(step.token_ids) <= 3 + 1
        assert step.stats.target_forwards == number
        assert step.stats.num_output_tokens == returned
        assert step.stats.num_input_tokens == len(REPETITIVE_PROMPT)
        assert step.stats.total_accepted_draft_tokens <= step.stats.total_draft_tokens
        assert step.finished == (number == len(steps))
    final = steps[-1].stats
    assert final.num_output_tokens == 30
    # Every committed token is either an accepted draft or the one target token of a forward pass.
    assert final.total_accepted_draft_tokens + final.target_forwards == 30


def _sampler():
    return TokenSampler(SamplingParams(max_tokens=1), torch.Generator())


def test_ngram_proposes_after_most_recent_occurrence():
    drafter = NgramDrafter(max_matching_ngram_size=3)
    context = [1, 2, 3, 10, 11, 1, 2, 3, 20, 21, 22, 1, 2, 3]
    drafter.reset(context)
    assert drafter.propose_chain(context, 2, _sampler()).tokens == [20, 21]
    assert drafter.propose_chain(context, 10, _sampler()).tokens == [20, 21, 22, 1, 2, 3]


def test_ngram_falls_back_to_shorter_ngrams_and_grows_incrementally():
    drafter = NgramDrafter(max_matching_ngram_size=3)
    context = [7, 8, 9, 4, 5, 6, 9]
    drafter.reset(context)
    # No earlier [5, 6, 9] or [6, 9]; the unigram [9] occurred at index 2.
    assert drafter.propose_chain(context, 3, _sampler()).tokens == [4, 5, 6]
    context += [30]
    assert drafter.propose_chain(context, 3, _sampler()).tokens == []
    context += [8, 9]
    # [8, 9] occurred at index 1; the latest [9] would be index 6 but the bigram match wins.
    assert drafter.propose_chain(context, 2, _sampler()).tokens == [4, 5]


def test_ngram_draft_is_deterministic_one_hot():
    drafter = NgramDrafter()
    context = [1, 2, 1]
    drafter.reset(context)
    draft = drafter.propose_chain(context, 4, _sampler())
    assert draft.tokens == [2, 1]
    assert draft.probs is None


def test_draft_vocabulary_must_match(target):
    with pytest.raises(ValueError, match="vocabulary"):
        Deployment(target, DraftModelDrafter(tiny_llama(seed=2, vocab_size=80)), 3)
