"""The two kinds of deployment ``specpipe bench`` drives, behind one small interface.

- :class:`TritonBackend`: a TensorRT-LLM-style ``ensemble`` over Triton's gRPC streaming API
  (``tritonclient.grpc.aio`` through :class:`~specpipe.client.llm.LLMClient`), with the perf outputs
  (acceptance, draft and output token counters) of each request.
- :class:`OpenAIBackend`: an OpenAI-compatible ``/completions`` or ``/chat/completions`` endpoint,
  streamed as server-sent events (``aiohttp``); output tokens from the final ``usage`` block
  (``stream_options.include_usage``).

Both send greedy requests (Triton: no sampling inputs; OpenAI: ``temperature`` 0) unless a
:class:`Sampling` asks for a temperature or top-p, and return a
:class:`~specpipe.client.llm.GenerationResult` plus the token count and its source. ``send`` takes a
per-request ``seed`` (Triton ``seed`` input, UINT64; OpenAI ``seed``).

``ignore_eos`` (exactly ``max_tokens`` output tokens):

- Triton: the ensemble's optional ``min_tokens`` input (INT32, upstream ``inflight_batcher_llm``
  ensemble, see :mod:`specpipe.triton.interface`) is set to ``max_tokens``: TensorRT-LLM and specpipe's
  CPU model mask the end id until that many tokens were generated, so the request runs to
  ``max_tokens`` (bench sends no stop words). An unreachable ``end_id`` is no way out: specpipe's CPU
  model refuses ids outside the vocabulary. The draft-target BLS model refuses ``min_tokens``, so
  ``--ignore-eos`` fails there with the server's message; an ensemble without a ``min_tokens`` input is
  refused by the pre-flight check.
- OpenAI-compatible: vLLM's extra body fields ``ignore_eos: true`` and ``min_tokens`` = ``max_tokens``
  (sampling parameters of ``CompletionRequest`` / ``ChatCompletionRequest`` in
  ``vllm/entrypoints/openai/protocol.py`` @ vllm-project/vllm ec3b890c14b00f6670515d9df8d503b5270e95ca).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from specpipe.bench.endpoints import Endpoint
from specpipe.client.llm import GenerationResult
from specpipe.client.probe import not_grpc_hint, not_http_hint
from specpipe.client.request import GenerationRequest, sampling_fields
from specpipe.errors import SpecpipeError

#: Ensemble tensors the load generator needs (TensorRT-LLM ``inflight_batcher_llm`` names).
REQUIRED_INPUTS = ("text_input", "max_tokens", "stream")
REQUIRED_OUTPUTS = ("text_output",)


@dataclass(frozen=True)
class Sampling:
    """How requests decode: greedy when ``temperature`` is ``None`` or 0 and ``top_p`` is ``None``.

    Attributes:
        temperature: softmax temperature (> 0 samples), or ``None``.
        top_p: nucleus probability mass in (0, 1], or ``None``.
        ignore_eos: generate exactly ``max_tokens`` tokens (module doc).
    """

    temperature: float | None = None
    top_p: float | None = None
    ignore_eos: bool = False


class TokenCounter:
    """Counts tokens of a text with a tokenizer (a local directory or a Hugging Face id), lazily loaded."""

    def __init__(self, source: str | None):
        self.source = source
        self._tokenizer = None

    def __bool__(self) -> bool:
        return bool(self.source)

    def count(self, text: str) -> int:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.source)
        return len(self._tokenizer.encode(text, add_special_tokens=False))


def output_count(result: GenerationResult, usage_tokens: int | None, counter: TokenCounter | None) -> tuple[int | None, str]:
    """The output token count of one request and where it came from (see ``RequestRecord``)."""
    if "num_output_tokens" in result.perf:
        return int(result.perf["num_output_tokens"]), "server"
    if usage_tokens is not None:
        return int(usage_tokens), "usage"
    if counter:
        return counter.count(result.text), "tokenizer"
    return len(result.chunks), "chunks"


class TritonBackend:
    """A Triton deployment of a TensorRT-LLM-style ensemble (gRPC)."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 300.0, chat: bool = False, tokenizer: str | None = None,
                 sampling: Sampling = Sampling()):
        self.endpoint, self.timeout_s, self.chat, self.sampling = endpoint, timeout_s, chat, sampling
        self.client = None
        self.info: dict[str, Any] = {}
        self.counter = TokenCounter(tokenizer)
        self._template = None

    async def open(self) -> None:
        from specpipe.client.llm import LLMClient

        self.client = LLMClient(self.endpoint.address, self.endpoint.model, timeout_s=self.timeout_s)
        await self.client.__aenter__()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def alive(self) -> bool:
        """Whether the server still answers ``is_server_live`` (within 5 s)."""
        try:
            return bool(await self.client.raw.is_server_live(client_timeout=5))
        except Exception:
            return False

    async def preflight(self) -> dict[str, Any]:
        """Check the server, the ensemble and its interface before any load.

        Raises:
            SpecpipeError: unreachable server, model not loaded, or not a TensorRT-LLM-style ensemble.
        """
        e, raw = self.endpoint, self.client.raw
        try:
            live = await raw.is_server_live(client_timeout=10)
        except Exception as exc:
            hint = await asyncio.to_thread(not_grpc_hint, e.address)
            if hint:
                raise SpecpipeError(f"deployment {e.name!r}: {hint} in --url {e.name}=HOST:GRPC_PORT") from exc
            raise SpecpipeError(f"cannot reach deployment {e.name!r} at {e.address} ({_short(exc)}): start it "
                                f"(specpipe serve NAME) or fix --url {e.name}=HOST:GRPC_PORT") from exc
        if not live:
            raise SpecpipeError(f"deployment {e.name!r} at {e.address} is not live: check its server log")
        try:
            ready = await raw.is_model_ready(e.model, client_timeout=10)
        except Exception:
            ready = False
        if not ready:
            models = await self._model_names()
            raise SpecpipeError(
                f"deployment {e.name!r} at {e.address} has no ready model {e.model!r} (models: {', '.join(models) or 'none'}): "
                f"bench drives a TensorRT-LLM-style ensemble; serve one (specpipe package + serve) or pass --model"
            )
        metadata = await raw.get_model_metadata(e.model, as_json=True, client_timeout=10)
        inputs = {t["name"] for t in metadata.get("inputs", [])}
        outputs = {t["name"] for t in metadata.get("outputs", [])}
        missing = [n for n in REQUIRED_INPUTS if n not in inputs] + [n for n in REQUIRED_OUTPUTS if n not in outputs]
        if missing:
            raise SpecpipeError(
                f"model {e.model!r} of deployment {e.name!r} is not a TensorRT-LLM-style ensemble (no {', '.join(missing)}): "
                f"bench needs text_input, max_tokens, stream -> text_output"
            )
        if self.sampling.ignore_eos and "min_tokens" not in inputs:
            raise SpecpipeError(f"model {e.model!r} of deployment {e.name!r} has no min_tokens input, which --ignore-eos "
                                "needs to generate every requested token: drop --ignore-eos for it")
        self.info = {
            "kind": "triton",
            "model": e.model,
            "perf_outputs": "return_perf_metrics" in inputs,
            "num_tokens_flags": "return_num_output_tokens" in inputs,
            "tokenizer_dir": await self._tokenizer_dir(),
        }
        if not self.counter and self.info["tokenizer_dir"]:
            from specpipe.client.chat import is_local_dir

            if is_local_dir(self.info["tokenizer_dir"]):
                self.counter = TokenCounter(self.info["tokenizer_dir"])
        if self.chat:
            self._template = self._chat_formatter()
        return self.info

    async def _model_names(self) -> list[str]:
        try:
            index = await self.client.raw.get_model_repository_index(as_json=True, client_timeout=10)
        except Exception:
            return []
        return sorted(m.get("name", "?") for m in index.get("models", []))

    async def _tokenizer_dir(self) -> str | None:
        from specpipe.client.chat import tokenizer_dir_from_config

        try:
            config = await self.client.model_config("preprocessing")
        except Exception:  # not every ensemble has a model of that name
            return None
        return tokenizer_dir_from_config(config)

    def _chat_formatter(self):
        from specpipe.client.chat import apply_chat_template, is_local_dir

        source = self.counter.source if self.counter else self.info.get("tokenizer_dir")
        if not source or not (is_local_dir(source) or self.counter):
            raise SpecpipeError(
                f"--chat needs deployment {self.endpoint.name!r}'s tokenizer on this machine (its tokenizer_dir "
                f"{self.info.get('tokenizer_dir')!r} is not here): pass --tokenizer DIR_OR_ID or drop --chat"
            )
        apply_chat_template("test", source)  # fails now, with a clear message, rather than per request
        return lambda prompt: apply_chat_template(prompt, source)

    async def send(self, prompt: str, max_tokens: int, seed: int | None = None) -> tuple[GenerationResult, int | None, str]:
        """Stream one request (greedy unless :class:`Sampling` says otherwise); returns (result, output
        tokens, their source)."""
        text = self._template(prompt) if self._template else prompt
        fields = sampling_fields(self.sampling.temperature, None, self.sampling.top_p, seed)
        request = GenerationRequest(
            text, max_tokens=max_tokens, stream=True,
            return_perf_metrics=True if self.info.get("perf_outputs", True) else None,
            return_num_tokens=True if self.info.get("num_tokens_flags") else None,
            min_tokens=max_tokens if self.sampling.ignore_eos else None, **fields,
        )
        result = await self.client.generate(request)
        tokens, source = output_count(result, None, self.counter)
        return result, tokens, source

    async def counters(self) -> dict | None:
        """The server's speculative-decoding counters now (see :mod:`specpipe.bench.metrics`), or ``None``.
        Triton labels samples with its composing models, not the ensemble, so every model's count."""
        import aiohttp

        from specpipe.bench.metrics import scrape, spec_counters

        if not self.endpoint.metrics_url:
            return None
        async with aiohttp.ClientSession() as session:
            samples = await scrape(session, self.endpoint.metrics_url)
        return spec_counters(samples) if samples else None


class OpenAIBackend:
    """An OpenAI-compatible server (``/v1/completions`` or ``/v1/chat/completions``), streamed."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 300.0, chat: bool = False, tokenizer: str | None = None,
                 sampling: Sampling = Sampling()):
        self.endpoint, self.timeout_s, self.sampling = endpoint, timeout_s, sampling
        self.chat = chat or endpoint.chat
        self.model = endpoint.model
        self.session = None
        self.info: dict[str, Any] = {}
        self.counter = TokenCounter(tokenizer)

    async def open(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _models(self, timeout_s: float) -> list[str]:
        import aiohttp

        async with self.session.get(f"{self.endpoint.address}/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status != 200:
                raise SpecpipeError(f"GET {self.endpoint.address}/models answered HTTP {reply.status}")
            body = await reply.json(content_type=None)
        return [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]

    async def alive(self) -> bool:
        try:
            await self._models(5)
            return True
        except Exception:
            return False

    async def preflight(self) -> dict[str, Any]:
        """Check the server answers ``/models`` and pick the model.

        Raises:
            SpecpipeError: unreachable server, no model, or several models and no ``?model=``.
        """
        e = self.endpoint
        try:
            models = await self._models(10)
        except Exception as exc:
            hint = await asyncio.to_thread(not_http_hint, e.address)
            if hint:
                raise SpecpipeError(f"deployment {e.name!r} (--url {e.name}=openai://...): {hint}") from exc
            raise SpecpipeError(f"cannot reach deployment {e.name!r} at {e.address} ({_short(exc)}): start the server "
                                f"or fix --url {e.name}=openai://HOST:PORT/v1") from exc
        if self.model is None:
            if len(models) != 1:
                raise SpecpipeError(f"deployment {e.name!r} at {e.address} serves {len(models)} models ({', '.join(models) or 'none'}): "
                                    f"pick one with --url {e.name}=openai://HOST:PORT/v1?model=ID")
            self.model = models[0]
        elif self.model not in models:
            raise SpecpipeError(f"deployment {e.name!r} at {e.address} does not serve model {self.model!r} (it serves "
                                f"{', '.join(models) or 'none'}): fix ?model=")
        self.info = {"kind": "openai", "model": self.model, "api": "chat/completions" if self.chat else "completions"}
        return self.info

    def _body(self, prompt: str, max_tokens: int, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": True,
                                "temperature": self.sampling.temperature or 0.0, "stream_options": {"include_usage": True}}
        if self.sampling.top_p is not None:
            body["top_p"] = self.sampling.top_p
        if seed is not None:
            body["seed"] = seed
        if self.sampling.ignore_eos:
            body.update(ignore_eos=True, min_tokens=max_tokens)
        if self.chat:
            return "chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
        return "completions", {**body, "prompt": prompt}

    async def send(self, prompt: str, max_tokens: int, seed: int | None = None) -> tuple[GenerationResult, int | None, str]:
        """Stream one request (greedy unless :class:`Sampling` says otherwise); returns (result, output
        tokens, their source)."""
        path, body = self._body(prompt, max_tokens, seed)
        result, usage_tokens = GenerationResult(), None
        start = time.perf_counter()
        try:
            async with self.session.post(f"{self.endpoint.address}/{path}", json=body) as reply:
                if reply.status != 200:
                    result.error = f"HTTP {reply.status}: {(await reply.text())[:300]}"
                else:
                    async for event in _sse_events(reply.content):
                        now = time.perf_counter() - start
                        if event == "[DONE]":
                            break
                        data = json.loads(event)
                        if "error" in data:
                            result.error = str(data["error"].get("message", data["error"]) if isinstance(data["error"], dict) else data["error"])
                            break
                        text = _chunk_text(data)
                        if text:
                            result.add_chunk(text, now)
                        usage = data.get("usage") or {}
                        if usage.get("completion_tokens") is not None:
                            usage_tokens = int(usage["completion_tokens"])
        except Exception as exc:  # connection lost, bad JSON, timeout
            result.error = f"{type(exc).__name__}: {_short(exc)}"
        result.latency_s = time.perf_counter() - start
        result.text = "".join(result.chunks)
        tokens, source = output_count(result, usage_tokens, self.counter)
        return result, tokens, source

    async def counters(self) -> dict | None:
        """The server's speculative-decoding counters now (see :mod:`specpipe.bench.metrics`), or ``None``."""
        from specpipe.bench.metrics import scrape, spec_counters

        if not self.endpoint.metrics_url:
            return None
        samples = await scrape(self.session, self.endpoint.metrics_url)
        return spec_counters(samples, self.model) if samples else None


def _chunk_text(data: dict) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


async def _sse_events(stream):
    """The ``data:`` payloads of a server-sent-event stream, one per event."""
    data: list[str] = []
    async for raw in stream:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            data.append(line[6:] if line[5:6] == " " else line[5:])
    if data:
        yield "\n".join(data)


def _short(exc: BaseException) -> str:
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return (message or type(exc).__name__).strip().splitlines()[0][:200]


def make_backend(endpoint: Endpoint, timeout_s: float, chat: bool, tokenizer: str | None, sampling: Sampling = Sampling()):
    """The backend for ``endpoint``'s kind."""
    cls = TritonBackend if endpoint.kind == "triton" else OpenAIBackend
    return cls(endpoint, timeout_s=timeout_s, chat=chat, tokenizer=tokenizer, sampling=sampling)
