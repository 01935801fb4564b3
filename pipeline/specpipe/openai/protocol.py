"""The OpenAI API shapes the gateway reads and writes (completions and chat completions).

Field names and response objects follow OpenAI's API reference for ``/v1/completions``,
``/v1/chat/completions`` (``text_completion``, ``chat.completion``, ``chat.completion.chunk``) and
``/v1/models``. Sampling maps onto the ensemble's inputs as in TensorRT-LLM: ``temperature`` 0 is
greedy (nothing sent); otherwise ``temperature`` (OpenAI's default 1.0) and ``top_p`` (default 1.0)
are sent, which makes the request sample. ``stop`` becomes ``stop_words``.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specpipe.client.llm import GenerationRequest

#: OpenAI's documented default of ``max_tokens`` for ``/v1/completions``.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: The gateway's default for chat (OpenAI's is "up to the context length").
CHAT_DEFAULT_MAX_TOKENS = 512


class APIError(Exception):
    """A request the gateway refuses, as an OpenAI error object with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class ParsedRequest:
    """One OpenAI request, checked.

    Attributes:
        chat: a chat completion (``messages``) rather than a text completion (``prompt``).
        prompt: the completion prompt (``None`` for chat until the template is applied).
        messages: the chat messages as ``{"role", "content"}`` with text content.
        include_usage: ``stream_options.include_usage`` (streamed usage chunk at the end).
    """

    chat: bool
    model: str
    max_tokens: int
    stream: bool
    temperature: float
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    include_usage: bool
    prompt: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def generation_request(self, prompt: str) -> GenerationRequest:
        """The ensemble request for ``prompt`` (the formatted chat or the completion prompt)."""
        sampling = self.temperature > 0
        return GenerationRequest(
            prompt=prompt,
            max_tokens=self.max_tokens,
            stream=self.stream,
            temperature=self.temperature if sampling else None,
            top_p=(self.top_p if self.top_p is not None else 1.0) if sampling else None,
            seed=self.seed if sampling else None,
            stop_words=self.stop,
        )


def _number(body: dict, name: str, default: float | None, low: float, high: float) -> float | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise APIError(400, f"{name} must be a number in [{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _int(body: dict, name: str, default: int | None, low: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise APIError(400, f"{name} must be an integer >= {low}, got {value!r}", name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) <= 4:
        return tuple(v for v in value if v)
    raise APIError(400, "stop must be a string or a list of at most 4 strings", "stop")


def _content(message: Any, index: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise APIError(400, f"messages[{index}] must be an object with a string role", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise APIError(400, f"messages[{index}].content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise APIError(400, f"messages[{index}].content must be a string or a list of text parts", "messages")
    return {"role": message["role"], "content": content}


def parse_request(body: Any, chat: bool) -> ParsedRequest:
    """Check an OpenAI request body.

    Raises:
        APIError: a malformed body, an unsupported option (``n`` > 1, ``logprobs``, ``echo``,
            tools), or a value out of range.
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "model must be a non-empty string", "model")
    if _int(body, "n", 1, 1) != 1:
        raise APIError(400, "n must be 1: the gateway returns one choice", "n")
    for unsupported in ("logprobs", "echo", "tools", "functions", "best_of", "suffix"):
        if body.get(unsupported) not in (None, False, 1 if unsupported == "best_of" else None):
            raise APIError(400, f"{unsupported} is not supported by the specpipe gateway", unsupported)
    default_max = CHAT_DEFAULT_MAX_TOKENS if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = _int(body, "max_completion_tokens", None, 1) if chat else None
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens", default_max, 1)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise APIError(400, f"seed must be a non-negative integer, got {seed!r}", "seed")
    parsed = ParsedRequest(
        chat=chat,
        model=model,
        max_tokens=max_tokens,
        stream=bool(body.get("stream", False)),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", None, 0.0, 1.0),
        seed=seed,
        stop=_stop(body.get("stop")),
        include_usage=bool(options.get("include_usage", False)),
    )
    if parsed.top_p is not None and parsed.top_p <= 0:
        raise APIError(400, "top_p must be in (0, 1]", "top_p")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "messages must be a non-empty list", "messages")
        parsed.messages = [_content(m, i) for i, m in enumerate(messages)]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise APIError(400, "prompt must be a non-empty string (or a list of one string)", "prompt")
        parsed.prompt = prompt
    return parsed


def new_id(chat: bool) -> str:
    """A response id: ``chatcmpl-...`` or ``cmpl-...``."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(perf: dict[str, float]) -> dict[str, int]:
    """OpenAI ``usage`` from the ensemble's perf outputs (0 when a count is missing)."""
    prompt = int(perf.get("num_input_tokens", 0))
    completion = int(perf.get("num_output_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(perf: dict[str, float], max_tokens: int) -> str:
    """``"length"`` when ``max_tokens`` tokens were generated, else ``"stop"`` (EOS or a stop word)."""
    return "length" if int(perf.get("num_output_tokens", 0)) >= max_tokens else "stop"


def completion_object(request_id: str, created: int, model: str, text: str, reason: str, used: dict) -> dict[str, Any]:
    """A non-streamed ``text_completion``."""
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}], "usage": used}


def chat_object(request_id: str, created: int, model: str, text: str, reason: str, used: dict) -> dict[str, Any]:
    """A non-streamed ``chat.completion``."""
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}],
            "usage": used}


def chunk_object(chat: bool, request_id: str, created: int, model: str, text: str | None, reason: str | None,
                 first: bool = False, include_usage: bool = False) -> dict[str, Any]:
    """One streamed chunk: a ``text_completion`` piece, or a ``chat.completion.chunk`` with a ``delta``.

    ``text=None`` with a ``reason`` is the closing chunk; ``first`` adds the assistant role (chat).
    """
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        obj = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        obj = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if include_usage:
        obj["usage"] = None
    return obj


def usage_chunk(chat: bool, request_id: str, created: int, model: str, used: dict) -> dict[str, Any]:
    """The last streamed chunk with ``stream_options.include_usage``: no choices, the usage."""
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": used}


def models_object(names: list[str], created: int | None = None) -> dict[str, Any]:
    """The ``/v1/models`` list."""
    created = int(time.time()) if created is None else created
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "specpipe"} for n in names]}
