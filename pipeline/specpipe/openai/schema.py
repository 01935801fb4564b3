"""Typed, strict request bodies of the gateway (pydantic), and the OpenAPI document built from them.

Fields and meanings follow OpenAI's API reference for ``POST /v1/completions`` and
``POST /v1/chat/completions``; the extensions ``top_k``, ``repetition_penalty`` and ``min_tokens``
are vLLM's names for TensorRT-LLM's ensemble inputs of the same meaning. Validation behaves as vLLM's
protocol does: strict JSON types (``"stream": "false"`` is refused, not read as true), ranges that fit
the ensemble's tensor types (``max_tokens``/``min_tokens``/``top_k`` INT32, ``seed`` UINT64), and a
field the gateway does not implement is refused by name instead of being ignored:

- unknown fields (``extra="forbid"``);
- known OpenAI options the product does not implement (``logprobs``, ``logit_bias``, tools ...),
  unless sent with their no-op value (``null``, ``false``, ``n: 1``, ``best_of: 1``, an empty
  ``logit_bias``, ``response_format: {"type": "text"}``, ``tool_choice: "none"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

#: Options of OpenAI's API that the gateway does not implement, with the values that mean "off".
UNSUPPORTED_OFF: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None,),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
    "web_search_options": (None,),
}


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage (OpenAI)."""

    model_config = _STRICT
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = _STRICT

    model: Annotated[str, Field(min_length=1, description="any non-empty id: the gateway serves one deployment")]
    max_tokens: Annotated[
        int | None, Field(ge=1, le=INT32_MAX, description="new tokens at most; absent: the rest of the context")
    ] = None
    stream: Annotated[bool | None, Field(description="null: false, as OpenAI takes it")] = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float | None, Field(ge=0.0, le=2.0, description="0: greedy")] = None
    top_p: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    top_k: Annotated[int | None, Field(ge=0, le=INT32_MAX, description="0: off, 1: greedy")] = None
    seed: Annotated[int | None, Field(ge=0, le=UINT64_MAX)] = None
    stop: Annotated[
        str | list[str] | None, Field(description="up to 4 strings; the output ends right before the first one")
    ] = None
    presence_penalty: Annotated[float | None, Field(ge=-2.0, le=2.0)] = None
    frequency_penalty: Annotated[float | None, Field(ge=-2.0, le=2.0)] = None
    repetition_penalty: Annotated[
        float | None, Field(gt=0.0, le=100.0, description="1: off (TensorRT-LLM's definition)")
    ] = None
    min_tokens: Annotated[
        int | None, Field(ge=0, le=INT32_MAX, description="the end of sequence is masked until this many tokens")
    ] = None
    n: Annotated[int | None, Field(ge=1, le=1, description="the gateway returns one choice")] = None
    user: str | None = None
    # Known OpenAI options the gateway refuses unless off (see UNSUPPORTED_OFF).
    logprobs: Any = None
    top_logprobs: Any = None
    echo: Any = None
    best_of: Any = None
    suffix: Any = None
    logit_bias: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    web_search_options: Any = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        if isinstance(value, list) and len(value) > 4:
            raise ValueError(f"at most 4 stop strings ({len(value)} sent)")
        return value

    @model_validator(mode="after")
    def _unsupported(self):
        for name, off in UNSUPPORTED_OFF.items():
            value = getattr(self, name, None)
            if not any(value == o and type(value) is type(o) for o in off):
                raise UnsupportedOption(name, value)
        return self

    def stop_strings(self) -> tuple[str, ...]:
        """The non-empty stop strings."""
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)


class UnsupportedOption(ValueError):
    """An OpenAI option the gateway does not implement, sent with an effective value."""

    def __init__(self, name: str, value: Any):
        super().__init__(f"{name} is not supported by the specpipe gateway, got {value!r}")
        self.name, self.value = name, value


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is one non-empty string (or a list of one string)."""

    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        text = value[0] if isinstance(value, list) else value
        if not text:
            raise ValueError("prompt must be a non-empty string")
        return text


class TextPart(BaseModel):
    """One ``{"type": "text", "text": ...}`` content part."""

    model_config = _STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message; content is text or a list of text parts (tool calls are not supported)."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_required(self):
        if self.content is None and self.role != "assistant":  # OpenAI: only an assistant turn may omit it
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        """The message's text (parts joined; ``None`` is empty)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(ge=1, le=INT32_MAX)] = None


def openapi_document(title: str = "specpipe OpenAI-compatible gateway") -> dict[str, Any]:
    """OpenAPI 3.1 document of the gateway's routes, request bodies from the models above."""
    from pydantic.json_schema import models_json_schema

    _, schemas = models_json_schema(
        [(CompletionRequest, "validation"), (ChatCompletionRequest, "validation")],
        ref_template="#/components/schemas/{model}",
    )
    components = schemas.get("$defs", {})
    error = {
        "description": "OpenAI error object",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    components["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    }

    def post(schema: str) -> dict[str, Any]:
        return {
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
                },
                "responses": {
                    "200": {"description": "a completion, or server-sent events when stream is true"},
                    "400": error,
                    "500": error,
                    "503": error,
                },
            }
        }

    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": {
            "/v1/completions": post("CompletionRequest"),
            "/v1/chat/completions": post("ChatCompletionRequest"),
            "/v1/models": {"get": {"responses": {"200": {"description": "the served model"}}}},
            "/v1/models/{model}": {
                "get": {
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "the model"}, "404": error},
                }
            },
        },
        "components": {"schemas": components},
    }
