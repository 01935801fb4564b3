"""The bf16 argmax screen of greedy logits: its error bound holds, its argmax is the exact one, and the
scheduler's greedy output is the same with it as without it."""

from __future__ import annotations

import pytest
import torch
from batch_helpers import make_engine, prompts, scheduler_for, submit
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.model.argmax_screen import MAX_SCREENED_ROWS, ArgmaxScreen
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.prepack import bf16_prepack_available, prepack_linear_layers
from specpipe.runtime.cpu.verify.sampling import TokenSampler

GREEDY = SamplingParams(max_tokens=24)
needs_bf16 = pytest.mark.skipif(not bf16_prepack_available(), reason="this CPU has no native bf16 linear layers")


def weights_and_states(seed: int, vocab: int = 4096, hidden: int = 96, rows: int = 16):
    """A weight whose rows span three orders of magnitude, and hidden states of every scale from
    tiny to large, some rows nearly parallel to a weight row (a clear winner) and some not."""
    generator = torch.Generator().manual_seed(seed)
    weight = (
        torch.randn(vocab, hidden, generator=generator)
        * torch.logspace(-2, 1, vocab)[torch.randperm(vocab, generator=generator), None]
    )
    states = torch.randn(rows, hidden, generator=generator) * torch.logspace(-3, 2, rows)[:, None]
    states[: rows // 2] += 3 * weight[torch.randint(vocab, (rows // 2,), generator=generator)]
    return weight, states


def exact_logits(weight: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    return states.double() @ weight.double().T


@needs_bf16
@pytest.mark.parametrize("seed", range(4))
def test_the_screen_stays_within_its_error_bound(seed):
    weight, states = weights_and_states(seed)
    screen = ArgmaxScreen(weight)
    scores = screen.screen(states)
    best, bound = screen.error_bound(states, scores)
    assert torch.equal(best[:, 0], scores.float().amax(dim=1))
    error = (scores.double() - exact_logits(weight, states)).abs()
    assert bool((error <= bound.double()).all())
    assert float((error / bound.double()).max()) > 0.01  # the bound is not vacuous either


@needs_bf16
@pytest.mark.parametrize("seed", range(4))
def test_its_argmax_is_the_exact_argmax_and_the_kept_values_are_exact(seed):
    weight, states = weights_and_states(seed)
    exact = exact_logits(weight, states)
    logits = ArgmaxScreen(weight).logits(states)[0]
    assert torch.equal(logits.argmax(dim=1), exact.argmax(dim=1))
    kept = torch.isfinite(logits)
    assert torch.equal(logits[kept], exact[kept].float())
    assert int(kept.sum(dim=1).max()) < weight.shape[0] // 4  # the screen does drop tokens


@needs_bf16
@pytest.mark.parametrize("scale", [1e-38, 1e-36, 2.0**-100, 1e-20])
def test_rows_too_small_for_float32_squares_or_bf16_products_keep_the_exact_argmax(scale):
    """Below about 1e-19 a row's float32 norm underflows to 0, and below 2**-126 the kernel may flush
    inputs, products and outputs to zero: the bound must still hold (or the row go to the full lm_head)."""
    weight, states = weights_and_states(8)
    states = states * scale
    logits, left_out = ArgmaxScreen(weight).logits(states)
    exact = exact_logits(weight, states).argmax(dim=1)
    kept = ~left_out
    assert torch.equal(logits[kept].argmax(dim=1), exact[kept])


@needs_bf16
def test_near_ties_are_decided_by_the_exact_scores():
    """Two rows 1e-6 apart score within the screen's error: both are kept, and the exact scores decide,
    ties going to the lower id as torch.argmax does."""
    weight, states = weights_and_states(5, rows=4)
    state = states[0]
    best = int(exact_logits(weight, state[None]).argmax())
    for delta, expected in ((1e-6, "twin"), (-1e-6, "best"), (0.0, "lower")):
        w = torch.cat([weight, weight[best : best + 1] * (1 + delta)])
        twin = w.shape[0] - 1
        chosen = int(ArgmaxScreen(w).logits(state[None])[0].argmax())
        truth = int(exact_logits(w, state[None]).argmax())
        assert chosen == truth == {"twin": twin, "best": best, "lower": best}[expected]


@needs_bf16
def test_a_row_screens_the_same_alone_and_among_others():
    weight, states = weights_and_states(6)
    screen = ArgmaxScreen(weight)
    together = screen.logits(states)[0]
    for i in range(len(states)):
        assert torch.equal(screen.logits(states[i : i + 1])[0][0], together[i])


@needs_bf16
def test_rows_that_keep_too_many_tokens_or_are_not_finite_are_left_to_the_full_lm_head():
    weight, states = weights_and_states(7, rows=4)
    states[1] = 0.0  # every token scores 0: all of them could win
    states[2, 0] = float("nan")
    logits, left_out = ArgmaxScreen(weight).logits(states)
    assert left_out.tolist() == [False, True, True, False]
    assert bool(torch.isinf(logits[1:3]).all())
    for row in range(4):  # one row alone (counted without tensor ops) is left out alike
        alone, alone_left_out = ArgmaxScreen(weight).logits(states[row : row + 1])
        assert alone_left_out.tolist() == [left_out[row].item()] and torch.equal(alone[0], logits[row])
    model = tiny_llama(2, vocab_size=512, tie_word_embeddings=True)
    lm = BatchedLM(model, 1)
    hidden = torch.randn(3, model.config.hidden_size)
    hidden[1] = 0.0
    mixed = lm.project(hidden, [True, True, False])
    full = lm.project(hidden)
    assert torch.equal(mixed[1:], full[1:]) and int(mixed[0].argmax()) == int(full[0].argmax())
    greedy = lm.project(hidden, [True, True, True])  # every row greedy: the screen's own output
    assert torch.equal(greedy[1], full[1]) and torch.equal(greedy.argmax(dim=1), full.argmax(dim=1))


def test_only_a_tied_fp32_lm_head_is_screened():
    assert ArgmaxScreen.for_model(tiny_llama(0)) is None  # untied: no dense fp32 copy to rescore with
    tied = tiny_llama(0, tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    screen = ArgmaxScreen.for_model(tied)
    assert (screen is not None) == bf16_prepack_available()
    with pytest.raises(ValueError, match="float32"):
        ArgmaxScreen(tied.lm_head.weight.to(torch.bfloat16))


@needs_bf16
def test_batched_projection_screens_only_the_argmax_rows_of_a_prepacked_model():
    model = tiny_llama(2, vocab_size=256, tie_word_embeddings=True)
    prepack_linear_layers(model.model)
    prepack_linear_layers(model)
    lm = BatchedLM(model, 2)
    slots = [lm.allocate(), lm.allocate()]
    hidden = lm.hidden([BatchEntry(slots[0], [5, 9, 11]), BatchEntry(slots[1], [7, 3])])
    full = lm.project(hidden)
    mixed = lm.project(hidden, [True, False, True, False, True])
    assert torch.equal(mixed[[1, 3]], full[[1, 3]])
    assert torch.equal(mixed[[0, 2, 4]].argmax(dim=1), full[[0, 2, 4]].argmax(dim=1))
    assert bool(torch.isinf(mixed[[0, 2, 4]]).any(dim=1).all())
    assert torch.equal(lm.project(hidden, [False] * 5), full)
    many = torch.randn(MAX_SCREENED_ROWS + 1, model.config.hidden_size)
    assert torch.equal(lm.project(many, [True] * len(many)), lm.project(many))  # past the cap: the full lm_head


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(max_tokens=4), True),
        (SamplingParams(max_tokens=4, greedy=False, temperature=0.7), False),
        (SamplingParams(max_tokens=4, bad_words=((3,),)), False),
        (SamplingParams(max_tokens=4, repetition_penalty=1.2), False),
        (SamplingParams(max_tokens=4, min_tokens=2, end_id=2), False),
        (SamplingParams(max_tokens=4, greedy=False, top_k=1), True),
    ],
)
def test_only_plain_greedy_requests_are_argmax_only(params, expected):
    assert TokenSampler(params, torch.Generator()).argmax_only is expected


@needs_bf16
@pytest.mark.parametrize("method", ["none", "ngram", "draft-model", "medusa", "eagle"])
def test_the_schedulers_output_is_the_same_without_the_screen(method, monkeypatch):
    engine = make_engine(method)
    sampled = SamplingParams(max_tokens=GREEDY.max_tokens, greedy=False, temperature=0.8, seed=5)
    batch = [(p, GREEDY if i != 3 else sampled) for i, p in enumerate(prompts(8, seed=4))]
    outputs, calls = [], []
    original = ArgmaxScreen.logits
    monkeypatch.setattr(
        ArgmaxScreen, "logits", lambda self, hidden: calls.append(len(hidden)) or original(self, hidden)
    )
    for screened in (True, False):
        scheduler = scheduler_for(engine)
        # the tiny engines' lm_head is untied (a tied random model only repeats itself): screen it directly
        scheduler.lm.argmax_screen = ArgmaxScreen(scheduler.lm.model.lm_head.weight) if screened else None
        outs = [submit(scheduler, prompt, params)[1] for prompt, params in batch]
        scheduler.run_until_idle()
        assert all(o.error is None and len(o.tokens) == GREEDY.max_tokens for o in outs)
        outputs.append([o.tokens for o in outs])
    assert calls and outputs[0] == outputs[1]
    assert len({tuple(t) for t in outputs[0]}) == len(batch)
