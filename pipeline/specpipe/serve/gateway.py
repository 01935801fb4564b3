"""The OpenAI-compatible gateway's host: beside ``specpipe serve``, or alone against a remote Triton.

The gateway (:mod:`specpipe.openai`) needs only Triton's gRPC endpoint: it asks the ensemble's
``preprocessing`` model for its ``tokenizer_dir`` and loads the tokenizer from that path, so running
it alone (``specpipe gateway``) needs the tokenizer at the same path as Triton sees it: inside the
serving containers ``/engines/NAME/tokenizer``, which is why the Kubernetes manifests run it as a
sidecar of the Triton container with the same volumes, and compose mounts the engines into it.

``specpipe serve --openai-port`` binds loopback by default (:data:`specpipe.openai.LOCAL_HOST`); in a
container the gateway binds every interface (``CONTAINER_HOST``) on ``CONTAINER_PORT``, and the key,
if any, comes from the environment or a mounted file (:func:`specpipe.openai.auth.resolve_api_key`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from specpipe.openai import LOCAL_HOST
from specpipe.openai.http_server import GatewayServer
from specpipe.openai.server import Gateway
from specpipe.progress import out, warn

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``::`` -> ``[::]``, RFC 3986 section 3.2.2)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True)
class GatewayRequest:
    """What ``specpipe gateway`` was asked to do.

    Attributes:
        triton_url: Triton's gRPC endpoint, ``HOST:PORT``.
        name: the deployment's name: the model id the API serves (``triton_repo/NAME``).
        port: the HTTP port. host: the address to bind (:data:`LOCAL_HOST` by default).
        api_key: the key clients must send as ``Authorization: Bearer KEY``; ``None``: no key.
        tokenizer_dir: the tokenizer; ``None`` reads the path the ``preprocessing`` model names.
    """

    triton_url: str
    name: str
    port: int
    host: str = LOCAL_HOST
    api_key: str | None = None
    tokenizer_dir: str | None = None


def start_gateway(request: GatewayRequest) -> GatewayServer:
    """Start the gateway of ``request`` in a background thread and say where it listens.

    Warns when it binds beyond loopback without a key (anyone who reaches the port can use it).

    Raises:
        SpecpipeError: the port cannot be bound on ``request.host``.
    """
    gateway = GatewayServer(
        Gateway(request.triton_url, request.name, tokenizer_dir=request.tokenizer_dir),
        request.port,
        host=request.host,
        api_key=request.api_key,
    )
    gateway.start()
    where = f"http://{url_host(request.host)}:{request.port}/v1" if request.host not in _LOOPBACK else gateway.url
    key = "API key required" if request.api_key else "no API key"
    out.print(
        f"OpenAI-compatible API for {request.name}: {where} ({key}; /health and /metrics open; Triton {request.triton_url})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if request.api_key is None and request.host not in _LOOPBACK:
        warn(
            f"the OpenAI API listens on {request.host} without an API key: anyone who reaches port {request.port} can use it "
            f"(set $SPECPIPE_API_KEY or pass --api-key-file)"
        )
    return gateway


def run_gateway(request: GatewayRequest) -> None:
    """``specpipe gateway``: serve until Ctrl-C or SIGTERM (a ``KeyboardInterrupt``), then stop:
    ``/health`` answers 503 from then on, running requests get up to 10 s to finish.

    Raises:
        SpecpipeError: see :func:`start_gateway`.
    """
    gateway = start_gateway(request)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        gateway.gateway.stopping = True
        gateway.stop()
