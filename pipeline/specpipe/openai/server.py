"""The gateway's aiohttp application and a runner that serves it from a background thread.

Each OpenAI request becomes one streamed gRPC request to the ensemble; the ensemble's text chunks
are relayed as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``) or joined into one
JSON response. Ensemble errors become OpenAI error objects: HTTP 503 when the Triton server cannot
be reached, 400 otherwise (the CPU runtime reports request problems such as a prompt over the
context limit this way). Any ``model`` string is accepted, since the gateway serves one deployment;
responses and ``/v1/models`` name it by the deployment's name.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from specpipe.client.llm import GenerationResult
from specpipe.errors import SpecpipeError
from specpipe.openai.metrics import GatewayMetrics
from specpipe.openai.protocol import (
    APIError,
    ParsedRequest,
    chat_object,
    chunk_object,
    completion_object,
    finish_reason,
    models_object,
    new_id,
    parse_request,
    usage,
    usage_chunk,
)

_UNREACHABLE = ("UNAVAILABLE", "failed to connect", "Connection refused", "Socket closed")


class Gateway:
    """The translation between the OpenAI API and one deployment's ensemble.

    Args:
        grpc_url: Triton gRPC endpoint ``HOST:PORT``.
        name: the deployment's name (the served model id).
        tokenizer_dir: tokenizer for the chat template; ``None`` reads the ``tokenizer_dir``
            parameter of the deployment's ``preprocessing`` model on first use.
        model: the ensemble's Triton model name.
    """

    def __init__(self, grpc_url: str, name: str, tokenizer_dir: str | None = None, model: str = "ensemble"):
        self.grpc_url, self.name, self.model = grpc_url, name, model
        self.tokenizer_dir = tokenizer_dir
        self.metrics = GatewayMetrics()
        self.client = None
        self._template = None
        self._inputs: set[str] | None = None

    async def start(self, app=None) -> None:
        from specpipe.client.llm import LLMClient

        self.client = LLMClient(self.grpc_url, self.model)
        await self.client.__aenter__()

    async def stop(self, app=None) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def chat_template(self):
        """The deployment's :class:`~specpipe.openai.chat_template.ChatTemplate` (loaded once)."""
        if self._template is None:
            from specpipe.client.chat import tokenizer_dir_from_config
            from specpipe.openai.chat_template import ChatTemplate

            source = self.tokenizer_dir
            if source is None:
                try:
                    source = tokenizer_dir_from_config(await self.client.model_config("preprocessing"))
                except SpecpipeError as exc:
                    raise APIError(500, f"cannot find the deployment's tokenizer for the chat template: {exc}", kind="server_error") from exc
            if not source:
                raise APIError(500, "the deployment's preprocessing model names no tokenizer_dir: use /v1/completions", kind="server_error")
            try:
                self._template = await asyncio.to_thread(ChatTemplate, source)
            except SpecpipeError as exc:
                raise APIError(500, str(exc), kind="server_error") from exc
        return self._template

    async def ensemble_request(self, parsed: ParsedRequest, prompt: str):
        """The ensemble request for ``parsed``, asking for the perf outputs and token counts only when
        the ensemble declares those inputs (older TensorRT-LLM ensembles do not)."""
        import dataclasses

        if self._inputs is None:
            try:
                metadata = await self.client.raw.get_model_metadata(self.model, as_json=True, client_timeout=10)
                self._inputs = {t["name"] for t in metadata.get("inputs", [])}
            except Exception:  # unreachable now: ask for everything; the request itself will report the error
                return parsed.generation_request(prompt)
        return dataclasses.replace(
            parsed.generation_request(prompt),
            return_perf_metrics=True if "return_perf_metrics" in self._inputs else None,
            return_num_tokens=True if "return_num_output_tokens" in self._inputs else None,
        )

    async def prompt_of(self, parsed: ParsedRequest) -> str:
        if not parsed.chat:
            return parsed.prompt
        template = await self.chat_template()
        return template.format(parsed.messages)

    # -- handlers ---------------------------------------------------------------------------------
    async def models(self, request):
        from aiohttp import web

        return web.json_response(models_object([self.name]))

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat_completions(self, request):
        return await self._handle(request, chat=True)

    async def prometheus(self, request):
        from aiohttp import web

        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def health(self, request):
        from aiohttp import web

        try:
            ready = await self.client.raw.is_server_ready(client_timeout=5)
        except Exception:
            ready = False
        return web.json_response({"ready": bool(ready)}, status=200 if ready else 503)

    async def _handle(self, request, chat: bool):
        from aiohttp import web

        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise APIError(400, f"the request body is not valid JSON ({exc})") from exc
            parsed = parse_request(body, chat)
            prompt = await self.prompt_of(parsed)
        except APIError as exc:
            return web.json_response(exc.body(), status=exc.status)
        if parsed.stream:
            return await self._stream(request, parsed, prompt)
        return await self._whole(parsed, prompt)

    async def _whole(self, parsed: ParsedRequest, prompt: str):
        from aiohttp import web

        try:
            result = await self.client.generate(await self.ensemble_request(parsed, prompt))
        except SpecpipeError as exc:  # the ensemble's config could not be read: server down
            result = GenerationResult(error=f"UNAVAILABLE: {exc}")
        if result.error is not None:
            self.metrics.record(self.name, {}, error=True)
            error = _api_error(result.error)
            return web.json_response(error.body(), status=error.status)
        self.metrics.record(self.name, result.perf)
        build = chat_object if parsed.chat else completion_object
        return web.json_response(build(new_id(parsed.chat), int(time.time()), self.name, result.text,
                                       finish_reason(result.perf, parsed.max_tokens), usage(result.perf)))

    async def _stream(self, request, parsed: ParsedRequest, prompt: str):
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        request_id, created = new_id(parsed.chat), int(time.time())
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(self.client.generate(await self.ensemble_request(parsed, prompt), on_text=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))

        async def send(obj: Any) -> None:
            await response.write(f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode())

        try:
            first = True
            while (text := await queue.get()) is not None:
                await send(chunk_object(parsed.chat, request_id, created, self.name, text, None, first=first,
                                        include_usage=parsed.include_usage))
                first = False
            try:
                result = task.result()
            except SpecpipeError as exc:
                result = GenerationResult(error=f"UNAVAILABLE: {exc}")
            if result.error is not None:
                self.metrics.record(self.name, {}, error=True)
                await send(_api_error(result.error).body())
            else:
                self.metrics.record(self.name, result.perf)
                if first and parsed.chat:  # no text at all: still open the assistant's turn
                    await send(chunk_object(True, request_id, created, self.name, "", None, first=True, include_usage=parsed.include_usage))
                await send(chunk_object(parsed.chat, request_id, created, self.name, None,
                                        finish_reason(result.perf, parsed.max_tokens), include_usage=parsed.include_usage))
                if parsed.include_usage:
                    await send(usage_chunk(parsed.chat, request_id, created, self.name, usage(result.perf)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            task.cancel()  # the client went away: stop generating
            raise
        return response


def _api_error(message: str) -> APIError:
    if any(marker in message for marker in _UNREACHABLE):
        return APIError(503, f"the Triton server is unreachable: {message}", kind="server_error")
    return APIError(400, message)


def make_app(gateway: Gateway):
    """The aiohttp application of ``gateway`` (routes in the module doc of :mod:`specpipe.openai`)."""
    from aiohttp import web

    app = web.Application(client_max_size=16 * 2**20)
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_get("/v1/models", gateway.models)
    app.router.add_post("/v1/completions", gateway.completions)
    app.router.add_post("/v1/chat/completions", gateway.chat_completions)
    app.router.add_get("/metrics", gateway.prometheus)
    app.router.add_get("/health", gateway.health)
    return app


class GatewayServer:
    """Serves a :class:`Gateway` on ``host:port`` from a background thread (its own event loop).

    ``start()`` returns once the port is listening; ``stop()`` closes it. Also a context manager.

    Raises (``start``):
        SpecpipeError: the port cannot be bound.
    """

    def __init__(self, gateway: Gateway, port: int, host: str = "0.0.0.0"):
        self.gateway, self.port, self.host = gateway, int(port), host
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API root, ``http://localhost:PORT/v1``."""
        return f"http://localhost:{self.port}/v1"

    def start(self) -> None:
        from aiohttp import web

        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._runner = web.AppRunner(make_app(self.gateway), access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(serve())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name=f"openai-gateway-{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise SpecpipeError(f"cannot serve the OpenAI API on port {self.port} ({failure[0]}): choose another --openai-port") from failure[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> "GatewayServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
