"""Issue 34's field kinds on the real default model (SmolLM2-135M), whose drafts are accepted in blocks,
for every CPU method (none, n-gram, draft model, Medusa, EAGLE), each alone and in a batch, through the
batch scheduler that serves Triton's requests. It drafts every step (``adaptive=False``), so a request's
steps are the same alone and in a batch, and a run's blocks of accepted drafts can be aimed at:

- an end id, a stop word or ``max_tokens`` inside a block of accepted drafts: nothing after it is emitted,
  the usage counts what was emitted, the token that ended the request is its step's own token and the drafts
  accepted past it are not counted, so that generated tokens = target forwards + accepted drafts;
- penalties and ``min_tokens`` see every token a step commits (the output is the baseline's);
- multi-token bad words are matched across draft positions;
- seeded sampling gives the baseline's text alone and in a batch; unseeded requests differ;
- each request's drafter state is its own: its steps (tokens, drafts, accepted) in a batch whose
  requests join at different steps are those it has alone; a request cancelled mid-run frees its slot,
  and the per-request and per-server counters agree (the model's Triton metrics, faked).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from batch_helpers import FLAT_COST

from specpipe.generation import spec_metrics as names
from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler, Cancelled

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("single_thread")]

METHODS = ("none", "ngram", "smollm2-draft", "medusa", "eagle")
TEXTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "import numpy as np\n\narr = np.array([1, 2, 3])\nprint(arr",
    "List three benefits of exercise:\n1.",
)
N = 28


@pytest.fixture(scope="module")
def texts(smollm2_engines):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(smollm2_engines["none"]) / "target")
    return [tokenizer(text)["input_ids"] for text in TEXTS]


@pytest.fixture(scope="module")
def baseline(smollm2_engines):
    """Runs on the plain engine (one token per step: nothing to get wrong across draft positions), cached."""
    engine, found = load_engine(Path(smollm2_engines["none"]))[0], {}

    def run(prompt, params):
        key = (tuple(prompt), params)
        if key not in found:
            [found[key]] = serve(engine, [(prompt, params)])[0]
        return found[key].tokens

    return run


@pytest.fixture(scope="module", params=METHODS)
def method(request, smollm2_engines):
    """``(name, engine)``: one method's engine at a time (tests are grouped by it)."""
    return request.param, load_engine(Path(smollm2_engines[request.param]))[0]


class Record:
    """One request's step outputs."""

    def __init__(self, observe=None):
        self.blocks, self.stats, self.reason, self.error, self.observe = [], [], None, None, observe

    def emit(self, step) -> None:
        self.blocks.append(list(step.token_ids))
        self.stats.append(step.stats)
        self.reason = step.finish_reason if step.finished else None
        if self.observe is not None:
            self.observe(step)

    def fail(self, exc) -> None:
        self.error = exc

    @property
    def tokens(self) -> list[int]:
        return [t for block in self.blocks for t in block]

    @property
    def steps(self) -> list[tuple]:
        """Per step: (tokens, new draft tokens, new accepted drafts)."""
        before = [0, 0]
        out = []
        for block, stats in zip(self.blocks, self.stats):
            now = [stats.total_draft_tokens, stats.total_accepted_draft_tokens]
            out.append((tuple(block), now[0] - before[0], now[1] - before[1]))
            before = now
        return out


def serve(engine, jobs, *, max_batch_size: int = 8, observe=None):
    """Serve ``jobs`` (``(prompt, params)`` or ``(prompt, params, join at step, cancel at step)``) together."""
    scheduler = BatchScheduler(engine, max_batch_size=max_batch_size, cost_model=FLAT_COST, adaptive=False)
    jobs = [(*job, *(0, None)[len(job) - 2 :]) for job in jobs]
    records = [Record(observe() if observe else None) for _ in jobs]
    handles, step = [None] * len(jobs), 0
    while scheduler.has_work or any(h is None for h in handles):
        for i, (prompt, params, join, cancel) in enumerate(jobs):
            if handles[i] is None and join <= step:
                handles[i] = scheduler.submit(prompt, params, records[i].emit, records[i].fail)
            if cancel == step and handles[i] is not None:
                handles[i].cancel()
        scheduler.step()
        step += 1
    return records, scheduler


def blocks_of(free: Record) -> list[tuple[int, int, int]]:
    """``(output offset, step, accepted drafts)`` of each decoding step of a free run but its last."""
    offsets, offset = [], 0
    for step, (block, _, accepted) in enumerate(free.steps):
        if 0 < step < len(free.blocks) - 1:
            assert len(block) == accepted + 1  # nothing held back: a step emits what it commits
            offsets.append((offset, step, accepted))
        offset += len(block)
    return offsets


def aim(free: Record, method: str, inside: bool = False):
    """An output index p in a block of accepted drafts whose token and pair ``(p-1, p)`` first occur there:
    ``(p, step, drafts accepted before p)`` or ``None``. ``inside=False``: p is a draft followed by accepted
    drafts (drafts accepted past it; any index for the baseline); ``True``: p's row of the verification
    has drafts before it in the step (its history holds the step's tokens)."""
    tokens = free.tokens
    accepted_before = 0
    for offset, step, accepted in blocks_of(free):
        if method == "none":
            ks = [0]
        else:
            ks = range(1, accepted + 1) if inside else range(accepted - 1)
        for k in ks:
            p = offset + k
            if (
                p >= 2
                and tokens[p] not in tokens[:p]
                and tokens[p - 1 : p + 1] not in [tokens[j : j + 2] for j in range(p - 1)]
            ):
                return p, step, accepted_before + k
        accepted_before += accepted
    return None


_AIMED: dict = {}


def aimed(name: str, engine, texts, inside: bool = False):
    """``(prompt, free run, aim(free run))`` of the first prompt that has a block to aim at (cached)."""
    if (name, inside) not in _AIMED:
        for prompt in texts:
            [free], _ = serve(engine, [(prompt, SamplingParams(max_tokens=N))])
            if (target := aim(free, name, inside)) is not None:
                _AIMED[name, inside] = prompt, free, target
                break
    assert (name, inside) in _AIMED, f"{name}: no block of accepted drafts to aim at in {len(texts)} prompts"
    return _AIMED[name, inside]


def assert_counters_agree(run: Record, stopping_tokens: int = 0) -> None:
    """The request's identities after every step: accepted <= drafted, generated tokens = emitted tokens + the
    end id or stop word that ended it (``stopping_tokens``, at the end) = target forwards + accepted drafts,
    and the mean accepted length is the generated tokens after the first per decoding forward."""
    emitted = 0
    for block, stats in zip(run.blocks, run.stats):
        emitted += len(block)
        assert stats.num_output_tokens == emitted and stats.total_accepted_draft_tokens <= stats.total_draft_tokens
        assert stats.num_generated_tokens == stats.target_forwards + stats.total_accepted_draft_tokens
    final = run.stats[-1]
    assert final.num_generated_tokens == emitted + stopping_tokens
    if final.target_forwards > 1:
        assert final.mean_accepted_length == (final.num_generated_tokens - 1) / (final.target_forwards - 1)


def test_an_end_id_stop_word_or_max_tokens_inside_accepted_drafts_ends_there_and_is_counted_so(method, texts):
    name, engine = method
    prompt, free, (p, step, accepted) = aimed(name, engine, texts)
    end = SamplingParams(max_tokens=N, end_id=free.tokens[p])
    stop = SamplingParams(max_tokens=N, stop_words=(tuple(free.tokens[p - 1 : p + 1]),))
    other = next(t for t in texts if t != prompt)
    alone = [serve(engine, [(prompt, params)])[0][0] for params in (end, stop)]
    batch, scheduler = serve(
        engine,
        [
            (prompt, end, 0),
            (prompt, stop, 2),
            (prompt, SamplingParams(max_tokens=N), 0),
            (other, SamplingParams(max_tokens=N), 3),
        ],
    )
    assert batch[2].tokens == free.tokens and scheduler.lm.free_slots == 8
    for run, emitted, stopping in ((alone[0], p, 1), (alone[1], p - 1, 2), (batch[0], p, 1), (batch[1], p - 1, 2)):
        assert run.error is None and run.reason == "stop"
        assert run.tokens == free.tokens[:emitted]  # nothing after the end id, nor the stop word itself
        final, upto = run.stats[-1], free.stats[step]
        assert final.num_output_tokens == emitted  # what was emitted
        assert final.target_forwards == upto.target_forwards and final.total_draft_tokens == upto.total_draft_tokens
        assert final.total_accepted_draft_tokens == accepted  # the drafts before the end, not it nor those past it
        assert_counters_agree(run, stopping)
    for run in (*batch[2:], free):
        assert run.reason == "length"
        assert_counters_agree(run)
    if name != "none":
        assert accepted + 1 < free.stats[step].total_accepted_draft_tokens  # drafts were accepted past it
    # max_tokens ending inside the block: the step drafts only what the budget leaves, and counts alike
    budget = serve(engine, [(prompt, SamplingParams(max_tokens=p + 1))])[0][0]
    assert budget.tokens == free.tokens[: p + 1] and budget.reason == "length"
    assert_counters_agree(budget)


def test_penalties_and_min_tokens_see_every_token_a_step_commits(method, texts, baseline):
    """With history-dependent options, each verified row must see the tokens committed before it in the
    same step: the output is then the baseline's (one token per step) alone and in a batch. The end id is
    aimed at a row with drafts before it: ``min_tokens`` there lets it end the request only if the row
    counts them, one more keeps it going."""
    name, engine = method
    prompt, free, (p, _, _) = aimed(name, engine, texts, inside=True)
    end = free.tokens[p]
    options = [
        SamplingParams(max_tokens=N, repetition_penalty=1.3),
        SamplingParams(max_tokens=N, presence_penalty=0.6, frequency_penalty=0.4),
        SamplingParams(max_tokens=N, min_tokens=p, end_id=end),
        SamplingParams(max_tokens=N, min_tokens=p + 1, end_id=end),
    ]
    expected = [baseline(prompt, params) for params in options]
    assert expected[2] == free.tokens[:p] and expected[3][:p] == free.tokens[:p] and expected[3][p] != end
    assert all(e != free.tokens[: len(e)] for e in expected[:2])  # the penalties changed the text
    batch, _ = serve(engine, [(prompt, params, 2 * i) for i, params in enumerate(options)])
    multi_token_steps = 0
    for params, run, want in zip(options, batch, expected):
        assert run.error is None and run.tokens == want
        assert serve(engine, [(prompt, params)])[0][0].tokens == want
        multi_token_steps += sum(len(block) > 1 for block in run.blocks)
    if name != "none":
        assert multi_token_steps >= 3  # steps committed several tokens: the history inside a step mattered


def test_multi_token_bad_words_are_matched_across_draft_positions(method, texts, baseline):
    name, engine = method
    prompt, free, (p, _, _) = aimed(name, engine, texts, inside=True)  # p - 1 is a draft of p's step
    words = (tuple(free.tokens[p - 1 : p + 1]), tuple(free.tokens[p + 2 : p + 5]))
    params = SamplingParams(max_tokens=N, bad_words=words)
    expected = baseline(prompt, params)
    assert expected[:p] == free.tokens[:p] and expected[p] != free.tokens[p]
    batch, _ = serve(
        engine, [(next(t for t in texts if t != prompt), SamplingParams(max_tokens=N)), (prompt, params, 1)]
    )
    for run in (serve(engine, [(prompt, params)])[0][0], batch[1]):
        assert run.error is None and run.tokens == expected
        text = [*prompt, *run.tokens]
        for w in words:
            assert all(tuple(text[i : i + len(w)]) != w for i in range(len(prompt) - len(w) + 1, len(text)))


def test_seeded_sampling_is_the_baselines_alone_and_in_a_batch_and_unseeded_differs(method, texts, baseline):
    name, engine = method
    seeded = [
        SamplingParams(max_tokens=20, greedy=False, temperature=0.8, top_p=0.95, seed=7),
        SamplingParams(max_tokens=20, greedy=False, temperature=1.0, top_k=40, seed=2**40 + 3),
    ]
    unseeded = SamplingParams(max_tokens=20, greedy=False, temperature=1.0)
    jobs = [(texts[0], seeded[0], 0), (texts[1], seeded[1], 2), (texts[0], unseeded, 1), (texts[0], unseeded, 1)]
    batch, _ = serve(engine, jobs)
    for (prompt, params, _), run in zip(jobs[:2], batch):
        expected = baseline(prompt, params)
        assert run.tokens == expected == serve(engine, [(prompt, params)])[0][0].tokens
    assert batch[2].tokens != batch[3].tokens


def test_each_requests_drafter_state_is_its_own_and_a_cancelled_request_leaves_consistent_counters(
    method, texts, monkeypatch
):
    """Requests joining at different steps (one cancelled at step 6) take, step for step, the tokens, draft
    tokens and accepted drafts they take alone (a drafter reading another request's n-gram table, features
    or cache would change them); the model's counters (Triton metrics, faked) agree with the requests'."""
    from triton_fakes import FAKE_PB, FakeMetricFamily

    from specpipe.triton.models.scheduler_metrics import SchedulerMetrics

    name, engine = method
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FAKE_PB)
    FakeMetricFamily.values = {}
    metrics = SchedulerMetrics("m")
    jobs = [
        (texts[i % len(texts)], SamplingParams(max_tokens=N - 4 * (i % 2)), join, cancel)
        for i, (join, cancel) in enumerate([(0, None), (1, None), (4, 6), (5, None), (9, None)])
    ]
    records, scheduler = serve(engine, jobs, max_batch_size=4, observe=lambda: metrics.track(0.0))
    assert scheduler.lm.free_slots == 4 and not scheduler.active
    cancelled = records[2]
    assert isinstance(cancelled.error, Cancelled) and cancelled.reason is None and 0 < len(cancelled.tokens) < N
    for i, record in enumerate(records):
        if i != 2:
            alone = serve(engine, [jobs[i][:2]])[0][0]
            assert record.steps == alone.steps and record.reason == alone.reason
        assert_counters_agree(record)  # ended by max_tokens, or cancelled

    def value(metric, **labels):
        return FakeMetricFamily.values.get((metric, tuple(sorted({"model_name": "m", **labels}.items()))), 0.0)

    accepted, drafted = value(names.NUM_ACCEPTED_TOKENS), value(names.NUM_DRAFT_TOKENS)
    per_position = [value(names.NUM_ACCEPTED_PER_POS, position=str(p)) for p in range(engine.max_draft_len + 1)]
    assert accepted == sum(r.stats[-1].total_accepted_draft_tokens for r in records) == sum(per_position)
    assert drafted == sum(r.stats[-1].total_draft_tokens for r in records) >= accepted
    assert value(names.GENERATION_TOKENS) == sum(len(r.tokens) for r in records)
    assert all(a >= b for a, b in zip(per_position, per_position[1:])) and per_position[0] <= value(names.NUM_DRAFTS)
    if name != "none":
        assert accepted > 0 and value(names.NUM_DRAFTS) > 0
