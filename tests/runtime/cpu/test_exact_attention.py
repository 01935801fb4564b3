"""A seeded sampled request's logits are bitwise the same whatever shares its batch and whatever it drafts.

Sampling with position-keyed uniforms (``runtime/cpu/scheduler/batch_request.py``) makes a seeded text depend on
nothing but its logits, so any rounding difference can flip a token where the uniform falls near a
boundary of the distribution (a fresh tester's seeded poem changed half-way when a copy of it shared the
batch). PyTorch's CPU flash attention rounds a row differently with one slot than with two, with keys
padded to another length, with another number of query rows and with masked keys between the valid
ones. These tests use SmolLM2's attention shapes (9 heads, 3 key/value heads of 64), where it does.
"""

import pytest
import torch
from batch_helpers import FLAT_COST, make_engine_of, run_alone, run_batch
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.model.attention_groups import EXACT_QUERY_ROWS, BatchEntry
from specpipe.runtime.cpu.model.batched_lm import BatchedLM
from specpipe.runtime.cpu.model.fused_projections import fuse_projections
from specpipe.runtime.cpu.model.prepack import prepack_available, prepack_linear_layers
from specpipe.runtime.cpu.scheduler.batch_request import PositionKeyedChooser
from specpipe.runtime.cpu.verify.tree_accept import DraftTree

VOCAB = 256
pytestmark = pytest.mark.skipif(not prepack_available(), reason="row-invariant linear layers need prepacked kernels")


def smollm2_shaped(seed: int = 5, layers: int = 2):
    """A random model with SmolLM2's attention shapes, its decoder fused and prepacked as the loader does
    (the lm_head is left to the caller: drafters copy its rows first)."""
    model = tiny_llama(
        seed, vocab_size=VOCAB, num_layers=layers, hidden_size=576, num_heads=9, num_kv_heads=3, init_std=0.05
    )
    fuse_projections(model.model)
    prepack_linear_layers(model.model)
    return model


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    model = smollm2_shaped()
    prepack_linear_layers(model)
    return model


def hidden_of(model, entries, target: int, prefix: dict[int, list[int]]) -> torch.Tensor:
    """The rows of ``entries[target]`` after prefilling each slot of ``prefix`` (its own forward each)."""
    lm = BatchedLM(model, 4, argmax_screen=False)
    for _ in range(4):
        lm.allocate()
    for slot, ids in prefix.items():
        lm.hidden([BatchEntry(slot, ids, exact=True)])
    out = lm.hidden(entries)
    start = sum(len(e.token_ids) for e in entries[:target])
    return out[start : start + len(entries[target].token_ids)]


def test_an_exact_rows_hidden_states_do_not_depend_on_the_batch_or_on_the_drafts(model):
    context, others = tokens(70, 1), {1: tokens(150, 2), 2: tokens(20, 3), 3: tokens(41, 4)}
    step = tokens(4, 9)
    alone = hidden_of(model, [BatchEntry(0, step[:1], exact=True)], 0, {0: context})
    compositions = [
        [BatchEntry(0, step[:1], exact=True), BatchEntry(1, [5], exact=True)],  # two slots, longer keys beside
        [BatchEntry(2, [7], exact=True), BatchEntry(0, step[:1], exact=True), BatchEntry(3, [8, 9, 10], exact=True)],
        [BatchEntry(1, [5]), BatchEntry(0, step[:1], exact=True), BatchEntry(2, [6, 7])],  # beside inexact entries
        [BatchEntry(0, step[:1], exact=True), BatchEntry(1, tokens(40, 5), exact=True)],  # beside a prompt chunk
        [BatchEntry(3, tokens(EXACT_QUERY_ROWS, 6), exact=True), BatchEntry(0, step[:1], exact=True)],  # 16 rows a slot
    ]
    for entries in compositions:
        target = next(i for i, e in enumerate(entries) if e.slot == 0)
        assert torch.equal(hidden_of(model, entries, target, {0: context, **others}), alone)
    # the same token verified as the first row of a chain of 4 (its drafts after it)
    chain = hidden_of(model, [BatchEntry(0, step, exact=True), BatchEntry(1, [5])], 0, {0: context, **others})
    assert torch.equal(chain[:1], alone)
    # and each later chain row as the token decoded alone after the ones before it
    assert torch.equal(chain[2:3], hidden_of(model, [BatchEntry(0, step[2:3], exact=True)], 0, {0: context + step[:2]}))


def test_an_exact_prompt_chunk_does_not_depend_on_the_batch(model):
    chunk = tokens(EXACT_QUERY_ROWS + 30, 6)
    alone = hidden_of(model, [BatchEntry(0, chunk, exact=True)], 0, {0: tokens(10, 7)})
    beside = [BatchEntry(1, [4]), BatchEntry(0, chunk, exact=True), BatchEntry(2, tokens(3, 8), exact=True)]
    assert torch.equal(hidden_of(model, beside, 1, {0: tokens(10, 7), 1: tokens(200, 2), 2: tokens(9, 3)}), alone)


def test_first_children_is_the_trees_leftmost_chain():
    tree = DraftTree([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 1, 2])  # root -> 10 -> 12 -> 15; 11 -> 14
    chain = tree.first_children()
    assert chain.tokens == [10, 12, 15] and chain.parents == [-1, 0, 1]
    assert DraftTree([], []).first_children().tokens == []


@pytest.fixture(scope="module")
def engines():
    torch.set_num_threads(2)
    engines = {}
    for method in ("none", "ngram", "eagle"):
        model = smollm2_shaped(seed=11)
        engines[method] = make_engine_of(method, model)
        prepack_linear_layers(model)
    return engines


@pytest.fixture
def seeded_logits(monkeypatch):
    """Records the logits each choice of the request seeded 42 saw, by output position."""
    records: dict[int, torch.Tensor] = {}
    choose_at = PositionKeyedChooser.choose_at

    def recording(self, logits, positions, paths=None):
        if self.seed == 42:
            records.update({p: logits[r].clone() for r, p in enumerate(positions)})
        return choose_at(self, logits, positions, paths)

    monkeypatch.setattr(PositionKeyedChooser, "choose_at", recording)
    return records


def committed_logits(records: dict[int, torch.Tensor], tokens: list[int]) -> list[torch.Tensor]:
    return [records[p] for p in range(len(tokens))]


@pytest.mark.parametrize("method", ["none", "ngram", "eagle"])
def test_seeded_logits_are_bitwise_the_same_alone_in_a_batch_and_for_every_method(engines, method, seeded_logits):
    """Every position's logits, not only the text: a flip needs a uniform near a boundary, which short
    random runs seldom hit. EAGLE verifies the seeded request's drafts as a chain (``first_children``);
    prompts are prefilled in chunks of their own (``prefill_chunk`` 40: 97 tokens as 40, 40, 17, whoever
    else is prefilling)."""
    prompt = tokens(97, 12)
    seeded = SamplingParams(max_tokens=24, greedy=False, temperature=1.0, seed=42)
    kw = dict(cost_model=FLAT_COST, prefill_chunk=40, max_batch_size=6)
    baseline = run_alone(engines["none"], prompt, seeded, **kw)
    reference = committed_logits(seeded_logits, baseline)
    seeded_logits.clear()
    alone = run_alone(engines[method], prompt, seeded, **kw)
    assert alone == baseline
    assert all(torch.equal(a, b) for a, b in zip(committed_logits(seeded_logits, alone), reference, strict=True))
    others = [
        (tokens(n, n), SamplingParams(max_tokens=20, greedy=n % 2 == 0, temperature=0.8, seed=n))
        for n in (5, 29, 60, 12)
    ]
    seeded_logits.clear()
    outs = run_batch(engines[method], [others[0], others[1], (prompt, seeded), *others[2:]], **kw)
    assert outs[2].tokens == baseline
    assert all(torch.equal(a, b) for a, b in zip(committed_logits(seeded_logits, baseline), reference, strict=True))


def test_a_sampled_request_of_a_tree_deployment_verifies_chains(engines, monkeypatch):
    """A tree's rows attend with masked siblings between their keys, which rounds them unlike plain
    decoding: a seeded request's drafts are verified as the tree's first-child chain, a plain causal entry."""
    entries_seen = []
    hidden = BatchedLM.hidden

    def recording(self, entries):
        entries_seen.extend(e for e in entries if len(e.token_ids) > 1)
        return hidden(self, entries)

    monkeypatch.setattr(BatchedLM, "hidden", recording)
    sampled = SamplingParams(max_tokens=12, greedy=False, temperature=1.0, seed=7)
    run_batch(
        engines["eagle"],
        [(tokens(20, 3), sampled), (tokens(20, 4), SamplingParams(max_tokens=12))],
        cost_model=FLAT_COST,
    )
    trees = [e for e in entries_seen if not e.exact and e.mask is not None]
    chains = [e for e in entries_seen if e.exact]
    assert trees and chains  # the greedy request verified trees, the sampled one drafted too
    assert all(e.mask is None and e.positions is None for e in chains)  # causal, at the next positions
