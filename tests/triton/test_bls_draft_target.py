"""Draft-target through tensorrt_llm_bls, without a server: the loop's invariants, external-draft
verification on the CPU engine, and the BLS model end to end with in-process stand-ins for the
models it calls (greedy output equals the target's own, streamed text equals non-streamed)."""

import functools
import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_engine import make_tiny_engine

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.external_drafts import DraftVerifier
from specpipe.runtime.cpu.scheduler.one_request import generate, generate_all, solo_scheduler
from specpipe.triton.models.bls import BlsModel, BlsRequest, RequestError
from specpipe.triton.models.draft_loop import DraftTargetLoop, accepted_prefix
from specpipe.triton.models.engine_request import parse_request
from specpipe.triton.models.generation import run_request
from specpipe.triton.models.postprocessing import Detokenizer, _rows
from specpipe.triton.models.preprocessing import Preprocessor

# --- the loop against a synthetic target ------------------------------------------------------------


def target_next(seq):
    return (sum(seq) * 7 + len(seq) * 3) % 50


def target_greedy(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_next(seq))
    return seq[len(prompt) :]


def verifier(seq, drafts):
    """Accepted drafts + the target's token (what the CPU tensorrt_llm model returns)."""
    out, cur = [], list(seq)
    for d in drafts:
        t = target_next(cur)
        out.append(t)
        cur.append(t)
        if t != d:
            return out
    out.append(target_next(cur))
    return out


@pytest.mark.parametrize("good", [0, 1, 3, 99])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_output_is_the_target_greedy_output_whatever_the_drafts(good, k):
    rng = random.Random(good * 10 + k)

    def draft(seq, n):
        true = target_greedy(seq, n)
        return [t if i < good else (t + 1 + rng.randrange(3)) % 50 for i, t in enumerate(true)]

    prompt = [3, 1, 4]
    chunks = list(DraftTargetLoop(draft, verifier).run(prompt, max_tokens=23, num_draft_tokens=k))
    tokens = [t for c in chunks for t in c.tokens]
    assert tokens == target_greedy(prompt, 23)
    assert chunks[-1].finished and chunks[-1].reason == "length" and not any(c.finished for c in chunks[:-1])
    stats = chunks[-1].stats
    assert stats.target_steps == len(chunks) and stats.total_accepted_draft_tokens <= stats.total_draft_tokens
    if k and good >= k:
        assert stats.acceptance_rate == 1.0 and len(chunks) <= -(-23 // (k + 1)) + 1
    if k == 0:
        assert stats.total_draft_tokens == 0 and len(chunks) == 23


def test_end_id_and_stop_words_end_the_request():
    prompt = [3, 1, 4]
    full = target_greedy(prompt, 30)
    end = full[5]
    loop = DraftTargetLoop(lambda seq, n: target_greedy(seq, n), verifier)
    tokens = [t for c in loop.run(prompt, 30, 4, end_ids=[end]) for t in c.tokens]
    assert tokens == full[: full.index(end)]
    stop = full[7:9]
    chunks = list(loop.run(prompt, 30, 4, stop_words=[stop]))
    assert [t for c in chunks for t in c.tokens] == full[:7] and chunks[-1].reason == "stop"


def test_a_target_that_returns_only_drafts_has_ended():
    seen = []
    loop = DraftTargetLoop(lambda seq, n: [1] * n, lambda seq, drafts: seen.append(1) or drafts[:2])
    chunks = list(loop.run([0], 10, 3))
    assert len(seen) == 1 and chunks[-1].finished and chunks[-1].reason == "stop" and chunks[-1].tokens == [1, 1]
    assert accepted_prefix([1, 2, 3], [1, 2, 9, 9]) == 2 and accepted_prefix([], [5]) == 0
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        list(loop.run([0], 0, 3))


# --- external drafts on the CPU engine ---------------------------------------------------------------


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from specpipe.runtime.cpu.loader import load_engine

    root = tmp_path_factory.mktemp("bls-engines")
    target, _ = load_engine(make_tiny_engine(root, "target", seed=0))
    same, _ = load_engine(make_tiny_engine(root, "same", seed=0))
    other, manifest = load_engine(make_tiny_engine(root, "other", seed=1))
    return target, same, other, root / "target" / "target"


def test_verifier_accepts_the_target_own_tokens_and_adds_one(engines):
    target, *_ = engines
    prompt = [5, 9, 17, 33]
    free = SamplingParams(max_tokens=6, end_id=target.target.vocab_size - 1)  # an end id it does not generate here
    greedy, _ = generate_all(solo_scheduler(target), prompt, free)
    assert len(greedy) == 6
    step = next(DraftVerifier(target, greedy[:4]).generate(prompt, replace(free, max_tokens=10)))
    assert (
        step.token_ids == greedy[:5]
        and step.stats.total_accepted_draft_tokens == 4
        and step.stats.total_draft_tokens == 4
    )
    wrong = [(greedy[0] + 1) % 100] + greedy[1:3]
    step = next(DraftVerifier(target, wrong).generate(prompt, replace(free, max_tokens=10)))
    assert step.token_ids == greedy[:1] and step.stats.total_accepted_draft_tokens == 0
    step = next(DraftVerifier(target, greedy[:4]).generate(prompt, replace(free, max_tokens=2)))
    assert step.token_ids == greedy[:2] and step.stats.total_draft_tokens == 1  # K + 1 fits max_tokens
    with pytest.raises(ValueError, match="draft_input_ids contains ids outside the vocabulary"):
        DraftVerifier(target, [10**6]).generate(prompt, SamplingParams(max_tokens=4))


class InProcess:
    """The models tensorrt_llm_bls calls, run in-process (the same code the Triton models run)."""

    def __init__(self, tokenizer, target, draft):
        self.pre, self.detok = Preprocessor(tokenizer), Detokenizer(tokenizer)
        self.engines = {"tensorrt_llm": target, "tensorrt_llm_draft": draft}
        self.calls = []

    def call(self, model, inputs, outputs, decoupled):
        self.calls.append(model)
        if model == "preprocessing":
            words = lambda k: [w.decode() for w in np.asarray(inputs.get(k, np.array([[]], dtype=object))).reshape(-1)]
            scalar = lambda k: int(np.asarray(inputs[k]).reshape(-1)[0]) if k in inputs else None
            return self.pre.outputs(
                inputs["QUERY"].reshape(-1)[0].decode(),
                scalar("REQUEST_OUTPUT_LEN"),
                words("STOP_WORDS_DICT"),
                words("BAD_WORDS_DICT"),
                scalar("END_ID"),
                scalar("PAD_ID"),
            )
        if model == "postprocessing":
            new = _rows(inputs["TOKENS_BATCH"], inputs["SEQUENCE_LENGTH"])[0]
            prior = _rows(inputs["PRIOR_TOKENS_BATCH"], None)[0] if "PRIOR_TOKENS_BATCH" in inputs else []
            return {"OUTPUT": np.array([[self.detok.delta(prior, new).encode()]], dtype=object)}
        request = parse_request(lambda name: inputs.get(name))
        deployment = self.engines[model]
        if request.draft_input_ids is not None:
            engine = DraftVerifier(deployment, list(request.draft_input_ids))
        else:  # what the Triton CPU model's scheduler does for this one request
            engine = SimpleNamespace(generate=functools.partial(generate, solo_scheduler(deployment)))
        got = {}
        run_request(engine, request, lambda out, final: got.update(out))
        return got


def bls_request(text, max_tokens, stream, k=4, **kw):
    base = dict(
        text=np.array([[text.encode()]], dtype=object),
        max_tokens=max_tokens,
        stream=stream,
        exclude_input=True,
        perf=True,
        num_input=False,
        num_output=False,
        num_draft_tokens=k,
        use_draft_logits=False,
        sampling={},
        words={},
    )
    base.update(kw)
    return BlsRequest(**base)


def run_bls(model, req):
    sent = []
    model.run(req, lambda outputs, final: sent.append((outputs, final)))
    return sent


@pytest.mark.parametrize("draft_name", ["same", "other"])
def test_bls_matches_the_target_alone_streamed_and_not(engines, draft_name):
    target, same, other, tokenizer_dir = engines
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    caller = InProcess(tokenizer, target, same if draft_name == "same" else other)
    model = BlsModel(caller, max_draft_len=4, default_draft_tokens=4, draft_logits=False)
    prompt = "Café 日本 🙂 Paris"
    ids = Preprocessor(tokenizer).encode_prompt(prompt)
    expected, _ = generate_all(solo_scheduler(target), ids, SamplingParams(max_tokens=20))
    plain = run_bls(model, bls_request(prompt, 20, stream=False))
    assert len(plain) == 1 and plain[0][1] is True
    text = plain[0][0]["text_output"].reshape(-1)[0].decode()
    assert text == Detokenizer(tokenizer).visible(expected)
    rate = float(plain[0][0]["acceptance_rate"].reshape(-1)[0])
    drafted = int(plain[0][0]["total_draft_tokens"].reshape(-1)[0])
    assert drafted > 0 and (rate == 1.0 if draft_name == "same" else 0.0 <= rate < 1.0)
    streamed = run_bls(model, bls_request(prompt, 20, stream=True))
    assert "".join(o["text_output"].reshape(-1)[0].decode() for o, _ in streamed) == text
    assert [final for _, final in streamed] == [False] * (len(streamed) - 1) + [True]
    if draft_name == "same":
        assert len(streamed) < 20  # several tokens per target step
    assert caller.calls.count("tensorrt_llm_draft") >= 1


def test_bls_refuses_bad_requests(engines):
    target, same, _, tokenizer_dir = engines
    from transformers import AutoTokenizer

    model = BlsModel(InProcess(AutoTokenizer.from_pretrained(tokenizer_dir), target, same), 4, 4, draft_logits=False)
    with pytest.raises(RequestError, match="num_draft_tokens must be in 0..4 .*got 9"):
        run_bls(model, bls_request("hi", 4, False, k=9))
    with pytest.raises(RequestError, match="max_tokens must be >= 1, got 0"):
        run_bls(model, bls_request("hi", 0, False))
    with pytest.raises(RequestError, match="built without --gather_generation_logits"):
        run_bls(model, bls_request("hi", 4, False, use_draft_logits=True))
