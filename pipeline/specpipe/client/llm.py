"""An asynchronous gRPC client for a TensorRT-LLM-style ensemble (either runtime).

The client speaks the ensemble interface of TensorRT-LLM's ``inflight_batcher_llm`` repository
(``text_input``, ``max_tokens``, ``stream``, sampling inputs → ``text_output`` and the perf outputs
``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens``), so it drives a
TensorRT-LLM deployment and a specpipe CPU deployment alike. Every request goes over the gRPC
bidirectional stream, which decoupled (streaming) models require; ``stream`` only decides whether
the server sends one response per step or one at the end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from specpipe.errors import SpecpipeError

#: Per-request counters read from a response when present (``draft_length``: CPU runtime only).
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_input_tokens",
                "num_output_tokens", "draft_length")


@dataclass(frozen=True)
class GenerationRequest:
    """One text-generation request.

    ``temperature``/``top_k``/``top_p``/``seed`` left as ``None`` are not sent, which makes the
    request greedy (as in TensorRT-LLM). ``stop_words`` are strings; the server stops before them.
    ``return_perf_metrics=None`` leaves the flag out (for ensembles that do not declare it);
    ``return_num_tokens=True`` also sends ``return_num_input_tokens``/``return_num_output_tokens``
    (upstream ensembles return the token counts only when asked). ``repetition_penalty``,
    ``presence_penalty``, ``frequency_penalty`` and ``min_tokens`` (TensorRT-LLM's definitions) are
    sent only when set. ``text_segments`` (specpipe ensembles only): the prompt in pieces whose odd
    pieces are tokenized as plain text (see :mod:`specpipe.triton.models.preprocessing`).
    """

    prompt: str
    max_tokens: int = 128
    stream: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    end_id: int | None = None
    exclude_input_in_output: bool = True
    return_perf_metrics: bool | None = True
    return_num_tokens: bool | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    text_segments: tuple[str, ...] = ()


@dataclass
class GenerationResult:
    """What came back for one request.

    Attributes:
        text: the whole generated text (the concatenation of ``chunks``).
        chunks: text of each response, in arrival order.
        chunk_times_s: seconds from sending the request to each chunk's arrival.
        ttft_s: time to first token: seconds until the first non-empty chunk (``None`` if none).
        latency_s: seconds until the final response.
        perf: perf outputs of the last response that had them (``acceptance_rate`` float in [0, 1],
            token counts as ints); empty when the server returned none.
        error: the server's error message, or ``None``.
    """

    text: str = ""
    chunks: list[str] = field(default_factory=list)
    chunk_times_s: list[float] = field(default_factory=list)
    ttft_s: float | None = None
    latency_s: float = 0.0
    perf: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def add_chunk(self, text: str, at_s: float) -> None:
        """Record a non-empty text chunk that arrived ``at_s`` seconds after the request was sent."""
        self.chunks.append(text)
        self.chunk_times_s.append(at_s)
        if self.ttft_s is None:
            self.ttft_s = at_s


def _input(name: str, value: np.ndarray, batched: bool):
    from tritonclient.grpc import InferInput
    from tritonclient.utils import np_to_triton_dtype

    array = value[np.newaxis, ...] if batched else value
    tensor = InferInput(name, list(array.shape), "BYTES" if array.dtype == object else np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def build_inputs(request: GenerationRequest, batched: bool) -> list:
    """Triton input tensors for ``request``; ``batched`` adds the leading batch dimension of 1."""
    if request.max_tokens <= 0:
        raise SpecpipeError(f"max_tokens must be positive, got {request.max_tokens}")
    tensors = [
        _input("text_input", np.array([request.prompt.encode()], dtype=object), batched),
        _input("max_tokens", np.array([request.max_tokens], dtype=np.int32), batched),
        _input("stream", np.array([request.stream], dtype=bool), batched),
        _input("exclude_input_in_output", np.array([request.exclude_input_in_output], dtype=bool), batched),
    ]
    if request.return_perf_metrics is not None:
        tensors.append(_input("return_perf_metrics", np.array([request.return_perf_metrics], dtype=bool), batched))
    if request.return_num_tokens is not None:
        for name in ("return_num_input_tokens", "return_num_output_tokens"):
            tensors.append(_input(name, np.array([request.return_num_tokens], dtype=bool), batched))
    optional = {
        "temperature": (request.temperature, np.float32),
        "top_k": (request.top_k, np.int32),
        "top_p": (request.top_p, np.float32),
        "seed": (request.seed, np.uint64),
        "end_id": (request.end_id, np.int32),
        "repetition_penalty": (request.repetition_penalty, np.float32),
        "presence_penalty": (request.presence_penalty, np.float32),
        "frequency_penalty": (request.frequency_penalty, np.float32),
        "min_tokens": (request.min_tokens, np.int32),
    }
    for name, (value, dtype) in optional.items():
        if value is not None:
            tensors.append(_input(name, np.array([value], dtype=dtype), batched))
    for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words),
                        ("text_segments", request.text_segments)):
        if words:
            tensors.append(_input(name, np.array([w.encode() for w in words], dtype=object), batched))
    if request.text_segments and "".join(request.text_segments) != request.prompt:
        raise SpecpipeError("text_segments must join to exactly the prompt")
    return tensors


def _text_of(result) -> str:
    array = result.as_numpy("text_output")
    if array is None:
        return ""
    return "".join(item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item) for item in array.reshape(-1))


def _perf_of(result) -> dict[str, float]:
    perf: dict[str, float] = {}
    for name in PERF_OUTPUTS:
        try:
            array = result.as_numpy(name)
        except Exception:  # tritonclient raises when the output is absent from the response
            array = None
        if array is not None and array.size:
            value = array.reshape(-1)[0].item()
            perf[name] = float(value) if name == "acceptance_rate" else int(value)
    return perf


def _is_final(result) -> bool:
    response = result.get_response()
    final = response.parameters.get("triton_final_response")
    return bool(final and final.bool_param)


class LLMClient:
    """Asynchronous client of one deployment's ensemble (``tritonclient.grpc.aio``).

    Use as ``async with LLMClient("localhost:8001") as client: await client.generate(request)``.

    Raises:
        SpecpipeError: the server is unreachable or the model is not loaded.
    """

    def __init__(self, url: str, model: str = "ensemble", timeout_s: float = 600.0):
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self._client = None
        self._batched: bool | None = None

    async def __aenter__(self) -> "LLMClient":
        from tritonclient.grpc.aio import InferenceServerClient

        self._client = InferenceServerClient(self.url)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def raw(self):
        """The underlying ``tritonclient.grpc.aio.InferenceServerClient``."""
        return self._client

    async def model_config(self, model: str | None = None) -> dict[str, Any]:
        """The model's configuration as a dict (Triton's ``ModelConfig`` JSON form)."""
        from tritonclient.utils import InferenceServerException

        try:
            response = await self._client.get_model_config(model or self.model, as_json=True)
        except InferenceServerException as exc:
            raise SpecpipeError(f"cannot read the config of model '{model or self.model}' at {self.url}: {exc.message()}") from exc
        return response["config"]

    async def _is_batched(self) -> bool:
        if self._batched is None:
            config = await self.model_config()
            self._batched = int(config.get("max_batch_size", 0)) > 0
        return self._batched

    async def generate(self, request: GenerationRequest, on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """Run one request; ``on_text`` is called with each non-empty text chunk as it arrives.

        ``on_text`` returning ``True`` ends the request there: the gRPC stream is cancelled, which
        cancels the request in Triton (as leaving this coroutine early, e.g. by task cancellation, does).

        Returns a result with ``error`` set when the server answers with an error (the exception is
        not raised, so load generators can count errors).

        Raises:
            SpecpipeError: the server is unreachable or the model config cannot be read.
        """
        inputs = build_inputs(request, await self._is_batched())
        result = GenerationResult()

        async def requests():
            yield {"model_name": self.model, "inputs": inputs, "enable_empty_final_response": True}

        start = time.perf_counter()
        stream = self._client.stream_infer(requests(), stream_timeout=self.timeout_s)
        try:
            async for response, error in stream:
                now = time.perf_counter() - start
                if error is not None:
                    result.error = error.message() if hasattr(error, "message") else str(error)
                    break
                text = _text_of(response)
                result.perf.update(_perf_of(response))
                if text:
                    result.add_chunk(text, now)
                    if on_text and on_text(text) is True:
                        break  # the caller has all it wants (a stop string): cancel the request
                if _is_final(response):
                    break
        except Exception as exc:  # grpc transport errors surface here
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            stream.cancel()
        result.latency_s = time.perf_counter() - start
        result.text = "".join(result.chunks)
        return result


def run_sync(coro):
    """Run a coroutine from synchronous code (the CLI)."""
    return asyncio.run(coro)
