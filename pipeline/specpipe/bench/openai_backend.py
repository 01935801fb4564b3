"""The OpenAI-compatible bench backend: ``/v1/completions`` or ``/v1/chat/completions`` streamed as
server-sent events over ``aiohttp``, output tokens from the final ``usage`` block (the module doc of
:mod:`specpipe.bench.backends` describes both backends, sampling and ``ignore_eos``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from specpipe.bench.backend_base import Sampling, TokenCounter, output_count, short_error
from specpipe.bench.endpoints import Endpoint
from specpipe.client.llm import GenerationResult
from specpipe.client.probe import not_http_hint
from specpipe.errors import SpecpipeError


class OpenAIBackend:
    """An OpenAI-compatible server (``/v1/completions`` or ``/v1/chat/completions``), streamed."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout_s: float = 300.0,
        chat: bool = False,
        tokenizer: str | None = None,
        sampling: Sampling = Sampling(),
    ):
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

        async with self.session.get(
            f"{self.endpoint.address}/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as reply:
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
            raise SpecpipeError(
                f"cannot reach deployment {e.name!r} at {e.address} ({short_error(exc)}): start the server "
                f"or fix --url {e.name}=openai://HOST:PORT/v1"
            ) from exc
        if self.model is None:
            if len(models) != 1:
                raise SpecpipeError(
                    f"deployment {e.name!r} at {e.address} serves {len(models)} models ({', '.join(models) or 'none'}): "
                    f"pick one with --url {e.name}=openai://HOST:PORT/v1?model=ID"
                )
            self.model = models[0]
        elif self.model not in models:
            raise SpecpipeError(
                f"deployment {e.name!r} at {e.address} does not serve model {self.model!r} (it serves "
                f"{', '.join(models) or 'none'}): fix ?model="
            )
        self.info = {"kind": "openai", "model": self.model, "api": "chat/completions" if self.chat else "completions"}
        return self.info

    def _body(self, prompt: str, max_tokens: int, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": self.sampling.temperature or 0.0,
            "stream_options": {"include_usage": True},
        }
        if self.sampling.top_p is not None:
            body["top_p"] = self.sampling.top_p
        if seed is not None:
            body["seed"] = seed
        if self.sampling.ignore_eos:
            body.update(ignore_eos=True, min_tokens=max_tokens)
        if self.chat:
            return "chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
        return "completions", {**body, "prompt": prompt}

    async def send(
        self, prompt: str, max_tokens: int, seed: int | None = None
    ) -> tuple[GenerationResult, int | None, str]:
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
                            result.error = str(
                                data["error"].get("message", data["error"])
                                if isinstance(data["error"], dict)
                                else data["error"]
                            )
                            break
                        text = _chunk_text(data)
                        if text:
                            result.add_chunk(text, now)
                        usage = data.get("usage") or {}
                        if usage.get("completion_tokens") is not None:
                            usage_tokens = int(usage["completion_tokens"])
        except Exception as exc:  # connection lost, bad JSON, timeout
            result.error = f"{type(exc).__name__}: {short_error(exc)}"
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
