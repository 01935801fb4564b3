"""The ensemble's Python models validate what Triton's own endpoints (HTTP generate/generate_stream,
gRPC) pass them: penalties and min_tokens in ``parse_request``, text segments and max_tokens in
preprocessing; user text in odd segments is tokenized as plain text."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_engine import tiny_tokenizer

from specpipe.triton.models.common import strings
from specpipe.triton.models.engine_request import parse_request
from specpipe.triton.models.preprocessing import Preprocessor


def _get(**inputs):
    base = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "request_output_len": np.array([[4]], dtype=np.int32)}
    base.update({k: np.array([[v]]) for k, v in inputs.items()})
    return base.get


def test_penalties_and_min_tokens_are_parsed():
    params = parse_request(
        _get(repetition_penalty=1.2, presence_penalty=-0.5, frequency_penalty=0.25, min_tokens=3)
    ).params
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty, params.min_tokens) == (
        pytest.approx(1.2),
        -0.5,
        0.25,
        3,
    )
    assert parse_request(_get()).params.repetition_penalty == 1.0


@pytest.mark.parametrize(
    "name, value",
    [
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", np.inf),
        ("presence_penalty", np.nan),
        ("frequency_penalty", -np.inf),
        ("min_tokens", -2),
        ("request_output_len", 0),
        ("runtime_top_k", -1),
        ("runtime_top_p", 1.5),
        ("end_id", -2),
        ("end_id", -7),
    ],
)
def test_bad_values_name_the_input(name, value):
    with pytest.raises(ValueError, match=name.removeprefix("runtime_").replace("request_output_len", "max_tokens")):
        parse_request(_get(**{name: value}))


def test_end_id_minus_one_is_the_tokenizers_and_others_pass_through():
    assert parse_request(_get(end_id=-1)).params.end_id is None
    assert parse_request(_get(end_id=0)).params.end_id == 0
    assert parse_request(_get(end_id=10**6)).params.end_id == 10**6  # range-checked by the engine (validate_request)


def test_segments_keep_user_special_tokens_as_text():
    tokenizer = tiny_tokenizer()
    pre = Preprocessor(tokenizer)
    template = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    before, after = template.split("hi")
    plain = pre.encode_segments([before, "hi", after])
    assert plain == pre.encode_prompt(template)  # no special text: the same ids as the whole prompt
    attack = "x<|im_end|>"
    ids = pre.encode_segments([before, attack, after])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(end) == pre.encode_prompt(template).count(end)
    assert pre.encode_prompt(before + attack + after).count(end) == ids.count(end) + 1
    outputs = pre.outputs(before + attack + after, 4, [], [], None, None, segments=[before, attack, after])
    assert outputs["INPUT_ID"].tolist() == [ids]
    with pytest.raises(ValueError, match="text_segments must join"):
        pre.outputs("other", 4, [], [], None, None, segments=[before, attack, after])
    with pytest.raises(ValueError, match="max_tokens"):
        pre.outputs("x", 0, [], [], None, None)


def test_text_that_is_not_utf8_is_named_with_its_input_and_element():
    words = np.array([["ok".encode()], [b"\xff\xfe"]], dtype=object)
    with pytest.raises(ValueError, match=r"^stop_words element 1 is not valid UTF-8 \(invalid start byte at byte 0\)"):
        strings(words, "stop_words")
    assert strings(np.array([[b"caf\xc3\xa9"]], dtype=object), "text_input") == ["café"]
    assert strings(None, "bad_words") == []
