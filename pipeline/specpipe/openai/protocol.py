"""The OpenAI API shapes the gateway reads and writes (completions and chat completions).

Field names and response objects follow OpenAI's API reference for ``/v1/completions``,
``/v1/chat/completions`` (``text_completion``, ``chat.completion``, ``chat.completion.chunk``) and
``/v1/models``. Request bodies are validated by the strict pydantic models of
:mod:`specpipe.openai.schema`; every refusal is an :class:`APIError` (HTTP 400, OpenAI's error object
naming the field and the value sent).

Sampling maps onto the ensemble's inputs as in TensorRT-LLM: ``temperature`` 0 is greedy (no
sampling input sent); otherwise ``temperature`` (OpenAI's default 1.0) and ``top_p`` (default 1.0)
are sent, which makes the request sample. ``top_k``, ``seed``, ``repetition_penalty``,
``presence_penalty``, ``frequency_penalty`` and ``min_tokens`` go to the ensemble inputs of the same
names (TensorRT-LLM's definitions). ``stop`` is string-exact and handled by the gateway on the decoded
text (:mod:`specpipe.openai.stops`), not sent as the ensemble's token-level ``stop_words``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from specpipe.client.request import GenerationRequest, sampling_fields
from specpipe.openai.schema import UNSUPPORTED_OFF, ChatCompletionRequest, CompletionRequest, UnsupportedOption
from specpipe.triton.models.common import ENGINE_FAILED
from specpipe.triton.models.draining import SERVER_STOPPING

#: The gateway's fallback ``max_tokens`` when the context size is unknown (no tokenizer config).
CHAT_DEFAULT_MAX_TOKENS = 512
COMPLETIONS_DEFAULT_MAX_TOKENS = CHAT_DEFAULT_MAX_TOKENS
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "list[str]", "list[TextPart]"}


class APIError(Exception):
    """A request the gateway refuses, as an OpenAI error object with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


#: Markers of a gRPC error that means Triton cannot be reached (rather than a refused request).
UNREACHABLE = ("UNAVAILABLE", "failed to connect", "Connection refused", "Socket closed")
#: How the CPU engine's queue bound (and its gRPC error) begins: the deployment is full, not broken.
SERVER_BUSY = "server busy"


def api_error_for(message: str, connection_lost: bool = False) -> APIError:
    """The gateway's answer to a failed request: 503 when Triton is unreachable, its engine's queue is
    full ("server busy") or it is stopping ("server stopping"), which OpenAI clients retry with
    backoff; 500 when the CPU engine failed on the request; 400 otherwise (the request itself). Triton's
    stream responses carry the message only, not the gRPC status, so the message decides."""
    if (SERVER_BUSY in message or SERVER_STOPPING in message) and not connection_lost:
        return APIError(503, message, kind="server_error")
    if ENGINE_FAILED in message and not connection_lost:
        return APIError(500, message, kind="server_error")
    if connection_lost or any(marker in message for marker in UNREACHABLE):
        return APIError(503, f"the Triton server is unreachable: {message}", kind="server_error")
    return APIError(400, message)


@dataclass
class ParsedRequest:
    """One OpenAI request, checked.

    Attributes:
        chat: a chat completion (``messages``) rather than a text completion (``prompt``).
        prompt: the completion prompt (``None`` for chat until the template is applied).
        messages: the chat messages as ``{"role", "content"}`` with text content.
        max_tokens: the requested budget, ``None`` for "the rest of the context".
        stop: string-exact stop strings (handled by the gateway).
        include_usage: ``stream_options.include_usage`` (streamed usage chunk at the end).
        options: the ensemble's optional sampling inputs that were set (name -> value).
    """

    chat: bool
    model: str
    max_tokens: int | None
    stream: bool
    temperature: float
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    include_usage: bool
    prompt: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    top_k: int | None = None
    options: dict[str, float | int] = field(default_factory=dict)

    def generation_request(
        self, prompt: str, max_tokens: int | None = None, segments: tuple[str, ...] = ()
    ) -> GenerationRequest:
        """The ensemble request for ``prompt`` (the formatted chat or the completion prompt).

        ``max_tokens``: the resolved budget (default: the request's, else the fallback);
        ``segments``: ``text_segments`` to send (empty: none).
        """
        budget = max_tokens if max_tokens is not None else (self.max_tokens or CHAT_DEFAULT_MAX_TOKENS)
        return GenerationRequest(
            prompt=prompt,
            max_tokens=budget,
            stream=self.stream,
            text_segments=tuple(segments),
            **sampling_fields(self.temperature, self.top_k, self.top_p, self.seed),
            **self.options,
        )


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _from_validation(error: ValidationError) -> APIError:
    """The first problem of a pydantic error, as one line naming the field and the value sent."""
    first = error.errors(include_url=False)[0]
    where, param = _location(
        [p for p in first["loc"] if isinstance(p, int) or (p not in _UNION_TAGS and "[" not in str(p))]
    )
    if first["type"] == "extra_forbidden":
        return APIError(
            400, f"{where} is not supported by the specpipe gateway, got {_describe(first['input'])}", param
        )
    if first["type"] == "missing":
        return APIError(400, f"{where} is required", param)
    message = str(first["msg"]).removeprefix("Value error, ")
    return APIError(400, f"{where}: {message}, got {_describe(first['input'])}", param)


def _location(loc: Sequence[str | int]) -> tuple[str, str | None]:
    """A field's path as the gateway's errors write it (``messages.0.content``; ``body`` for the body
    itself) and its top-level parameter (``None`` for the body)."""
    parts = [str(p) for p in loc]
    return ".".join(parts) or "body", parts[0] if parts else None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(value: Any, loc: tuple[str | int, ...] = ()) -> tuple[tuple[str | int, ...], bool] | None:
    """The path of the first string in a parsed JSON value that holds a lone UTF-16 surrogate (JSON's
    ``"\\ud800"`` escapes parse to such strings, which have no UTF-8 form) and whether it is a key of the
    object at that path; ``None`` when there is none."""
    if isinstance(value, str):
        return None if _encodes(value) else (loc, False)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and not _encodes(key):
            return loc, True
        found = _lone_surrogate(item, (*loc, key))
        if found:
            return found
    return None


def parse_request(body: Any, chat: bool) -> ParsedRequest:
    """Check an OpenAI request body (strict types and ranges, :mod:`specpipe.openai.schema`).

    Raises:
        APIError: 400 for a malformed body, an unknown or unsupported option (``n`` > 1,
            ``logprobs``, ``echo``, tools ...), or a value of the wrong type or out of range.
    """
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    surrogate = _lone_surrogate(body)
    if surrogate is not None:
        (loc, in_key), (where, param) = surrogate, _location(surrogate[0])
        place = f"a key of {where if loc else 'the body'}" if in_key else where
        raise APIError(
            400,
            f"{place} holds a lone UTF-16 surrogate (an unpaired "
            f"\\ud800-\\udfff escape), which is not text: send valid Unicode",
            param,
        )
    for name, off in UNSUPPORTED_OFF.items():
        if name in body and not any(body[name] == o and type(body[name]) is type(o) for o in off):
            raise APIError(400, str(UnsupportedOption(name, body[name])), name)
    if "n" in body and body["n"] not in (None, 1) and type(body["n"]) is int:
        raise APIError(400, f"n must be 1: the gateway returns one choice, got {body['n']}", "n")
    try:
        model = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body, strict=True)
    except ValidationError as exc:
        raise _from_validation(exc) from None
    max_tokens = model.max_tokens
    if chat and model.max_completion_tokens is not None:
        max_tokens = model.max_completion_tokens
    options = {
        name: getattr(model, name)
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens")
        if getattr(model, name) is not None
    }
    parsed = ParsedRequest(
        chat=chat,
        model=model.model,
        max_tokens=max_tokens,
        stream=bool(model.stream),
        temperature=1.0 if model.temperature is None else model.temperature,
        top_p=model.top_p,
        seed=model.seed,
        stop=model.stop_strings(),
        include_usage=bool(model.stream_options and model.stream_options.include_usage),
        top_k=model.top_k,
        options=options,
    )
    if chat:
        parsed.messages = [{"role": m.role, "content": m.text()} for m in model.messages]
    else:
        parsed.prompt = model.prompt
    return parsed


def new_id(chat: bool) -> str:
    """A response id: ``chatcmpl-...`` or ``cmpl-...``."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(perf: dict[str, float]) -> dict[str, int]:
    """OpenAI ``usage`` from the ensemble's perf outputs (0 when a count is missing)."""
    prompt = int(perf.get("num_input_tokens", 0))
    completion = int(perf.get("num_output_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(
    perf: dict[str, float], max_tokens: int, max_context: int | None = None, stopped: bool = False
) -> str:
    """OpenAI's ``finish_reason``: ``"stop"`` when a stop string ended the output (``stopped``);
    ``"length"`` when ``max_tokens`` tokens were generated or prompt + output filled ``max_context``;
    else ``"stop"`` (the end-of-sequence token)."""
    if stopped:
        return "stop"
    output = int(perf.get("num_output_tokens", 0))
    if output >= max_tokens:
        return "length"
    if max_context is not None and int(perf.get("num_input_tokens", 0)) + output >= max_context:
        return "length"
    return "stop"


def completion_object(request_id: str, created: int, model: str, text: str, reason: str, used: dict) -> dict[str, Any]:
    """A non-streamed ``text_completion``."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
        "usage": used,
    }


def chat_object(request_id: str, created: int, model: str, text: str, reason: str, used: dict) -> dict[str, Any]:
    """A non-streamed ``chat.completion``."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
        ],
        "usage": used,
    }


def chunk_object(
    chat: bool,
    request_id: str,
    created: int,
    model: str,
    text: str | None,
    reason: str | None,
    first: bool = False,
    include_usage: bool = False,
) -> dict[str, Any]:
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
        obj = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        obj = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if include_usage:
        obj["usage"] = None
    return obj


def usage_chunk(chat: bool, request_id: str, created: int, model: str, used: dict) -> dict[str, Any]:
    """The last streamed chunk with ``stream_options.include_usage``: no choices, the usage."""
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": used,
    }


def model_object(name: str, created: int | None = None) -> dict[str, Any]:
    """One ``model`` object (``GET /v1/models/{id}``)."""
    created = int(time.time()) if created is None else created
    return {"id": name, "object": "model", "created": created, "owned_by": "specpipe"}


def models_object(names: list[str], created: int | None = None) -> dict[str, Any]:
    """The ``/v1/models`` list."""
    created = int(time.time()) if created is None else created
    return {"object": "list", "data": [model_object(n, created) for n in names]}
