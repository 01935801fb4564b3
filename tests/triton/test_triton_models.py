"""The Python-backend models' logic, without a server: tokenization, exact streamed text,
request validation, and the engine worker's responses."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from recording_sender import RecordingSender
from tiny_engine import make_tiny_engine, tiny_tokenizer

from specpipe.generation.api import RequestStats, StepOutput
from specpipe.runtime.cpu.scheduler.one_request import solo_scheduler
from specpipe.triton.models.engine_request import parse_request
from specpipe.triton.models.generation import run_request
from specpipe.triton.models.postprocessing import Detokenizer, _rows
from specpipe.triton.models.preprocessing import Preprocessor
from specpipe.triton.models.request_worker import RequestWorker
from specpipe.triton.models.words import from_words_layout


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from specpipe.runtime.cpu.loader import load_engine

    engine, _ = load_engine(make_tiny_engine(tmp_path_factory.mktemp("engines"), "tiny", method="ngram"))
    return engine


# --- preprocessing ---------------------------------------------------------------------------------


def test_preprocessing_outputs(tokenizer):
    pre = Preprocessor(tokenizer)
    out = pre.outputs("Café 日本", 16, ["Paris", ""], ["fox"], None, None)
    ids = tokenizer.encode("Café 日本")
    assert out["INPUT_ID"].dtype == np.int32 and out["INPUT_ID"].tolist() == [ids]
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(ids)]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[16]]
    assert out["STOP_WORDS_IDS"].shape[:2] == (1, 2)
    assert from_words_layout(out["STOP_WORDS_IDS"]) == (tuple(tokenizer.encode("Paris")),)
    assert from_words_layout(out["BAD_WORDS_IDS"]) == (tuple(tokenizer.encode("fox")),)
    assert out["OUT_END_ID"].tolist() == [[tokenizer.convert_tokens_to_ids("<|im_end|>")]]
    assert out["OUT_PAD_ID"].tolist() == [[tokenizer.convert_tokens_to_ids("<|endoftext|>")]]
    given = pre.outputs("x", 1, [], [], 7, 8)
    assert given["OUT_END_ID"].tolist() == [[7]] and given["OUT_PAD_ID"].tolist() == [[8]]
    assert given["STOP_WORDS_IDS"].tolist() == [[[0], [-1]]]


def test_preprocessing_rejects_an_empty_prompt(tokenizer):
    with pytest.raises(ValueError, match="text_input is empty"):
        Preprocessor(tokenizer).encode_prompt("")


def test_chat_text_keeps_its_special_tokens(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    ids = Preprocessor(tokenizer).encode_prompt(text)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(ids) == text


# --- postprocessing --------------------------------------------------------------------------------


def test_split_multibyte_character_is_held_back(tokenizer):
    detok = Detokenizer(tokenizer)
    ids = tokenizer.encode("日")
    assert len(ids) > 1  # the character spans several byte tokens
    assert detok.delta([], ids[:1]) == ""
    assert detok.delta(ids[:1], ids[1:]) == "日"
    assert detok.delta([], ids) == "日"


def test_streamed_chunks_concatenate_to_the_full_text(tokenizer):
    detok = Detokenizer(tokenizer)
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        cuts = sorted(set(rng.sample(range(1, len(ids)), rng.randint(0, len(ids) - 1))) | {len(ids)})
        chunks, prior, start = [], [], 0
        for cut in cuts:
            chunks.append(detok.delta(prior, ids[start:cut]))
            prior, start = ids[:cut], cut
        assert "".join(chunks) == detok.delta([], ids)


def test_special_tokens_are_skipped(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("Paris") + [eos]
    assert Detokenizer(tokenizer).delta([], ids) == "Paris"
    assert Detokenizer(tokenizer, skip_special_tokens=False).delta([], ids) == "Paris<|im_end|>"


def test_rows_cut_to_sequence_length():
    tokens = np.array([[[1, 2, 3, 0]]], np.int32)
    assert _rows(tokens, np.array([[3]], np.int32)) == [[1, 2, 3]]
    assert _rows(np.zeros((1, 1, 0), np.int32), np.array([[0]], np.int32)) == [[]]


# --- request parsing -------------------------------------------------------------------------------


def _inputs(**values):
    arrays = {
        "input_ids": np.array([[3, 4, 5]], np.int32),
        "input_lengths": np.array([3], np.int32),
        "request_output_len": np.array([8], np.int32),
    }
    for name, value in values.items():
        if value is None:
            arrays.pop(name, None)
        else:
            arrays[name] = np.asarray(value)
    return arrays.get


def test_request_without_sampling_inputs_is_greedy():
    request = parse_request(_inputs())
    assert request.input_ids == [3, 4, 5] and request.params.max_tokens == 8
    assert request.params.greedy and not request.streaming and not request.return_perf_metrics
    assert parse_request(_inputs(temperature=np.array([0.7], np.float32))).params.greedy
    assert parse_request(
        _inputs(runtime_top_k=np.array([1], np.int32), runtime_top_p=np.array([0.9], np.float32))
    ).params.greedy


def test_sampling_inputs():
    request = parse_request(
        _inputs(
            runtime_top_k=np.array([20], np.int32),
            runtime_top_p=np.array([0.9], np.float32),
            temperature=np.array([0.5], np.float32),
            seed=np.array([2**63 + 5], np.uint64),
            streaming=np.array([True]),
            return_perf_metrics=np.array([True]),
            end_id=np.array([-1], np.int32),
            stop_words_list=np.array([[[7, 8, 9], [2, 3, -1]]], np.int32),
        )
    )
    p = request.params
    assert not p.greedy and p.top_k == 20 and p.top_p == pytest.approx(0.9) and p.temperature == pytest.approx(0.5)
    assert p.seed == 2**63 + 5 and p.end_id is None and p.stop_words == ((7, 8), (9,))
    assert request.streaming and request.return_perf_metrics
    assert not parse_request(_inputs(runtime_top_p=np.array([1.0], np.float32))).params.greedy


@pytest.mark.parametrize(
    "values, message",
    [
        ({"request_output_len": np.array([0], np.int32)}, "max_tokens must be >= 1, got 0"),
        ({"request_output_len": np.array([-3], np.int32)}, "max_tokens must be >= 1, got -3"),
        ({"runtime_top_k": np.array([-1], np.int32)}, "top_k must be >= 0"),
        ({"runtime_top_p": np.array([0.0], np.float32)}, r"top_p must be in \(0, 1\]"),
        ({"runtime_top_p": np.array([1.5], np.float32)}, r"top_p must be in \(0, 1\]"),
        ({"temperature": np.array([-1.0], np.float32)}, "temperature must be a finite number >= 0"),
        ({"input_ids": np.zeros((1, 0), np.int32), "input_lengths": np.array([0], np.int32)}, "the prompt is empty"),
        ({"input_ids": None}, "input_ids is missing"),
        ({"request_output_len": None}, "max_tokens .* is missing"),
    ],
)
def test_bad_requests_are_rejected(values, message):
    with pytest.raises(ValueError, match=message):
        parse_request(_inputs(**values))


def test_exclude_input_default_comes_from_the_model():
    assert parse_request(_inputs(), exclude_input_default=True).exclude_input_in_output
    assert not parse_request(
        _inputs(exclude_input_in_output=np.array([False])), exclude_input_default=True
    ).exclude_input_in_output


# --- engine worker ---------------------------------------------------------------------------------


def _tokens(responses):
    return [t for outputs, _ in responses for t in outputs["output_ids"].reshape(-1).tolist()]


def test_streaming_and_plain_give_the_same_tokens(engine):
    plain, streamed = RecordingSender(), RecordingSender()
    worker = RequestWorker(solo_scheduler(engine, max_queue=8))
    base = parse_request(_inputs(return_perf_metrics=np.array([True]), exclude_input_in_output=np.array([True])))
    stream = parse_request(_inputs(streaming=np.array([True]), exclude_input_in_output=np.array([True])))
    worker.submit(base, plain)
    worker.submit(stream, streamed)
    worker.close()
    assert len(plain.responses) == 1 and plain.responses[0][1] is True
    outputs = plain.responses[0][0]
    tokens = _tokens(plain.responses)
    assert outputs["output_ids"].shape == (1, 1, len(tokens)) and outputs["sequence_length"].tolist() == [[len(tokens)]]
    assert outputs["prior_output_ids"].shape == (1, 1, 0)
    assert outputs["num_input_tokens"].tolist() == [[3]] and outputs["num_output_tokens"].tolist() == [[len(tokens)]]
    assert outputs["acceptance_rate"].dtype == np.float32 and 0.0 <= outputs["acceptance_rate"].item() <= 1.0
    assert outputs["total_accepted_draft_tokens"].item() <= outputs["total_draft_tokens"].item()
    # Streamed: one response per step, only the last final, priors are the earlier tokens.
    assert [final for _, final in streamed.responses] == [False] * (len(streamed.responses) - 1) + [True]
    assert _tokens(streamed.responses) == tokens
    sent = []
    for out, _ in streamed.responses:
        assert out["prior_output_ids"].reshape(-1).tolist() == sent
        assert "acceptance_rate" not in out
        sent += out["output_ids"].reshape(-1).tolist()


def test_prompt_is_echoed_unless_excluded(engine):
    sender = RecordingSender()
    worker = RequestWorker(solo_scheduler(engine, max_queue=8))
    worker.submit(parse_request(_inputs()), sender)
    worker.close()
    assert _tokens(sender.responses)[:3] == [3, 4, 5]


def test_engine_rejections_become_error_responses_and_the_worker_goes_on(engine):
    too_long, after = RecordingSender(), RecordingSender()
    worker = RequestWorker(solo_scheduler(engine, max_queue=8))
    ids = np.arange(200, dtype=np.int32).reshape(1, -1) % 300
    worker.submit(parse_request(_inputs(input_ids=ids, input_lengths=np.array([200], np.int32))), too_long)
    worker.submit(parse_request(_inputs()), after)
    worker.close()
    assert too_long.responses == [] and len(too_long.errors) == 1
    message, code = too_long.errors[0]
    assert "context limit is 64 tokens" in message and code == "INVALID_ARG"
    assert len(after.responses) == 1 and after.errors == []


def test_requests_are_served_in_arrival_order():
    order = []

    class RecordingEngine:
        def generate(self, input_ids, params):
            order.append(input_ids[0])
            yield StepOutput([1], True, "length", RequestStats(num_input_tokens=1, num_output_tokens=1))

    worker = RequestWorker(RecordingEngine())
    senders = [RecordingSender() for _ in range(5)]
    for i, sender in enumerate(senders):
        worker.submit(parse_request(_inputs(input_ids=np.array([[10 + i]], np.int32), input_lengths=None)), sender)
    worker.close()
    assert order == [10, 11, 12, 13, 14]
    assert all(len(s.responses) == 1 for s in senders)


def test_engine_crash_gives_an_internal_error():
    class BrokenEngine:
        def generate(self, input_ids, params):
            raise RuntimeError("out of memory")

    sender, logged = RecordingSender(), []
    worker = RequestWorker(BrokenEngine(), log_error=logged.append)
    worker.submit(parse_request(_inputs()), sender)
    worker.close()
    assert sender.errors == [("the CPU engine failed on this request: RuntimeError: out of memory", "INTERNAL")]
    assert "out of memory" in logged[0]


def test_stream_without_finished_step_ends_with_an_empty_final():
    class Unfinished:
        def generate(self, input_ids, params):
            yield StepOutput([4, 5], False, None, RequestStats(num_input_tokens=3, num_output_tokens=2))

    emitted = []
    request = parse_request(_inputs(streaming=np.array([True])))
    run_request(Unfinished(), request, lambda outputs, final: emitted.append((outputs, final)))
    assert [o["output_ids"].reshape(-1).tolist() for o, _ in emitted] == [[4, 5], []]
    assert [f for _, f in emitted] == [False, True]
    assert emitted[1][0]["prior_output_ids"].reshape(-1).tolist() == [4, 5]


def test_the_engine_is_loaded_and_run_on_the_worker_thread():
    threads = []

    class ThreadRecordingEngine:
        def generate(self, input_ids, params):
            threads.append(threading.current_thread().name)
            yield StepOutput([1], True, "length", RequestStats(num_input_tokens=1, num_output_tokens=1))

    def load():
        threads.append(threading.current_thread().name)
        return ThreadRecordingEngine()

    worker = RequestWorker(load=load)
    sender = RecordingSender()
    worker.submit(parse_request(_inputs()), sender)
    worker.close()
    assert threads == ["specpipe-engine", "specpipe-engine"] and len(sender.responses) == 1


def test_a_failed_load_is_raised_by_the_constructor():
    def load():
        raise FileNotFoundError("engine directory /nope is missing")

    with pytest.raises(FileNotFoundError, match="/nope"):
        RequestWorker(load=load)
    with pytest.raises(ValueError, match="exactly one"):
        RequestWorker()
