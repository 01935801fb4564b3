"""In-flight batching in the CPU runtime (issue 11 items 1-3): every request of a concurrent batch
gives the output it gives alone, whatever joins, leaves, fails or stops beside it; seeded sampling does
not depend on the batch; the adaptive rule drafts only where it pays; the queue bound answers busy."""

import random
import time

import pytest
import torch
from batch_helpers import (
    FLAT_COST,
    LINEAR_COST,
    METHODS,
    make_engine,
    prompts,
    run_alone,
    run_batch,
    scheduler_for,
    submit,
)
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.model.attention_groups import BatchEntry, attention_groups
from specpipe.runtime.cpu.model.batched_lm import BatchedLM
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.runtime.cpu.scheduler import policy as policy_module
from specpipe.runtime.cpu.scheduler.adaptive import (
    DraftCandidate,
    NodeAcceptance,
    ResumeCost,
    choose_draft_lengths,
    shared_acceptance,
)
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel, non_decreasing
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.runtime.cpu.scheduler.scheduler import Cancelled, ServerBusy
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import tree_attention

pytestmark = pytest.mark.usefixtures("single_thread")

GREEDY = SamplingParams(max_tokens=24)


def test_batched_forward_matches_the_one_sequence_cache():
    model = tiny_llama(0)
    lm = BatchedLM(model, 4, capacity=4)  # also exercises capacity growth
    chunks = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]
    steps = [[21, 22, 23], [24], [25, 26]]
    slots = [lm.allocate() for _ in chunks]
    lm.hidden([BatchEntry(s, c) for s, c in zip(slots, chunks)])
    hidden = lm.hidden([BatchEntry(s, t) for s, t in zip(slots, steps)])
    offset = 0
    for chunk, step in zip(chunks, steps):
        alone = CachedLM(model)
        alone.hidden(chunk)
        expected = alone.hidden(step)
        assert (hidden[offset : offset + len(step)] - expected).abs().max() < 1e-4
        offset += len(step)


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_batched_forward_of_a_prepacked_model_matches_the_model_itself(act):
    """The batched forward calls each layer's kernels directly (``LayerOps``): the gated SiLU MLP as its
    three GEMMs, any other MLP as its module; either way the hidden states are the model's own."""
    from specpipe.runtime.cpu.model.prepack import prepack_available, prepack_linear_layers

    model = tiny_llama(3)
    if act != "silu":
        for layer in model.model.layers:
            layer.mlp.act_fn = torch.nn.GELU()
    if prepack_available():
        prepack_linear_layers(model)
    tokens = [3, 9, 4, 40, 17, 2, 8]
    lm = BatchedLM(model, 2)
    slot = lm.allocate()
    hidden = torch.cat([lm.hidden([BatchEntry(slot, tokens[:5])]), lm.hidden([BatchEntry(slot, tokens[5:])])])
    with torch.inference_mode():
        expected = model.model(torch.tensor([tokens])).last_hidden_state[0]
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)
    uses_gemms = act == "silu"
    assert all((ops.mlp is not layer.mlp) == uses_gemms for ops, layer in zip(lm._layers, model.model.layers))


def test_attention_groups_pad_little_and_match_the_one_sequence_cache():
    model = tiny_llama(0)
    lm = BatchedLM(model, 8)
    prompts_by_slot = [[3 + i] * (4 + i) for i in range(8)]
    slots = [lm.allocate() for _ in prompts_by_slot]
    lm.hidden([BatchEntry(s, p) for s, p in zip(slots, prompts_by_slot)])
    parents = [-1, -1, 0, 2]  # root, then a 4-node tree in the last slot
    mask, depth = tree_attention(parents, len(prompts_by_slot[7]))
    tree = BatchEntry(7, [40, 41, 42, 43, 44], positions=len(prompts_by_slot[7]) + depth, mask=mask[0, 0])
    step = [
        BatchEntry(0, [30]),
        BatchEntry(1, [31, 32, 33]),
        BatchEntry(2, [34]),
        BatchEntry(3, [35]),
        BatchEntry(5, [36]),
        tree,
    ]
    starts = [lm.lengths[e.slot] for e in step]
    groups = attention_groups(step, starts)
    # one call for the one-token entries (slot 4 padded in), one per multi-token entry: slots 1 and 7
    # together would compute 7 x 5 query rows for 8
    assert [(g.slots.start, g.slots.stop, g.queries) for g in groups] == [(0, 6, 1), (1, 2, 3), (7, 8, 5)]
    assert groups[0].rows.tolist() == [0, 4, 5, 6] and groups[0].padding[0].tolist() == [0, 2, 3, 5]
    assert attention_groups(step[2:4], starts[2:4])[0].padding is None  # slots 2, 3: in order, no padding
    hidden = lm.hidden(step)
    offset = 0
    for entry in step:
        alone = CachedLM(model)
        alone.hidden(prompts_by_slot[entry.slot])
        n = len(entry.token_ids)
        expected = alone.hidden(
            entry.token_ids, positions=entry.positions, mask=None if entry.mask is None else entry.mask[None, None]
        )
        assert (hidden[offset : offset + n] - expected).abs().max() < 1e-4, entry.slot
        offset += n


def test_random_mixes_of_plain_steps_chains_and_trees_match_each_request_alone():
    """Whatever the grouping of a forward's attention (shared, padded, one call per entry), every
    request's hidden states are those of its own one-sequence cache."""
    model, rng = tiny_llama(1), random.Random(7)
    lm = BatchedLM(model, 8)
    alone = {slot: CachedLM(model) for slot in range(8)}
    for slot in range(8):
        lm.allocate()
        prompt = [rng.randrange(3, 60) for _ in range(rng.randint(1, 12))]
        lm.hidden([BatchEntry(slot, prompt)])
        alone[slot].hidden(prompt)
    for _ in range(12):
        entries = []
        for slot in sorted(rng.sample(range(8), rng.randint(1, 8))):
            n = rng.choice([1, 1, 1, 2, 4, 7])
            tokens = [rng.randrange(3, 60) for _ in range(n)]
            if n > 2 and rng.random() < 0.5:  # a token tree: random parents, each before its child
                parents = [-1] + [rng.randrange(-1, i) for i in range(1, n - 1)]
                mask, depth = tree_attention(parents, lm.lengths[slot])
                entries.append(BatchEntry(slot, tokens, positions=lm.lengths[slot] + depth, mask=mask[0, 0]))
            else:
                entries.append(BatchEntry(slot, tokens))
        hidden = lm.hidden(entries)
        offset = 0
        for entry in entries:
            n = len(entry.token_ids)
            mask = None if entry.mask is None else entry.mask[None, None]
            expected = alone[entry.slot].hidden(entry.token_ids, positions=entry.positions, mask=mask)
            assert (hidden[offset : offset + n] - expected).abs().max() < 1e-4
            offset += n
            if entry.mask is not None:  # keep the root only, in both caches, so that later steps agree
                keep = lm.lengths[entry.slot] - n + 1
                lm.truncate(entry.slot, keep)
                alone[entry.slot].truncate(keep)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_batch_of_8_equals_each_request_alone(method):
    engine = make_engine(method)
    batch = [(p, GREEDY) for p in prompts(8)]
    outs = run_batch(engine, batch)
    baseline = make_engine("none")
    for (prompt, params), out in zip(batch, outs):
        assert out.error is None and out.reason == "length"
        alone = run_alone(engine, prompt, params)
        plain, _ = generate_all(solo_scheduler(baseline), prompt, params)  # the one-request engine, no drafting
        assert out.tokens == alone == plain
    if method != "none":
        assert sum(o.stats.total_draft_tokens for o in outs) > 0


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_joins_cancellation_bad_request_and_stop_word_leave_the_others_unchanged(method):
    engine = make_engine(method)
    ps = prompts(6, seed=1)
    scheduler = scheduler_for(engine, max_batch_size=4)
    _, a = submit(scheduler, ps[0], GREEDY)
    b_request, b = submit(scheduler, ps[1], SamplingParams(max_tokens=40))
    for _ in range(4):
        scheduler.step()
    _, c = submit(scheduler, ps[2], GREEDY)  # joins mid-generation
    with pytest.raises(ValueError):
        submit(scheduler, [], GREEDY)  # bad request: refused before it reaches the batch
    with pytest.raises(ValueError):
        submit(scheduler, [1, 999], GREEDY)
    alone_d = run_alone(engine, ps[3], GREEDY)
    stop_word = tuple(alone_d[5:7])
    _, d = submit(scheduler, ps[3], SamplingParams(max_tokens=24, stop_words=(stop_word,)))
    scheduler.step()
    scheduler.step()
    b_request.cancel()
    scheduler.run_until_idle()
    assert isinstance(b.error, Cancelled) and b.reason is None
    assert a.tokens == run_alone(engine, ps[0], GREEDY)
    assert c.tokens == run_alone(engine, ps[2], GREEDY)
    first = next(i for i in range(len(alone_d) - 1) if tuple(alone_d[i : i + 2]) == stop_word)
    assert d.reason == "stop" and d.tokens == alone_d[:first]
    assert scheduler.lm.free_slots == 4


@pytest.mark.parametrize("method", ["none", "ngram", "draft-model", "eagle"])
def test_seeded_sampling_gives_the_same_text_alone_and_in_a_batch(method):
    engine = make_engine(method)
    ps = prompts(5, seed=2)
    seeded = SamplingParams(max_tokens=20, greedy=False, temperature=0.9, top_k=20, seed=1234)
    alone = run_alone(engine, ps[0], seeded)
    others = [(p, SamplingParams(max_tokens=16, greedy=False, seed=i)) for i, p in enumerate(ps[1:])]
    outs = run_batch(engine, [(ps[0], seeded), *others])
    assert outs[0].tokens == alone
    # and the plain engine's seeded text (no drafts at all) is the same: drafting does not change it
    assert run_alone(make_engine("none"), ps[0], seeded) == alone


def chain(base: float, seconds_per_depth: float = 0.0, nodes: int = 5) -> DraftCandidate:
    """A chain drafter's options whose node j is accepted with probability ``base ** (j + 1)``."""
    return DraftCandidate.of(NodeAcceptance(base=base), list(range(1, nodes + 1)), seconds_per_depth)


def test_draft_length_is_zero_where_drafting_cannot_pay():
    assert choose_draft_lengths(LINEAR_COST, [chain(0.95) for _ in range(3)], fixed_tokens=3) == [0, 0, 0]
    # costly drafting: even free verification does not pay
    assert choose_draft_lengths(FLAT_COST, [chain(0.95, seconds_per_depth=10.0)], fixed_tokens=1) == [0]


def test_it_drafts_with_high_acceptance_and_a_small_batch_and_stops_under_load():
    # measured shape on 2 cores: verifying a few tokens costs ~1.3x a step, then cost grows with tokens
    cost = ForwardCostModel((1, 4, 8, 16, 32, 64), (1.0, 1.3, 1.4, 2.0, 3.5, 6.5))
    assert choose_draft_lengths(cost, [chain(0.8)], fixed_tokens=1)[0] >= 3
    assert choose_draft_lengths(cost, [chain(0.1)], fixed_tokens=1) == [0]
    # 32 requests of a busy batch: the forward is compute-bound, extra tokens cost a full share each
    assert sum(choose_draft_lengths(cost, [chain(0.4) for _ in range(32)], fixed_tokens=32)) == 0


def test_a_tree_is_cut_to_the_nodes_that_pay():
    # every verified token costs 10 % of a step: a tree whose first node is accepted half the time and
    # whose other nodes rarely are verifies its first node only
    cost = ForwardCostModel((1, 64), (1.0, 7.3))
    acceptance = NodeAcceptance()
    for _ in range(30):
        acceptance.observe(6, [0] if _ % 2 else [])
    tree = DraftCandidate.of(acceptance, [1, 1, 1, 2, 2, 3], 0.0)
    assert choose_draft_lengths(cost, [tree], fixed_tokens=1) == [1]
    # a gain below the margin is not taken: one node accepted 12 % of the time gains 1.8 % here
    weak = DraftCandidate(expected=[1.0, 1.12], draft_seconds=[0.0, 0.0])
    assert choose_draft_lengths(cost, [weak], fixed_tokens=1) == [0]
    assert choose_draft_lengths(cost, [weak], fixed_tokens=1, margin=0.0) == [1]


def test_resuming_drafts_is_charged_over_the_runs_of_drafting_steps_it_starts():
    # each verified token costs a tenth of a step; the first node is accepted half the time
    cost = ForwardCostModel((1, 64), (1.0, 7.3))
    acceptance = NodeAcceptance(base=0.5)
    resume = ResumeCost()
    resume.resumed(0.5)  # catching up after a pause took half a step; no run has ended yet
    assert resume.charge() == 0.5
    resuming = DraftCandidate.of(acceptance, [1, 2], 0.1, resume.charge())
    assert resuming.draft_seconds == pytest.approx([0.0, 0.6, 0.7])
    assert choose_draft_lengths(cost, [DraftCandidate.of(acceptance, [1], 0.0)], fixed_tokens=1) == [1]
    assert choose_draft_lengths(cost, [DraftCandidate.of(acceptance, [1], 0.0, resume.charge())], fixed_tokens=1) == [0]
    for _ in range(200):  # runs of drafting steps last 10 steps: a tenth of the catch-up per step, and it pays
        resume.run_ended(10)
    assert resume.charge() == pytest.approx(0.05, rel=1e-3)
    assert choose_draft_lengths(cost, [DraftCandidate.of(acceptance, [1], 0.0, resume.charge())], fixed_tokens=1) == [1]


def test_the_scheduler_times_resumes_and_measures_the_runs_of_drafting_steps(monkeypatch):
    choices = iter([1, 1, 0, 1, 0, 0, 1] + [1] * 100)
    asked = []  # per decision: (the request had paused, the start cost charged, the charge then)
    chosen = []

    def scripted(cost, candidates, fixed_tokens, *args, **kwargs):
        for request, c in zip([r for r in scheduler.active if not r.prefilling], candidates):
            if len(c.draft_seconds) > 1:
                per_depth = request.draft_seconds_per_depth or scheduler.policy.draft_seconds_per_depth
                asked.append((request.paused, c.draft_seconds[1] - per_depth, scheduler.policy.resume_cost.charge()))
        chosen.extend(min(next(choices), len(c.expected) - 1) for c in candidates)
        return chosen[len(chosen) - len(candidates) :]

    monkeypatch.setattr(policy_module, "choose_draft_lengths", scripted)
    scheduler = scheduler_for(make_engine("eagle"))
    request, out = submit(scheduler, prompts(1)[0], SamplingParams(max_tokens=24))
    scheduler.run_until_idle()
    assert out.error is None and len(out.tokens) == 24 and len(asked) >= 8
    # drafted, drafted, plain (a run of 2 ended), resumed, plain (a run of 1 ended), plain, resumed, drafting
    assert [paused for paused, _, _ in asked[:8]] == [False, False, False, True, False, True, True, False]
    for paused, start, charge in asked:
        assert start == pytest.approx(charge if paused else 0.0, abs=1e-12)
    assert asked[6][2] > 0  # the first resume was timed before the second was charged
    run_steps, streak = 1.0, 0
    for k in chosen:  # the runs end where a plain step follows a drafting one (also for lack of room at the end)
        if k:
            streak += 1
        elif streak:
            run_steps, streak = run_steps + 0.05 * (streak - run_steps), 0
    assert scheduler.policy.resume_cost.run_steps == pytest.approx(run_steps) and request.draft_streak == streak


def test_mixing_plain_and_drafting_requests_costs_its_measured_overhead():
    # each verified token costs a tenth of a step; a forward mixing plain and drafting requests 0.2 more
    cost = ForwardCostModel((1, 64), (1.0, 7.3), mixed_seconds=0.2)
    good = DraftCandidate(expected=[1.0, 1.3], draft_seconds=[0.0, 0.0])
    plain = DraftCandidate(expected=[1.0], draft_seconds=[0.0])  # may not draft (e.g. its last token)
    assert choose_draft_lengths(cost, [good], fixed_tokens=1) == [1]  # alone: nothing to mix with
    assert choose_draft_lengths(cost, [good, plain], fixed_tokens=2) == [0, 0]  # 2.3 / 1.4 s < 2 / 1.1 s
    # both drafting mixes nothing and pays (2.6 / 1.3 s), though neither pays being the first alone:
    # the search also starts from everybody drafting
    assert choose_draft_lengths(cost, [good, good], fixed_tokens=2) == [1, 1]
    # beside a prompt chunk (4 tokens), a plain request is what mixes: a weak draft then pays
    weak = DraftCandidate(expected=[1.0, 1.05], draft_seconds=[0.0, 0.0])
    assert choose_draft_lengths(cost, [weak], fixed_tokens=5, prefill=True) == [1]
    assert choose_draft_lengths(cost, [weak], fixed_tokens=5) == [0]


def test_cost_curve_is_non_decreasing_and_learns_the_machines_speed_from_served_forwards():
    assert non_decreasing([3.0, 1.0, 2.0, 5.0, 4.0]) == [2.0, 2.0, 2.0, 4.5, 4.5]
    assert non_decreasing([1.0, 2.0, 2.0]) == [1.0, 2.0, 2.0]
    model = ForwardCostModel((1, 8, 64), (1.0, 2.0, 9.0), learning_rate=0.1)
    for _ in range(100):  # the machine became 1.5x slower; served forwards are all plain steps
        model.observe(1, 1.5)
    assert model.speed == pytest.approx(1.5, rel=1e-3)
    # the curve keeps its shape: drafting 7 more tokens costs the same share of a step as measured
    assert model.cost(8) / model.cost(1) == pytest.approx(2.0) and model.cost(36) == pytest.approx(1.5 * 5.5, rel=1e-3)
    model.observe(1, 1e3)  # an outlier moves the speed by at most its share of 2x the curve
    assert model.speed <= 1.5 + 0.1 * (2.0 - 1.5) + 1e-9
    fixed = ForwardCostModel((1, 64), (1.0, 64.0))  # learning_rate 0: a test's model stays as given
    fixed.observe(64, 1.0)
    assert fixed.cost(64) == 64.0


def test_forwards_that_verify_drafts_learn_their_own_excess_cost_and_the_rule_follows_it():
    """The curve is measured one token per request; forwards holding chains or trees can cost more than
    their token count says (served: n-gram at concurrency 8, 7 % longer than plain forwards). Learnt from served forwards, that
    excess keeps the rule from drafting where the curve says it gains and the machine says it loses."""
    model = ForwardCostModel((1, 8, 64), (1.0, 2.0, 9.0), learning_rate=0.1)
    for _ in range(200):  # plain forwards as measured, drafting ones (12 tokens) 20 % over the curve
        model.observe(8, 2.0)
        model.observe(12, 1.2 * model._measured(12), drafting=True)
    assert model.draft_factor == pytest.approx(1.2, rel=0.03) and model.speed == pytest.approx(1.0, rel=0.03)
    assert model.cost(12, drafting=True) / model.cost(12) == pytest.approx(model.draft_factor)
    candidates = [DraftCandidate(expected=[1.0, 1.8], draft_seconds=[0.0, 0.0]) for _ in range(8)]
    unlearnt = ForwardCostModel((1, 8, 64), (1.0, 2.0, 9.0))
    # at a 3 % margin the first request's draft (+3.5 % on the batch's rate here) passes it; at the shipped 8 %
    # none does, whatever the excess, which is not what this test is about
    assert sum(choose_draft_lengths(unlearnt, candidates, fixed_tokens=8, margin=0.03)) >= 2  # 14.4 / 3.0 s > 8 / 2.0 s
    assert (
        choose_draft_lengths(model, candidates, fixed_tokens=8, margin=0.03) == [0] * 8
    )  # 14.4 / (3.0 x 1.2) s: no gain
    assert "forwards verifying drafts x1.2" in model.describe()


def test_acceptance_follows_observations_and_drifts_back_to_the_deployments():
    estimate = NodeAcceptance()
    for _ in range(20):
        estimate.observe(4, [])
    assert estimate.rates(1)[0] < 0.15
    for _ in range(40):
        estimate.observe(0, [])  # no drafts: drifts back to the prior
    assert estimate.rates(1)[0] > 0.5
    assert estimate.expected_tokens(2) == pytest.approx([1.0, 1 + estimate.rates(2)[0], 1 + sum(estimate.rates(2))])
    # with a shared estimate, the prior is what the deployment's drafts achieve, per node
    shared = shared_acceptance()
    for _ in range(100):
        shared.observe(3, [0, 1])
    newcomer = NodeAcceptance(shared=shared)
    assert newcomer.rates(3) == pytest.approx(shared.rates(3)) and shared.rates(3)[0] > 0.9 > 0.1 > shared.rates(3)[2]


def test_a_deployment_whose_drafts_failed_at_first_probes_again():
    # each verified token costs a tenth of a step: drafting pays once the first draft is accepted
    # about 14 % of the time
    scheduler = scheduler_for(make_engine("ngram"), cost_model=ForwardCostModel((1, 64), (1.0, 7.3)))
    for _ in range(200):
        scheduler.policy.shared_acceptance.observe(4, [])  # a bad start: nothing accepted
    assert scheduler.policy.shared_acceptance.rates(1)[0] < 0.05
    submit(scheduler, [3, 4, 5], SamplingParams(max_tokens=250))
    lengths = []
    while scheduler.has_work:
        scheduler.step()
        lengths += scheduler.last_draft_lengths
    first = next(i for i, k in enumerate(lengths) if k > 0)
    assert 60 < first < 200  # it forgets while nothing drafts: probes again after ~130 plain steps


def test_adaptive_scheduler_does_not_draft_when_it_cannot_pay_and_reports_draft_lengths():
    engine = make_engine("ngram")
    outs = run_batch(engine, [(p, GREEDY) for p in prompts(4)], cost_model=LINEAR_COST)
    assert all(o.stats.total_draft_tokens == 0 and o.stats.draft_length == 0 for o in outs)
    outs = run_batch(engine, [(p, GREEDY) for p in prompts(4)], cost_model=FLAT_COST)
    assert sum(o.stats.total_draft_tokens for o in outs) > 0


def test_queue_bound_answers_server_busy_at_once():
    engine = make_engine("none")
    scheduler = scheduler_for(engine, max_batch_size=2, max_queue=1)
    outs = [submit(scheduler, [3, 4, 5], GREEDY)[1] for _ in range(3)]
    with pytest.raises(ServerBusy, match="server busy"):
        submit(scheduler, [3, 4, 5], GREEDY)
    scheduler.run_until_idle()
    assert all(o.reason == "length" and len(o.tokens) == 24 for o in outs)
    submit(scheduler, [3, 4, 5], GREEDY)  # room again


def test_long_prompt_is_prefilled_in_chunks_while_others_decode():
    engine = make_engine("none")
    scheduler = scheduler_for(engine, prefill_chunk=4)
    _, short = submit(scheduler, [3, 4, 5], GREEDY)
    scheduler.step()
    long_prompt = list(range(3, 43))
    _, long = submit(scheduler, long_prompt, GREEDY)
    for _ in range(5):
        scheduler.step()
    assert short.steps >= 5 and long.steps == 0  # the short one kept decoding during the long prefill
    scheduler.run_until_idle()
    assert long.tokens == run_alone(engine, long_prompt, GREEDY)


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_no_request_starts_drafting_beside_a_prompt_chunk_but_a_drafting_one_goes_on(method):
    engine = make_engine(method)
    scheduler = scheduler_for(engine, prefill_chunk=4)  # flat cost: drafting always pays
    first, _ = submit(scheduler, [5, 6, 7, 5, 6, 7, 5, 6], GREEDY)
    late, _ = submit(scheduler, list(range(3, 43)), GREEDY)  # 40 prompt tokens: 10 steps of chunks
    lengths = []
    while late.prefilling:
        scheduler.step()
        lengths.append(first.draft_length)
    assert lengths[1:] and not any(lengths[1:])  # decoding beside the chunks, never starting to draft
    scheduler.step()
    assert first.draft_length > 0  # the prompt is in: it starts
    joining, _ = submit(scheduler, list(range(10, 30)), GREEDY)
    scheduler.step()
    assert joining.prefilling and first.draft_length > 0  # already drafting: it goes on beside the chunk


@pytest.mark.parametrize("method", ["none", "ngram", "medusa", "eagle"])
def test_penalties_and_min_tokens_in_a_batch_match_the_one_request_engine(method):
    """TensorRT-LLM's penalties and min_tokens apply per position (drafts count as history), so greedy
    output through the scheduler equals the one-request engine's with the same options."""
    engine = make_engine(method)
    baseline = make_engine("none")
    options = [
        SamplingParams(max_tokens=12, repetition_penalty=1.3),
        SamplingParams(max_tokens=12, presence_penalty=0.8, frequency_penalty=0.4),
        SamplingParams(max_tokens=12, min_tokens=12, end_id=5),
    ]
    batch = [(p, options[i % len(options)]) for i, p in enumerate(prompts(6))]
    outs = run_batch(engine, batch)
    changed = 0
    for (prompt, params), out in zip(batch, outs):
        assert out.error is None
        plain, _ = generate_all(solo_scheduler(baseline), prompt, params)
        assert out.tokens == plain
        changed += out.tokens != generate_all(solo_scheduler(baseline), prompt, SamplingParams(max_tokens=12))[0]
    assert changed > 0  # the options changed some outputs: the test would see them ignored


@pytest.mark.parametrize("method", ["draft-model", "eagle"])
def test_catching_up_first_leaves_the_proposal_unchanged(method):
    """A drafter brought up to date by ``catch_up`` proposes what it would have proposed catching up
    inside ``propose``."""
    engine = make_engine(method)
    prompt = prompts(2, seed=5)[1]
    context = [*prompt, 7, 9, 11]
    proposals = []
    for catch_up_first in (False, True):
        drafter = engine.drafter.fork()
        drafter.reset(prompt)
        if method == "eagle":
            features = engine.target.model.model(input_ids=torch.tensor([context])).last_hidden_state[0]
            drafter.commit(context, features[:-1])
            if catch_up_first:
                drafter.catch_up(context)
            tree = drafter.propose(context, 7, 3)
            proposals.append((tree.tokens, tree.parents))
        else:
            if catch_up_first:
                drafter.catch_up(context)
            proposals.append(
                drafter.propose_chain(context, 3, TokenSampler(SamplingParams(max_tokens=4), torch.Generator())).tokens
            )
    assert proposals[0] == proposals[1] and proposals[0][0]


def test_the_drafting_cost_per_depth_leaves_out_catching_up(monkeypatch):
    """Tokens committed while a drafter was not proposing (the prompt, accepted drafts) are fed to it
    before the proposal is timed: the per-depth cost the rule uses is the proposal's alone. Here the
    draft model's forward is slowed down for inputs of more than one token, which only catching up has."""
    decode = CachedLM._decode

    def slow_for_many_tokens(self, token_ids, positions, mask):
        if len(token_ids) > 1:
            time.sleep(0.2)
        return decode(self, token_ids, positions, mask)

    monkeypatch.setattr(CachedLM, "_decode", slow_for_many_tokens)
    scheduler = scheduler_for(make_engine("draft-model"))
    request, out = submit(scheduler, prompts(2)[1], SamplingParams(max_tokens=3))
    scheduler.run_until_idle()
    assert out.error is None and len(out.tokens) == 3
    assert 0.0 < request.draft_seconds_per_depth < 0.05  # the first proposal caught up on the whole prompt
