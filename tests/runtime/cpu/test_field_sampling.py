"""Issue 34's field kinds on tiny random models, through the batch scheduler that serves Triton's requests,
for every CPU method (:data:`batch_helpers.METHODS`) and a self-drafting chain whose drafts are all
accepted (so that every step commits several tokens): multi-token bad words matched across draft
positions, alone and in a batch; seeded sampling identical alone, in a batch and across methods for many
seeds (each method's text is the plain target's sample: the distribution is the target's); unseeded
requests differ; the position-keyed sampler draws the target's distribution; penalties and
``min_tokens`` see every token a step commits (oracle drafters, chain and tree, whose whole blocks are
accepted exactly when each verified row sees the drafts before it). The real model's methods:
``tests/runtime/cpu/test_field_kinds_smollm2.py``."""

from __future__ import annotations

import pytest
import torch
from batch_helpers import METHODS, make_engine, make_engine_of, prompts, run_alone, run_batch, scheduler_for, submit
from reference_decoding import greedy_reference
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import Draft, Drafter, DraftModelDrafter, NoDrafter
from specpipe.runtime.cpu.drafters.tree_drafter import TreeDrafter
from specpipe.runtime.cpu.scheduler.batch_request import PositionKeyedChooser
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.runtime.cpu.scheduler.scheduler import Cancelled
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree

pytestmark = pytest.mark.usefixtures("single_thread")

ALL = (*METHODS, "self-draft")


def engine_of(method: str):
    if method == "self-draft":
        model = tiny_llama(3, vocab_size=64)
        return Deployment(model, DraftModelDrafter(model), 4)
    return make_engine(method)


def test_a_multi_token_bad_word_bans_its_last_token_after_the_rest_in_each_rows_history():
    sampler = TokenSampler(
        SamplingParams(max_tokens=4, bad_words=((8, 9), (7, 8, 10), (11,))), torch.Generator(), history=[1, 7, 8]
    )
    logits = torch.zeros(4, 16)
    masked = sampler.greedy_logits(logits, [[], [9], [9, 8], [9, 7, 8]])
    banned = [set(torch.nonzero(torch.isinf(row)).flatten().tolist()) for row in masked]
    assert banned == [{9, 10, 11}, {11}, {9, 11}, {9, 10, 11}]
    assert not sampler.argmax_only  # the screened lm_head would not see the bans
    sampled = TokenSampler(
        SamplingParams(max_tokens=4, greedy=False, bad_words=((8, 9),)), torch.Generator(), history=[8]
    )
    assert sampled.distributions(logits[:2], [[], [9]])[:, 9].tolist() == [0.0, 1 / 16]


@pytest.mark.parametrize("method", ALL)
def test_multi_token_bad_words_are_never_completed_alone_or_in_a_batch(method):
    """Each prompt's bad words are taken from its own free output (a 2- and a 3-token sequence, so the
    engine would complete them): the output is plain greedy decoding that never completes them."""
    engine = engine_of(method)
    model = engine.target.model
    batch = []
    for prompt in prompts(4, seed=4):
        free = greedy_reference(model, prompt, 16)
        start = next(i for i in range(2, 12) if free[i : i + 2] not in [free[j : j + 2] for j in range(i)])
        words = (tuple(free[start : start + 2]), tuple(free[start + 5 : start + 8]))
        batch.append((prompt, SamplingParams(max_tokens=16, bad_words=words)))
    outs = run_batch(engine, batch)
    for (prompt, params), out in zip(batch, outs):
        expected = greedy_reference(model, prompt, 16, bad_words=params.bad_words)
        assert expected != greedy_reference(model, prompt, 16)  # the bad words changed the text
        assert out.error is None and out.tokens == expected
        assert run_alone(engine, prompt, params) == expected
        text = [*prompt, *out.tokens]
        for words in params.bad_words:
            assert all(tuple(text[i : i + len(words)]) != words for i in range(len(prompt) - len(words) + 1, len(text)))
    if method == "self-draft":
        assert sum(o.stats.total_accepted_draft_tokens for o in outs) > 16  # steps committed several tokens


def test_a_bad_word_inside_a_block_of_accepted_drafts_is_rejected_there():
    """The self-drafting chain drafts its own greedy text, bad word included (its drafts do not see the
    word's first token as history): the target rejects the draft that completes it, in the same step."""
    engine = engine_of("self-draft")
    prompt = prompts(2, seed=4)[1]
    free = run_alone(engine, prompt, SamplingParams(max_tokens=12))
    word = tuple(free[2:4])  # inside the first decoding block (output 1 .. 5)
    params = SamplingParams(max_tokens=12, bad_words=(word,))
    [out] = run_batch(engine, [(prompt, params)])
    assert (
        out.tokens == greedy_reference(engine.target.model, prompt, 12, bad_words=(word,))
        and out.tokens[:3] == free[:3]
    )
    assert out.tokens[3] != free[3]


@pytest.mark.parametrize("method", ALL)
def test_seeded_sampling_is_the_plain_targets_sample_for_every_seed_alone_and_in_a_batch(method):
    """For each seed, a method's sampled text equals the plain target's (no drafts at all): speculation
    keeps the target's distribution sample by sample; and a request's text does not depend on its batch."""
    engine = engine_of(method)
    plain = Deployment(engine.target.model, NoDrafter(), 0)
    ps = prompts(6, seed=6)
    batch = [
        (p, SamplingParams(max_tokens=12, greedy=False, temperature=t, top_p=top_p, seed=seed))
        for seed, (p, t, top_p) in enumerate(zip(ps, (1.0, 0.7, 1.3, 1.0, 0.9, 1.0), (1.0, 0.9, 1.0, 0.8, 1.0, 1.0)))
    ]
    outs = run_batch(engine, batch, max_batch_size=3)  # joins as others finish
    for (prompt, params), out in zip(batch, outs):
        assert out.error is None and len(out.tokens) == 12
        assert out.tokens == run_alone(engine, prompt, params) == run_alone(plain, prompt, params)


@pytest.mark.parametrize("method", ALL)
def test_unseeded_requests_differ_from_each_other(method):
    engine = engine_of(method)
    prompt = prompts(2, seed=7)[1]
    outs = run_batch(engine, [(prompt, SamplingParams(max_tokens=16, greedy=False, temperature=1.5))] * 4)
    assert len({tuple(o.tokens) for o in outs}) == 4


def test_the_position_keyed_sampler_draws_the_processed_target_distribution():
    """Token frequencies over many seeds against the processed distribution (temperature, top-k)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -9.0]])
    params = SamplingParams(max_tokens=4, greedy=False, temperature=0.8, top_k=6)
    expected = TokenSampler(params, torch.Generator()).distributions(logits)[0]
    draws = 20000
    counts = torch.zeros(8)
    for seed in range(draws // 4):
        chooser = PositionKeyedChooser(params, seed)
        for token in chooser.choose_at(logits.repeat(4, 1), [0, 1, 2, 3]).tolist():
            counts[token] += 1
    observed = counts / draws
    assert counts[6:].sum() == 0  # outside the top 6: never
    sigma = (expected * (1 - expected) / draws).sqrt()
    assert ((observed - expected).abs() <= 4 * sigma + 1e-9).all(), (observed, expected)


class ChainOracle(Drafter):
    """Proposes the continuation of whichever known text the context starts (every draft right)."""

    def __init__(self, texts):
        self.texts = texts

    def propose_chain(self, context_ids, k, sampler):
        n = len(context_ids)
        return Draft(next((t[n : n + k] for t in self.texts if t[:n] == context_ids), []))


class TreeOracle(TreeDrafter):
    """A wrong first root child, then the known continuation as the second child's chain."""

    def __init__(self, texts):
        self.texts = texts

    def propose(self, context_ids, max_nodes, max_depth, sampler=None):
        n = len(context_ids)
        truth = next((t[n : n + max_depth] for t in self.texts if t[:n] == context_ids), [])
        if not truth:
            return DraftTree([], [])
        return DraftTree([(truth[0] + 1) % 64, *truth], [-1, -1, *range(1, len(truth))]).prune(max_depth, max_nodes)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_penalties_and_min_tokens_see_every_token_a_step_commits(kind):
    """Each request's text is the plain engine's (one token per step) under strong penalties and a
    ``min_tokens`` that ends inside a step; the oracle drafts that text, so every draft is accepted only
    if each verified row sees the step's drafts before it (a row blind to them chooses otherwise)."""
    model = tiny_llama(8, vocab_size=64)
    plain = Deployment(model, NoDrafter(), 0)
    ps = prompts(4, seed=8)
    free = generate_all(solo_scheduler(plain), ps[3], SamplingParams(max_tokens=20))[0]
    end = next(t for i, t in enumerate(free) if i >= 6 and t not in free[:i])
    options = [
        SamplingParams(max_tokens=20, repetition_penalty=3.0),
        SamplingParams(max_tokens=20, frequency_penalty=1.5),
        SamplingParams(max_tokens=20, presence_penalty=2.0, frequency_penalty=0.5),
        SamplingParams(max_tokens=20, min_tokens=free.index(end), end_id=end),
    ]
    batch = list(zip(ps, options))
    expected = [generate_all(solo_scheduler(plain), p, params)[0] for p, params in batch]
    assert expected[3] == free[: free.index(end)]  # min_tokens let the end id end it where it first came
    assert all(
        e != generate_all(solo_scheduler(plain), p, SamplingParams(max_tokens=20))[0]
        for (p, _), e in zip(batch[:3], expected)
    )
    texts = [[*p, *e] for (p, _), e in zip(batch, expected)]
    engine = Deployment(model, ChainOracle(texts), 4) if kind == "chain" else Deployment(model, TreeOracle(texts), 6)
    outs = run_batch(engine, batch, adaptive=False)
    for (prompt, params), out, want in zip(batch, outs, expected):
        assert out.error is None and out.tokens == want
        assert out.stats.total_accepted_draft_tokens >= len(want) // 2  # blocks of accepted drafts
        assert run_alone(engine, prompt, params, adaptive=False) == want


@pytest.mark.parametrize("method", ALL)
def test_a_request_cancelled_alone_mid_run_frees_its_slot_and_keeps_consistent_counters(method):
    """Cancelled while its step runs (the flag is set between steps by another thread; the step after
    drops it): the slot is free and empty, the counters it reported add up, and the next request in that
    slot gives what it gives alone."""
    engine = engine_of(method)
    prompt, other = prompts(2, seed=9)
    scheduler = scheduler_for(engine, max_batch_size=1, adaptive=False)
    request, out = submit(scheduler, prompt, SamplingParams(max_tokens=30))
    for _ in range(4):
        scheduler.step()
    slot = request.slot
    request.cancel()
    _, after = submit(scheduler, other, SamplingParams(max_tokens=8))
    scheduler.run_until_idle()
    assert isinstance(out.error, Cancelled) and out.reason is None and request.done and request.slot is None
    assert scheduler.lm.free_slots == 1 and scheduler.lm.lengths[slot] == 0
    stats = out.stats
    assert 0 < stats.num_output_tokens == len(out.tokens) < 30
    assert stats.total_accepted_draft_tokens <= stats.total_draft_tokens
    assert stats.num_output_tokens == stats.target_forwards + stats.total_accepted_draft_tokens
    assert after.tokens == run_alone(engine, other, SamplingParams(max_tokens=8), adaptive=False)


@pytest.mark.parametrize("method", ALL)
def test_the_warm_up_before_ready_runs_the_drafter_too(method, monkeypatch):
    """The Triton model warms its deployment up before it reports ready (``triton/models/warmup.py``) through
    the batch scheduler, drafting: the drafter's first proposals (its kernels, its state) and the batched
    verification of two requests are paid there, not by the first user requests."""
    from specpipe.runtime.cpu.model.batched_lm import BatchedLM
    from specpipe.triton.models.warmup import warm_up_deployment

    model = tiny_llama(3, vocab_size=256)  # the warm-up prompts use ids from 100 up
    engine = Deployment(model, DraftModelDrafter(model), 4) if method == "self-draft" else make_engine_of(method, model)
    calls, forwards = [], []
    propose, hidden = type(engine.drafter).propose, BatchedLM.hidden
    monkeypatch.setattr(type(engine.drafter), "propose", lambda self, *args: calls.append(args) or propose(self, *args))
    monkeypatch.setattr(
        BatchedLM,
        "hidden",
        lambda self, entries: forwards.append([len(e.token_ids) for e in entries]) or hidden(self, entries),
    )
    warm_up_deployment(engine, lengths=(10, 20), max_tokens=6)
    # Decoding entries are the last token and its drafts: 1 + at most 8 tokens, shorter than either prompt.
    # (a random model does not continue the prompts' cycle, so n-gram lookup finds nothing after the prefill)
    smallest = 1 if method in ("none", "ngram") else 2
    decoding = [sizes for sizes in forwards if all(smallest <= n <= 9 for n in sizes)]
    assert len(calls) >= (0 if method == "none" else 4)  # each warm-up request drafted, alone and in the batch
    assert any(len(sizes) == 1 for sizes in decoding) and any(len(sizes) == 2 for sizes in decoding)
