"""Logits processing and the speculative sampling rule: committed tokens must be distributed as the
target's processed distribution p, whatever the drafter proposes."""

from __future__ import annotations

import math

import pytest
import torch
from reference_decoding import next_token_logits
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.scheduler.batch_request import PositionKeyedChooser
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.runtime.cpu.verify.accept import accept_block, chain_tree
from specpipe.runtime.cpu.verify.sampling import TokenSampler, top_k_filter, top_p_filter

pytestmark = pytest.mark.usefixtures("single_thread")


NEG_INF = float("-inf")


def chi_square_bound(degrees_of_freedom: int) -> float:
    """Upper 0.1% quantile of the chi-square distribution (Wilson-Hilferty approximation)."""
    d = degrees_of_freedom
    return d * (1 - 2 / (9 * d) + 3.09 * math.sqrt(2 / (9 * d))) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of ``counts`` against ``probs`` with cells expecting < 5 merged; fails outright
    when a zero-probability cell was observed. Returns (statistic, degrees of freedom)."""
    total = counts.sum()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was sampled"
    expected = probs.double() * total
    small = (expected < 5) & (probs > 0)
    observed_cells = torch.cat([counts[expected >= 5].double(), counts[small].sum().double().reshape(1)])
    expected_cells = torch.cat([expected[expected >= 5], expected[small].sum().reshape(1)])
    keep = expected_cells > 0
    observed_cells, expected_cells = observed_cells[keep], expected_cells[keep]
    statistic = float(((observed_cells - expected_cells) ** 2 / expected_cells).sum())
    return statistic, int(keep.sum()) - 1


def assert_distributed_as(counts: torch.Tensor, probs: torch.Tensor) -> None:
    statistic, dof = chi_square(counts, probs)
    assert statistic < chi_square_bound(dof), f"chi-square {statistic:.1f} with {dof} degrees of freedom"


def assert_distinguishable(wrong: torch.Tensor, right: torch.Tensor, samples: int) -> None:
    """Sanity of a statistical test: samples from ``wrong`` would fail the check against ``right``."""
    statistic = samples * float(((wrong - right) ** 2 / right.clamp_min(1e-12)).sum())
    assert statistic > 4 * chi_square_bound(int((right > 0).sum()) - 1)


# ---- logits processing, on hand-made logits -------------------------------------------------------


def test_top_k_keeps_k_largest_and_ties():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    assert torch.equal(
        top_k_filter(logits, 3),
        torch.tensor([[NEG_INF, 3.0, 2.0, 3.0, NEG_INF], [NEG_INF, NEG_INF, 2.0, 3.0, 4.0]]),
    )
    assert torch.equal(top_k_filter(logits, 1)[0], torch.tensor([NEG_INF, 3.0, NEG_INF, 3.0, NEG_INF]))
    assert torch.equal(top_k_filter(logits, 0), logits)
    assert torch.equal(top_k_filter(logits, 5), logits)


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.45, {0}),
        (0.55, {0, 3}),
        (0.75, {0, 3, 1}),
        (0.9, {0, 3, 1, 4}),
        (0.97, {0, 3, 1, 4, 2}),
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_smallest_nucleus(top_p, kept):
    probs = torch.tensor([0.5, 0.15, 0.05, 0.2, 0.1])
    filtered = top_p_filter(probs.log().unsqueeze(0), top_p)[0]
    assert {i for i in range(5) if filtered[i] > NEG_INF} == kept
    assert torch.allclose(filtered[list(kept)], probs.log()[list(kept)])


def test_processing_order_bad_words_temperature_top_k_top_p():
    logits = torch.tensor([[4.0, 2.0, 1.0, 0.0, -1.0, 3.0]])
    params = SamplingParams(max_tokens=1, greedy=False, temperature=2.0, top_k=4, top_p=0.8, bad_words=((0,),))
    probs = TokenSampler(params, torch.Generator()).distributions(logits)[0]
    # Bad word 0 removed; /2 -> [-, 1, .5, 0, -.5, 1.5]; top-4 keeps tokens 5, 1, 2, 3.
    scaled = torch.tensor([1.5, 1.0, 0.5, 0.0])  # tokens 5, 1, 2, 3
    top4 = scaled.softmax(0)  # 0.455, 0.276, 0.167, 0.101: top-p 0.8 keeps tokens 5, 1, 2
    assert top4[0] + top4[1] < 0.8 < top4[0] + top4[1] + top4[2]
    expected = torch.zeros(6)
    expected[[5, 1, 2]] = scaled[:3].softmax(0)
    assert torch.allclose(probs, expected, atol=1e-6)


def test_greedy_choice_masks_bad_words():
    params = SamplingParams(max_tokens=1, bad_words=((2,), (0, 1)))
    token, probs = TokenSampler(params, torch.Generator()).choose(torch.tensor([[0.0, 1.0, 5.0, 4.0]]))
    assert (token, probs) == (3, None)


# ---- the accept rule, empirically ------------------------------------------------------------------


def random_distribution(generator: torch.Generator, size: int, sparsity: float = 0.0) -> torch.Tensor:
    weights = torch.rand(size, generator=generator) ** 3
    weights[torch.rand(size, generator=generator) < sparsity] = 0.0
    weights[int(torch.randint(size, (1,), generator=generator))] += 0.1
    return weights / weights.sum()


def test_the_exact_rule_commits_the_targets_distribution_whatever_the_drafts():
    """A chain of 2 fixed drafts (the first one likely, so the second row is reached often) verified by
    the exact rule with the position-keyed draws of one seed per run: the first committed token is
    distributed as p[0], and the second, after an accepted first draft, as p[1]; always accepting the
    first draft would be told apart."""
    generator = torch.Generator().manual_seed(11)
    vocab, samples = 8, 3000
    p = torch.stack([random_distribution(generator, vocab, sparsity=0.2) for _ in range(3)])
    drafts = [int(p[0].argmax()), 2]
    params = SamplingParams(max_tokens=4, greedy=False)
    first = torch.zeros(vocab, dtype=torch.long)
    second = torch.zeros(vocab, dtype=torch.long)
    for seed in range(samples):
        path, token = accept_block(chain_tree(drafts), p.log(), PositionKeyedChooser(params, seed), first_position=0)
        committed = [*drafts[: len(path)], token]
        first[committed[0]] += 1
        if path:
            second[committed[1]] += 1
    assert_distributed_as(first, p[0])
    assert_distributed_as(second, p[1])
    assert_distinguishable(torch.nn.functional.one_hot(torch.tensor(drafts[0]), vocab).float(), p[0], samples)


# ---- the engine, end to end ------------------------------------------------------------------------

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def small_vocab_models():
    # A milder init than the default keeps p and q overlapping, so both accepts and rejects happen.
    return (
        tiny_llama(seed=0, vocab_size=16, init_std=0.15),
        tiny_llama(seed=7, vocab_size=16, num_layers=1, init_std=0.15),
    )


def second_token_marginal(model, prompt: list[int], sampler: TokenSampler) -> torch.Tensor:
    """Exact distribution of the 2nd generated token: sum over t1 of p(t1 | prompt) p(x | prompt, t1)."""
    with torch.inference_mode():
        vocab = model.config.vocab_size
        first = sampler.distributions(next_token_logits(model, prompt).unsqueeze(0))[0]
        batch = torch.tensor([prompt + [t] for t in range(vocab)])
        second = sampler.distributions(model(batch).logits[:, -1].float())
        return first @ second


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=3, greedy=False, temperature=1.0),
        SamplingParams(max_tokens=3, greedy=False, temperature=0.8, top_k=6, top_p=0.9),
    ],
    ids=["plain", "top-k-top-p"],
)
def test_engine_second_token_follows_target(params, small_vocab_models):
    """With max_tokens=3 the second token comes out of a 1-token draft-model verification."""
    target, draft = small_vocab_models
    scheduler = solo_scheduler(Deployment(target, DraftModelDrafter(draft), max_draft_len=2))
    sampler = TokenSampler(params, torch.Generator())
    expected = second_token_marginal(target, PROMPT, sampler)
    always_accepted = second_token_marginal_of_draft(target, draft, PROMPT, sampler)
    runs = 1200
    counts = torch.zeros(16, dtype=torch.long)
    proposed = accepted = 0
    for seed in range(runs):
        tokens, stats = generate_all(scheduler, PROMPT, SamplingParams(**{**params.__dict__, "seed": seed}))
        counts[tokens[1]] += 1
        proposed += stats.total_draft_tokens
        accepted += stats.total_accepted_draft_tokens
    assert proposed == runs  # one draft token per request: the budget leaves room for exactly one
    assert 0 < accepted < runs
    assert_distributed_as(counts, expected)
    assert_distinguishable(always_accepted, expected, runs)


def second_token_marginal_of_draft(target, draft, prompt, sampler) -> torch.Tensor:
    """What an always-accept rule would give: t1 ~ p, then t2 ~ q(. | prompt, t1)."""
    with torch.inference_mode():
        first = sampler.distributions(next_token_logits(target, prompt).unsqueeze(0))[0]
        batch = torch.tensor([prompt + [t] for t in range(target.config.vocab_size)])
        return first @ sampler.distributions(draft(batch).logits[:, -1].float())


def test_plain_sampling_matches_reference_loop():
    """Without drafts the scheduler draws exactly as a plain sampling loop with the request's position-keyed
    uniforms (output index j draws with ``position_uniform(seed, j)``)."""
    model = tiny_llama(seed=3)
    params = SamplingParams(max_tokens=25, greedy=False, temperature=0.9, top_k=20, top_p=0.95, seed=1234)
    ids = list(PROMPT)
    chooser = PositionKeyedChooser(params, 1234, history=ids)
    for position in range(25):
        ids.append(int(chooser.choose_at(next_token_logits(model, ids).unsqueeze(0), [position])[0]))
    tokens, _ = generate_all(solo_scheduler(Deployment(model, NoDrafter(), 0)), PROMPT, params)
    assert tokens == ids[len(PROMPT) :]


def test_self_draft_sampling_accepts_almost_everything():
    model = tiny_llama(seed=3)
    engine = Deployment(model, DraftModelDrafter(model), 4)
    params = SamplingParams(max_tokens=60, greedy=False, temperature=1.0, top_p=0.9, seed=0)
    _, stats = generate_all(solo_scheduler(engine), PROMPT, params)
    assert stats.total_draft_tokens >= 40
    assert stats.acceptance_rate >= 0.95


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_seed_makes_sampling_reproducible(drafter):
    model = tiny_llama(seed=3, init_std=0.2)

    def run(seed):
        chosen = NgramDrafter() if drafter == "ngram" else DraftModelDrafter(tiny_llama(seed=4, num_layers=1))
        engine = Deployment(model, chosen, 3)
        return generate_all(solo_scheduler(engine), PROMPT * 3, SamplingParams(max_tokens=30, greedy=False, seed=seed))

    first, stats = run(10)
    assert run(10)[0] == first
    assert run(11)[0] != first
    assert stats.total_draft_tokens > 0
