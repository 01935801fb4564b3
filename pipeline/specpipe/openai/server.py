"""The gateway's request handlers (:class:`Gateway`); :mod:`.http_server` makes them an aiohttp application
and serves it from a background thread.

Each OpenAI request becomes one streamed gRPC request to the ensemble; the ensemble's text chunks
are relayed as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``) or joined into one
JSON response. Any ``model`` string is accepted, since the gateway serves one deployment; responses,
``/v1/models`` and ``/v1/models/{id}`` name it by the deployment's name.

Order of work per request (issue 12): strict validation (:mod:`.schema`), prompt formatting and
tokenization with the budget checks (:mod:`.prompting`), then the request to Triton; the HTTP status
is sent only once Triton's first response (or error) arrived, so every refusal is an HTTP error with
an OpenAI error object, and only failures during generation travel inside an event stream. Ensemble
errors become HTTP 503 when Triton cannot be reached, is full or is stopping, 500 when the engine
failed, 400 otherwise (:func:`~specpipe.openai.protocol.api_error_for`). ``stop`` is string-exact
(:mod:`.stops`): when a stop string completes, the Triton request is cancelled. When the HTTP client
goes away (closed transport; aiohttp cancels the handler), the gRPC stream is cancelled and, since
Triton does not cancel an ensemble's running step, TensorRT-LLM's stop request is sent to the engine
model (:meth:`specpipe.client.llm.LLMClient.stop`). Unknown
routes and methods answer OpenAI-style JSON errors (404/405, :mod:`.http_server`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from specpipe.client.request import GenerationRequest
from specpipe.errors import SpecpipeError
from specpipe.openai.metrics import GatewayMetrics
from specpipe.openai.prompting import PreparedPrompt, Prompter, warm_up
from specpipe.openai.protocol import (
    APIError,
    ParsedRequest,
    api_error_for,
    chat_object,
    chunk_object,
    completion_object,
    finish_reason,
    model_object,
    models_object,
    new_id,
    parse_request,
    usage_chunk,
)
from specpipe.openai.relay import Generation
from specpipe.openai.schema import openapi_document

#: Seconds ``/health`` waits for the tokenizer's warm-up before answering 503 (:func:`.prompting.warm_up`).
WARM_UP_WAIT_S = 5.0


class Gateway:
    """The translation between the OpenAI API and one deployment's ensemble.

    Args:
        grpc_url: Triton gRPC endpoint ``HOST:PORT``.
        name: the deployment's name (the served model id).
        tokenizer_dir: the deployment's tokenizer; ``None`` reads the ``tokenizer_dir`` parameter of
            its ``preprocessing`` model on first use.
        model: the ensemble's Triton model name.
        max_context: prompt + output tokens of the engine; ``None`` reads ``max_position_embeddings``
            beside the tokenizer.
        client: an :class:`~specpipe.client.llm.LLMClient`-like object (tests pass a fake one);
            ``None`` connects to ``grpc_url`` on start.

    Attributes:
        stopping: set while the server behind it stops: ``/health`` answers 503, so that a load
            balancer's readiness probe sends no more traffic (new requests get 503 anyway).
    """

    def __init__(
        self,
        grpc_url: str,
        name: str,
        tokenizer_dir: str | None = None,
        model: str = "ensemble",
        max_context: int | None = None,
        client=None,
    ):
        self.grpc_url, self.name, self.model = grpc_url, name, model
        self.tokenizer_dir, self.max_context = tokenizer_dir, max_context
        self.metrics = GatewayMetrics()
        self.client = client
        self._own_client = client is None
        self.stopping = False
        self._prompter: Prompter | None = None
        self._inputs: set[str] | None = None
        self._warming: asyncio.Future | None = None

    async def start(self, app=None) -> None:
        if self.client is None:
            from specpipe.client.llm import LLMClient

            self.client = LLMClient(self.grpc_url, self.model)
            await self.client.__aenter__()
        self._warming = asyncio.ensure_future(warm_up(self.prompter))  # /health waits for it

    async def stop(self, app=None) -> None:
        if self._warming is not None:
            self._warming.cancel()
        if self.client is not None and self._own_client:
            await self.client.close()
            self.client = None

    async def prompter(self) -> Prompter:
        """The deployment's :class:`~specpipe.openai.prompting.Prompter` (loaded once).

        Raises:
            APIError: 500 when the tokenizer cannot be found or loaded.
        """
        if self._prompter is None:
            from specpipe.client.chat import tokenizer_dir_from_config
            from specpipe.triton.models.common import parse_bool

            source, special = self.tokenizer_dir, True
            try:
                config = await self.client.model_config("preprocessing")
                params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
                special = parse_bool(params.get("add_special_tokens"), True)
                source = source or tokenizer_dir_from_config(config)
            except (SpecpipeError, ValueError) as exc:
                if source is None:
                    raise APIError(503, f"cannot find the deployment's tokenizer: {exc}", kind="server_error") from exc
            if not source:
                raise APIError(500, "the deployment's preprocessing model names no tokenizer_dir", kind="server_error")
            try:
                self._prompter = await asyncio.to_thread(Prompter, source, special, self.max_context)
            except SpecpipeError as exc:
                raise APIError(500, str(exc), kind="server_error") from exc
        return self._prompter

    async def ensemble_inputs(self) -> set[str] | None:
        """Names of the ensemble's inputs (read once), or ``None`` while the server cannot be asked."""
        if self._inputs is None:
            try:
                metadata = await self.client.raw.get_model_metadata(self.model, as_json=True, client_timeout=10)
                self._inputs = {t["name"] for t in metadata.get("inputs", [])}
            except Exception:  # unreachable now: the request itself will report the error
                return None
        return self._inputs

    async def ensemble_request(self, parsed: ParsedRequest, prompt: PreparedPrompt) -> GenerationRequest:
        """The ensemble request: perf outputs and token counts only when the ensemble declares those
        inputs, stream from Triton when the client streams or stop strings must be watched.

        Raises:
            APIError: 400 naming an option the deployment's ensemble has no input for.
        """
        import dataclasses

        request = parsed.generation_request(prompt.text, prompt.max_tokens, prompt.segments)
        inputs = await self.ensemble_inputs()
        if inputs is None:
            return dataclasses.replace(request, stream=parsed.stream or bool(parsed.stop))
        for name in (
            *parsed.options,
            *(("top_k",) if request.top_k is not None else ()),
            *(("text_segments",) if prompt.segments else ()),
        ):
            if name not in inputs:
                raise APIError(
                    400, f"{name} is not supported by this deployment's ensemble (it has no {name} input)", name
                )
        return dataclasses.replace(
            request,
            stream=parsed.stream or bool(parsed.stop),
            return_perf_metrics=True if "return_perf_metrics" in inputs else None,
            return_num_tokens=True if "return_num_output_tokens" in inputs else None,
        )

    # -- handlers ---------------------------------------------------------------------------------
    async def models(self, request):
        from aiohttp import web

        return web.json_response(models_object([self.name]))

    async def retrieve_model(self, request):
        from aiohttp import web

        wanted = request.match_info["model"]
        if wanted != self.name:
            return self._model_not_found(wanted)
        return web.json_response(model_object(self.name))

    def _model_not_found(self, wanted: str):
        """OpenAI's (and vLLM's) answer to a model name the server does not serve: 404 ``model_not_found``."""
        from aiohttp import web

        error = APIError(404, f"The model '{wanted}' does not exist: this gateway serves '{self.name}'", "model")
        return web.json_response({"error": {**error.body()["error"], "code": "model_not_found"}}, status=404)

    async def openapi(self, request):
        from aiohttp import web

        return web.json_response(openapi_document())

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat_completions(self, request):
        return await self._handle(request, chat=True)

    async def prometheus(self, request):
        from aiohttp import web

        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    async def health(self, request):
        from aiohttp import web

        if self.stopping:
            return web.json_response({"ready": False, "stopping": True}, status=503)
        if self._warming is not None and not self._warming.done():
            await asyncio.wait([self._warming], timeout=WARM_UP_WAIT_S)
            if not self._warming.done():
                return web.json_response({"ready": False, "warming_up": True}, status=503)
        try:
            ready = await self.client.raw.is_server_ready(client_timeout=5)
        except Exception:
            ready = False
        return web.json_response({"ready": bool(ready)}, status=200 if ready else 503)

    async def _handle(self, request, chat: bool):
        from aiohttp import web

        try:
            try:
                body = json.loads(await request.read())
            except (ValueError, UnicodeDecodeError) as exc:
                raise APIError(400, f"the request body is not valid JSON ({exc})") from exc
            parsed = parse_request(body, chat)
            if parsed.model != self.name:
                return self._model_not_found(parsed.model)
            prompter = await self.prompter()
            prompt = prompter.prepare(parsed, segments_supported=await self._segments_supported())
            generation = Generation(
                self.client, await self.ensemble_request(parsed, prompt), parsed.stop, request, prompter.count_tokens
            )
        except APIError as exc:
            return web.json_response(exc.body(), status=exc.status)
        try:
            first = await generation.next()
            if first is None:  # finished before any text: an error is still an HTTP error
                result = generation.result()
                if result.error is not None:
                    self.metrics.record(self.name, {}, error=True)
                    error = api_error_for(result.error, result.connection_lost)
                    return web.json_response(error.body(), status=error.status)
            if parsed.stream:
                return await self._stream(request, parsed, prompt, generation, first)
            return await self._whole(parsed, prompt, generation, first)
        finally:
            generation.cancel()  # no-op once finished; stops Triton when the client went away

    async def _whole(self, parsed: ParsedRequest, prompt: PreparedPrompt, generation: Generation, first: str | None):
        from aiohttp import web

        texts = [first] if first else []
        while first is not None and (text := await generation.next()) is not None:
            texts.append(text)
        result = generation.result()
        if result.error is not None:
            self.metrics.record(self.name, {}, error=True)
            error = api_error_for(result.error, result.connection_lost)
            return web.json_response(error.body(), status=error.status)
        self.metrics.record(self.name, result.perf)
        build = chat_object if parsed.chat else completion_object
        reason = finish_reason(result.perf, prompt.max_tokens, self._context(), generation.stops.stopped)
        return web.json_response(
            build(
                new_id(parsed.chat), int(time.time()), self.name, "".join(texts), reason, generation.usage(result.perf)
            )
        )

    async def _stream(
        self, request, parsed: ParsedRequest, prompt: PreparedPrompt, generation: Generation, first: str | None
    ):
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        request_id, created = new_id(parsed.chat), int(time.time())

        async def send(obj: Any) -> None:
            await response.write(f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode())

        opened = False
        text = first
        while text is not None:
            await send(
                chunk_object(
                    parsed.chat,
                    request_id,
                    created,
                    self.name,
                    text,
                    None,
                    first=not opened,
                    include_usage=parsed.include_usage,
                )
            )
            opened = True
            text = await generation.next()
        result = generation.result()
        if result.error is not None:
            self.metrics.record(self.name, {}, error=True)
            await send(api_error_for(result.error, result.connection_lost).body())
        else:
            self.metrics.record(self.name, result.perf)
            if not opened and parsed.chat:  # no text at all: still open the assistant's turn
                await send(
                    chunk_object(
                        True, request_id, created, self.name, "", None, first=True, include_usage=parsed.include_usage
                    )
                )
            reason = finish_reason(result.perf, prompt.max_tokens, self._context(), generation.stops.stopped)
            await send(
                chunk_object(
                    parsed.chat, request_id, created, self.name, None, reason, include_usage=parsed.include_usage
                )
            )
            if parsed.include_usage:
                await send(usage_chunk(parsed.chat, request_id, created, self.name, generation.usage(result.perf)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _context(self) -> int | None:
        return self._prompter.max_context if self._prompter is not None else self.max_context

    async def _segments_supported(self) -> bool:
        inputs = await self.ensemble_inputs()
        return inputs is None or "text_segments" in inputs
