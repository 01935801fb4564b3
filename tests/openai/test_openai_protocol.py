"""The OpenAI gateway without a server: request checks, sampling mapping, response shapes, Prometheus metrics."""

import json

import pytest

from specpipe.bench.metrics import parse_samples
from specpipe.openai.metrics import GatewayMetrics
from specpipe.openai.protocol import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    APIError,
    chunk_object,
    finish_reason,
    models_object,
    parse_request,
    usage,
    usage_chunk,
)


def test_completion_defaults_and_greedy_mapping():
    parsed = parse_request({"model": "m", "prompt": ["Hello"], "temperature": 0}, chat=False)
    assert parsed.prompt == "Hello" and parsed.max_tokens is None and not parsed.stream  # None: the rest of the context
    request = parsed.generation_request("Hello", max_tokens=30)
    assert (request.temperature, request.top_p, request.seed, request.max_tokens) == (None, None, None, 30)
    assert parsed.generation_request("Hello").max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS  # no context known


def test_sampling_is_sent_unless_temperature_is_zero():
    parsed = parse_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "seed": 7,
            "stop": "\n\n",
            "max_completion_tokens": 20,
            "max_tokens": 99,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        chat=True,
    )
    assert parsed.max_tokens == 20 and parsed.stream and parsed.include_usage and parsed.stop == ("\n\n",)
    request = parsed.generation_request("formatted")
    assert (request.temperature, request.top_p, request.seed, request.stop_words, request.stream) == (
        1.0,
        1.0,
        7,
        (),
        True,
    )
    chat = parse_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "temperature": 0.5,
            "top_p": 0.9,
        },
        chat=True,
    )
    assert chat.messages == [{"role": "user", "content": "ab"}] and chat.max_tokens is None and CHAT_DEFAULT_MAX_TOKENS
    assert (chat.generation_request("x").temperature, chat.generation_request("x").top_p) == (0.5, pytest.approx(0.9))


@pytest.mark.parametrize(
    "body, chat, param",
    [
        ([], False, None),
        ({"prompt": "x"}, False, "model"),
        ({"model": "m"}, False, "prompt"),
        ({"model": "m", "prompt": "x", "n": 2}, False, "n"),
        ({"model": "m", "prompt": "x", "temperature": 3}, False, "temperature"),
        ({"model": "m", "prompt": "x", "top_p": 0}, False, "top_p"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, False, "max_tokens"),
        ({"model": "m", "prompt": "x", "logprobs": 2}, False, "logprobs"),
        ({"model": "m", "prompt": "x", "stop": ["a", 1]}, False, "stop"),
        ({"model": "m", "messages": []}, True, "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, True, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, True, "messages"),
    ],
)
def test_bad_requests_are_400_with_the_parameter(body, chat, param):
    with pytest.raises(APIError) as caught:
        parse_request(body, chat)
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, chat, param, where",
    [
        ({"model": "m", "prompt": "\ud800 hi"}, False, "prompt", "prompt holds"),
        ({"model": "m", "prompt": ["ok", "b\udfff"]}, False, "prompt", "prompt.1 holds"),
        ({"model": "m", "prompt": "x", "stop": ["a", "\udc00"]}, False, "stop", "stop.1 holds"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "a\udfff"}]},
            True,
            "messages",
            "messages.0.content holds",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]},
            True,
            "messages",
            "messages.0.content.0.text holds",
        ),
        ({"model": "m", "prompt": "x", "\ud800": 1}, False, None, "a key of the body holds"),
    ],
)
def test_lone_surrogates_are_400_naming_where(body, chat, param, where):
    with pytest.raises(APIError) as caught:
        parse_request(body, chat)
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.message.startswith(where) and "surrogate" in caught.value.message


def test_paired_surrogate_escapes_are_text():
    body = json.loads('{"model": "m", "prompt": "hi \\ud83d\\ude00"}')  # JSON joins the pair into one code point
    assert parse_request(body, chat=False).prompt == "hi \U0001f600"


def test_response_shapes():
    perf = {"num_input_tokens": 5, "num_output_tokens": 8}
    assert usage(perf) == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    assert finish_reason(perf, 8) == "length" and finish_reason(perf, 9) == "stop"
    first = chunk_object(True, "id", 1, "m", "Hi", None, first=True, include_usage=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "Hi",
    }
    assert first["usage"] is None
    last = chunk_object(True, "id", 1, "m", None, "stop")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop" and "usage" not in last
    text = chunk_object(False, "id", 1, "m", "x", None)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "x"
    tail = usage_chunk(True, "id", 1, "m", usage(perf))
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 13
    assert models_object(["dep"], created=3) == {
        "object": "list",
        "data": [{"id": "dep", "object": "model", "created": 3, "owned_by": "specpipe"}],
    }


def test_gateway_metrics_export_acceptance_per_deployment():
    metrics = GatewayMetrics()
    metrics.record(
        "spec",
        {"num_input_tokens": 4, "num_output_tokens": 9, "total_draft_tokens": 8, "total_accepted_draft_tokens": 4},
    )
    metrics.record(
        "spec",
        {"num_input_tokens": 6, "num_output_tokens": 5, "total_draft_tokens": 4, "total_accepted_draft_tokens": 1},
    )
    metrics.record("spec", {}, error=True)
    metrics.record(
        "base",
        {"num_input_tokens": 4, "num_output_tokens": 9, "total_draft_tokens": 0, "total_accepted_draft_tokens": 0},
    )
    samples = parse_samples(metrics.render().decode())
    value = lambda name, model: [v for labels, v in samples[name] if labels["model"] == model][0]  # noqa: E731
    assert value("specpipe_requests_total", "spec") == 2 and value("specpipe_request_errors_total", "spec") == 1
    assert value("specpipe_output_tokens_total", "spec") == 14 and value("specpipe_input_tokens_total", "spec") == 10
    assert (
        value("specpipe_draft_tokens_total", "spec") == 12
        and value("specpipe_accepted_draft_tokens_total", "spec") == 5
    )
    assert value("specpipe_acceptance_rate", "spec") == pytest.approx(5 / 12)
    assert value("specpipe_mean_accepted_length", "spec") == pytest.approx(12 / 7)  # (8 + 4) / (4 + 3)
    assert value("specpipe_mean_accepted_length", "base") == 1.0
    assert [labels["model"] for labels, _ in samples["specpipe_acceptance_rate"]] == [
        "spec"
    ]  # undefined without drafts
    assert metrics.acceptance("spec") == (pytest.approx(5 / 12), pytest.approx(12 / 7))
    assert metrics.acceptance("nobody") == (None, None)


def test_gateway_mean_accepted_length_reads_the_target_forwards_where_the_deployment_returns_them():
    """A CPU deployment returns each request's target forwards F: the length is then sum(F - 1 + A) / sum(F - 1),
    exact also for a request whose end id or stop word was committed but not sent (the output count N would
    say (N - 1) / (N - 1 - A), too few steps)."""
    metrics = GatewayMetrics()
    # 6 tokens generated in 3 forwards (1 + 2 + 3), the last one the end id: 5 sent, 3 drafts accepted
    metrics.record(
        "cpu", {"num_output_tokens": 5, "total_draft_tokens": 6, "total_accepted_draft_tokens": 3, "target_forwards": 3}
    )
    # ended by a 2-token stop word: 7 generated in 4 forwards, 5 sent
    metrics.record(
        "cpu", {"num_output_tokens": 5, "total_draft_tokens": 6, "total_accepted_draft_tokens": 3, "target_forwards": 4}
    )
    metrics.record(
        "cpu", {"num_output_tokens": 0, "total_draft_tokens": 0, "total_accepted_draft_tokens": 0, "target_forwards": 1}
    )
    assert metrics.acceptance("cpu") == (pytest.approx(6 / 12), pytest.approx((2 + 3 + 3 + 3) / (2 + 3)))
