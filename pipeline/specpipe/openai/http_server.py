"""The HTTP side of the gateway: the aiohttp application of a :class:`~specpipe.openai.server.Gateway`
(its routes, OpenAI-style JSON errors for every HTTP error, the optional API key) and
:class:`GatewayServer`, which serves it from a background thread with its own event loop."""

from __future__ import annotations

import asyncio
import threading

from specpipe.errors import SpecpipeError
from specpipe.openai import LOCAL_HOST
from specpipe.openai.auth import api_key_middleware
from specpipe.openai.protocol import APIError
from specpipe.openai.server import Gateway


def _json_errors():
    """Middleware: every HTTP error (unknown route 404, wrong method 405, body too large 413 ...) and
    any unexpected failure answers an OpenAI-style JSON error object."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            message = f"{exc.reason}: {request.method} {request.path}"
            if exc.status == 404:
                message = f"no route {request.method} {request.path}: see /openapi.json"
            elif exc.status == 405:
                message = f"method {request.method} is not allowed on {request.path}"
            return web.json_response(
                APIError(exc.status, message, kind=kind).body(),
                status=exc.status,
                headers={k: v for k, v in exc.headers.items() if k == "Allow"},
            )
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must still answer JSON, not a dropped connection
            error = APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")
            return web.json_response(error.body(), status=500)

    return middleware


def make_app(gateway: Gateway, api_key: str | None = None):
    """The aiohttp application of ``gateway`` (routes in the module doc of :mod:`specpipe.openai`);
    with ``api_key``, requests need ``Authorization: Bearer api_key`` (:mod:`specpipe.openai.auth`)."""
    from aiohttp import web

    guard = [api_key_middleware(api_key)] if api_key else []
    app = web.Application(client_max_size=16 * 2**20, middlewares=[*guard, _json_errors()])
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_get("/v1/models", gateway.models)
    app.router.add_get("/v1/models/{model:.+}", gateway.retrieve_model)
    app.router.add_post("/v1/completions", gateway.completions)
    app.router.add_post("/v1/chat/completions", gateway.chat_completions)
    app.router.add_get("/openapi.json", gateway.openapi)
    app.router.add_get("/metrics", gateway.prometheus)
    app.router.add_get("/health", gateway.health)
    return app


class GatewayServer:
    """Serves a :class:`Gateway` on ``host:port`` (``host`` loopback by default, ``0.0.0.0``: every
    interface) from a background thread (its own event loop); ``api_key``: see :func:`make_app`.
    ``start()`` returns once the port is listening (or raises SpecpipeError: the port cannot be
    bound); ``stop()`` closes it. Also a context manager."""

    def __init__(self, gateway: Gateway, port: int, host: str = LOCAL_HOST, api_key: str | None = None):
        self.gateway, self.port, self.host, self.api_key = gateway, int(port), host, api_key
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
            # handler_cancellation: a handler whose client disconnected is cancelled (its Triton request too)
            self._runner = web.AppRunner(
                make_app(self.gateway, self.api_key), access_log=None, handler_cancellation=True
            )
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
            raise SpecpipeError(
                f"cannot serve the OpenAI API on {self.host}:{self.port} ({failure[0]}): choose another port or host"
            ) from failure[0]

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
