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
import logging
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from specpipe.client.probe import not_grpc_hint
from specpipe.client.request import GenerationRequest, build_inputs, tensor_input
from specpipe.errors import SpecpipeError
from specpipe.triton.interface import PERF_OUTPUTS
from specpipe.triton.models.stop_requests import stop_request_values

logger = logging.getLogger(__name__)

#: Seconds to wait for the answer to a stop request.
STOP_TIMEOUT_S = 10.0


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
        connection_lost: the gRPC connection failed or broke (the server is down, was killed, or is
            unreachable) rather than the server answering with an error; ``error`` then says which.
    """

    text: str = ""
    chunks: list[str] = field(default_factory=list)
    chunk_times_s: list[float] = field(default_factory=list)
    ttft_s: float | None = None
    latency_s: float = 0.0
    perf: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    connection_lost: bool = False

    def add_chunk(self, text: str, at_s: float) -> None:
        """Record a non-empty text chunk that arrived ``at_s`` seconds after the request was sent."""
        self.chunks.append(text)
        self.chunk_times_s.append(at_s)
        if self.ttft_s is None:
            self.ttft_s = at_s


def _transport_error(exc: Exception) -> tuple[str, bool]:
    """A one-line description of an exception raised by a gRPC stream, and whether the connection is
    lost (gRPC status ``UNAVAILABLE``: refused, reset or closed, e.g. by a server that died)."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):  # grpc.aio.AioRpcError
        status = getattr(code(), "name", str(code()))
        return f"{status}: {details()}", status == "UNAVAILABLE"
    return f"{type(exc).__name__}: {exc}", False


def _text_of(result) -> str:
    array = result.as_numpy("text_output")
    if array is None:
        return ""
    return "".join(
        item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item) for item in array.reshape(-1)
    )


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
        self._stop_target: tuple[str, bool] | None = None
        self._stop_target_read = False
        self._stop_target_lock = asyncio.Lock()
        self._stopping: set[asyncio.Task] = set()

    async def __aenter__(self) -> "LLMClient":
        from tritonclient.grpc.aio import InferenceServerClient

        self._client = InferenceServerClient(self.url)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Wait (at most :data:`STOP_TIMEOUT_S`) for the stop requests still being sent, then disconnect."""
        if self._stopping:
            await asyncio.wait(self._stopping, timeout=STOP_TIMEOUT_S)
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
            hint = await asyncio.to_thread(not_grpc_hint, self.url) if "UNAVAILABLE" in str(exc.status()) else ""
            raise SpecpipeError(
                f"cannot read the config of model '{model or self.model}' at {self.url}: {hint or exc.message()}"
            ) from exc
        return response["config"]

    async def _is_batched(self) -> bool:
        if self._batched is None:
            config = await self.model_config()
            self._batched = int(config.get("max_batch_size", 0)) > 0
        return self._batched

    async def generate(
        self, request: GenerationRequest, on_text: Callable[[str], None] | None = None
    ) -> GenerationResult:
        """Run one request; ``on_text`` is called with each non-empty text chunk as it arrives.

        ``on_text`` returning ``True`` ends the request there: the gRPC stream is cancelled, which
        cancels the request in Triton (as leaving this coroutine early, e.g. by task cancellation, does),
        and a stop request for it goes to the ensemble's engine model in the background (:meth:`stop`;
        :meth:`close` waits for it). Each request carries a fresh request id (a UUID) for that.

        Returns a result with ``error`` set when the server answers with an error (the exception is
        not raised, so load generators can count errors).

        Raises:
            SpecpipeError: the server is unreachable or the model config cannot be read.
        """
        inputs = build_inputs(request, await self._is_batched())
        result = GenerationResult()
        request_id = uuid.uuid4().hex

        async def requests():
            yield {
                "model_name": self.model,
                "inputs": inputs,
                "request_id": request_id,
                "enable_empty_final_response": True,
            }

        start = time.perf_counter()
        stream = self._client.stream_infer(requests(), stream_timeout=self.timeout_s)
        ended = received = False
        try:
            async for response, error in stream:
                received = True
                now = time.perf_counter() - start
                if error is not None:
                    result.error = error.message() if hasattr(error, "message") else str(error)
                    ended = True
                    break
                text = _text_of(response)
                result.perf.update(_perf_of(response))
                ended = _is_final(response)
                if text:
                    result.add_chunk(text, now)
                    if on_text and on_text(text) is True:
                        break  # the caller has all it wants (a stop string): cancel the request
                if ended:
                    break
        except Exception as exc:  # grpc transport errors surface here
            result.error, result.connection_lost = _transport_error(exc)
            # nothing reached the engine, or the server cannot be reached to take a stop request
            ended = not received or result.connection_lost
        finally:
            stream.cancel()
            if not ended:
                self._send_stop(request_id)
        result.latency_s = time.perf_counter() - start
        result.text = "".join(result.chunks)
        return result

    def _send_stop(self, request_id: str) -> None:
        """Stop the engine request of an abandoned ensemble request, in the background (:meth:`stop`)."""
        task = asyncio.get_running_loop().create_task(self.stop(request_id))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stop(self, request_id: str) -> bool:
        """Send TensorRT-LLM's stop request for ``request_id`` to the ensemble's engine model.

        Cancelling the gRPC stream of an ensemble request does not cancel its running engine step
        (Triton checks an ensemble's cancellation only between steps; server issue #6739), so the
        engine would decode an abandoned request to ``max_tokens``. TensorRT-LLM's ``tensorrt_llm``
        model (and specpipe's CPU one) take a second request with the optional input ``stop`` true and
        the same request id, which the ensemble passed on to its engine step, and cancel that request
        (:mod:`specpipe.triton.models.stop_requests`). Nothing is sent when the model is not an
        ensemble (Triton cancels it itself) or its engine model has no ``stop`` input.

        Returns:
            whether a stop request was sent and acknowledged. Failures are logged, never raised (the
            request may have finished meanwhile, or the server gone).
        """
        try:
            target = await self._engine_with_stop()
            if target is None:
                return False
            model, batched = target
            inputs = [tensor_input(name, value, batched) for name, value in stop_request_values().items()]

            async def one():
                yield {"model_name": model, "inputs": inputs, "request_id": request_id}

            stream = self._client.stream_infer(one(), stream_timeout=STOP_TIMEOUT_S)
            try:
                async for _, error in stream:
                    if error is not None:
                        raise SpecpipeError(error.message() if hasattr(error, "message") else str(error))
                    return True
            finally:
                stream.cancel()
        except Exception as exc:  # noqa: BLE001 - best effort: log, never fail the caller
            logger.warning("could not stop request %s at %s: %s", request_id, self.url, exc)
        return False

    async def _engine_with_stop(self) -> tuple[str, bool] | None:
        """``(engine model, batched)`` when :attr:`model` is an ensemble whose engine step (the step fed
        ``input_ids``, TensorRT-LLM's layout) declares a ``stop`` input; else ``None``. Read once (stops
        sent at the same time wait for that one reading; a failed reading is tried again next time)."""
        async with self._stop_target_lock:
            if not self._stop_target_read:
                self._stop_target = await self._read_stop_target()
                self._stop_target_read = True
        return self._stop_target

    async def _read_stop_target(self) -> tuple[str, bool] | None:
        config = await self.model_config()
        steps = config.get("ensemble_scheduling", {}).get("step", []) if config.get("platform") == "ensemble" else []
        engine = next((step["model_name"] for step in steps if "input_ids" in step.get("input_map", {})), None)
        if engine is None:
            return None
        engine_config = await self.model_config(engine)
        if not any(spec.get("name") == "stop" for spec in engine_config.get("input", [])):
            return None
        return engine, int(engine_config.get("max_batch_size", 0)) > 0


def run_sync(coro):
    """Run a coroutine from synchronous code (the CLI). SIGTERM cancels it as Ctrl-C does, so an
    abandoned request is stopped on the server (:meth:`LLMClient.stop`) before the process exits with
    status 143.
    """
    terminated = False

    async def main():
        nonlocal terminated
        task, loop = asyncio.current_task(), asyncio.get_running_loop()

        def on_sigterm():
            nonlocal terminated
            terminated = True
            task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            return await coro
        try:
            return await coro
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            raise SystemExit(128 + signal.SIGTERM) from None
        raise
