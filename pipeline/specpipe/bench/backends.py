"""The two kinds of deployment ``specpipe bench`` drives, behind one small interface.

- :class:`TritonBackend`: a TensorRT-LLM-style ``ensemble`` over Triton's gRPC streaming API
  (``tritonclient.grpc.aio`` through :class:`~specpipe.client.llm.LLMClient`), with the perf outputs
  (acceptance, draft and output token counters) of each request.
- :class:`~specpipe.bench.openai_backend.OpenAIBackend`: an OpenAI-compatible ``/completions`` or ``/chat/completions`` endpoint,
  streamed as server-sent events (``aiohttp``); output tokens from the final ``usage`` block
  (``stream_options.include_usage``).

Both send greedy requests (Triton: no sampling inputs; OpenAI: ``temperature`` 0) unless a
:class:`~specpipe.bench.backend_base.Sampling` asks for a temperature or top-p, and return a
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
from typing import Any

from specpipe.bench.backend_base import Sampling, TokenCounter, output_count, short_error
from specpipe.bench.endpoints import Endpoint
from specpipe.bench.openai_backend import OpenAIBackend
from specpipe.client.llm import GenerationResult
from specpipe.client.probe import not_grpc_hint
from specpipe.client.request import GenerationRequest, sampling_fields
from specpipe.errors import SpecpipeError

#: Ensemble tensors the load generator needs (TensorRT-LLM ``inflight_batcher_llm`` names).
REQUIRED_INPUTS = ("text_input", "max_tokens", "stream")
REQUIRED_OUTPUTS = ("text_output",)


class TritonBackend:
    """A Triton deployment of a TensorRT-LLM-style ensemble (gRPC)."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout_s: float = 300.0,
        chat: bool = False,
        tokenizer: str | None = None,
        sampling: Sampling = Sampling(),
    ):
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
            raise SpecpipeError(
                f"cannot reach deployment {e.name!r} at {e.address} ({short_error(exc)}): start it "
                f"(specpipe serve NAME) or fix --url {e.name}=HOST:GRPC_PORT"
            ) from exc
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
            raise SpecpipeError(
                f"model {e.model!r} of deployment {e.name!r} has no min_tokens input, which --ignore-eos "
                "needs to generate every requested token: drop --ignore-eos for it"
            )
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

    async def send(
        self, prompt: str, max_tokens: int, seed: int | None = None
    ) -> tuple[GenerationResult, int | None, str]:
        """Stream one request (greedy unless :class:`Sampling` says otherwise); returns (result, output
        tokens, their source)."""
        text = self._template(prompt) if self._template else prompt
        fields = sampling_fields(self.sampling.temperature, None, self.sampling.top_p, seed)
        request = GenerationRequest(
            text,
            max_tokens=max_tokens,
            stream=True,
            return_perf_metrics=True if self.info.get("perf_outputs", True) else None,
            return_num_tokens=True if self.info.get("num_tokens_flags") else None,
            min_tokens=max_tokens if self.sampling.ignore_eos else None,
            **fields,
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


def make_backend(
    endpoint: Endpoint, timeout_s: float, chat: bool, tokenizer: str | None, sampling: Sampling = Sampling()
):
    """The backend for ``endpoint``'s kind."""
    cls = TritonBackend if endpoint.kind == "triton" else OpenAIBackend
    return cls(endpoint, timeout_s=timeout_s, chat=chat, tokenizer=tokenizer, sampling=sampling)
