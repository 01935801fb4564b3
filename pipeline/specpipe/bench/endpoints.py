"""Deployments named on the ``specpipe bench`` command line: ``--url NAME=ADDRESS``.

ADDRESS forms:

- ``HOST:PORT``: the gRPC endpoint of a Triton server with a TensorRT-LLM-style ``ensemble``
  (TensorRT-LLM or specpipe's CPU runtime). Its Prometheus metrics are looked for at
  ``http://HOST:PORT+1/metrics`` (Triton's defaults put metrics one port above gRPC: 8001 -> 8002,
  and ``specpipe demo`` does the same); ``--metrics NAME=URL`` overrides it.
- ``openai://HOST:PORT/PATH`` (``openai+https://...`` for TLS): an OpenAI-compatible server (vLLM,
  trtllm-serve, SGLang, ``specpipe serve --openai-port``) whose API root is ``http://HOST:PORT/PATH``
  (usually ``/v1``). ``?model=ID`` picks the model; otherwise the server must list exactly one in
  ``/v1/models``. ``?chat=1`` sends ``/chat/completions`` (the server applies the chat template)
  instead of ``/completions``. Metrics: ``http://HOST:PORT/metrics``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from specpipe.build_common import ENGINE_NAME as _NAME
from specpipe.errors import SpecpipeError

_HOSTPORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Endpoint:
    """One deployment under test.

    Attributes:
        name: the label in tables and files (``baseline`` is the reference for speed-ups).
        kind: ``"triton"`` or ``"openai"``.
        address: ``HOST:PORT`` (Triton gRPC) or the API root URL (OpenAI, e.g. ``http://h:8000/v1``).
        model: Triton: the ensemble's name; OpenAI: the model id, ``None`` to ask ``/v1/models``.
        metrics_url: Prometheus endpoint scraped for memory and counters (``None``: none).
        chat: OpenAI: use ``/chat/completions`` instead of ``/completions``.
    """

    name: str
    kind: str
    address: str
    model: str | None
    metrics_url: str | None
    chat: bool = False


def parse_endpoint(spec: str, triton_model: str = "ensemble") -> Endpoint:
    """Parse one ``NAME=ADDRESS`` (see the module doc).

    Raises:
        SpecpipeError: no ``=``, a bad name, or an address of neither form.
    """
    name, sep, address = spec.partition("=")
    name, address = name.strip(), address.strip()
    if not sep or not name or not address:
        raise SpecpipeError(
            f"--url {spec!r} must be NAME=HOST:PORT or NAME=openai://HOST:PORT/v1, e.g. baseline=localhost:8001"
        )
    if not _NAME.match(name):
        raise SpecpipeError(f"deployment name {name!r} in --url must be letters, digits, '.', '_' or '-'")
    if address.startswith(("openai://", "openai+http://", "openai+https://")):
        return _openai(name, address)
    if "://" in address:
        raise SpecpipeError(
            f"--url {spec!r}: use HOST:PORT for Triton gRPC or openai://HOST:PORT/v1 for an OpenAI-compatible server"
        )
    match = _HOSTPORT.match(address)
    if not match or not 0 < int(match["port"]) < 65535:
        raise SpecpipeError(f"--url {spec!r}: {address!r} is not HOST:PORT (Triton's gRPC port, e.g. localhost:8001)")
    metrics = f"http://{match['host']}:{int(match['port']) + 1}/metrics"
    return Endpoint(name, "triton", address, triton_model, metrics)


def _openai(name: str, address: str) -> Endpoint:
    scheme = "https" if address.startswith("openai+https://") else "http"
    parts = urlsplit("//" + address.split("://", 1)[1])
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise SpecpipeError(f"--url {name}={address}: give the host and port, e.g. openai://localhost:8000/v1")
    query = parse_qs(parts.query)
    model = query.get("model", [None])[0]
    chat = query.get("chat", ["0"])[0].lower() in ("1", "true", "yes")
    root = f"{scheme}://{parts.netloc}{parts.path.rstrip('/') or '/v1'}"
    return Endpoint(name, "openai", root, model, f"{scheme}://{parts.netloc}/metrics", chat)


def parse_endpoints(specs: list[str], metrics: list[str] = (), triton_model: str = "ensemble") -> list[Endpoint]:
    """Parse every ``--url`` and apply ``--metrics NAME=URL`` overrides (``NAME=none`` disables).

    Raises:
        SpecpipeError: no ``--url``, a repeated name, or a ``--metrics`` for an unknown name.
    """
    if not specs:
        raise SpecpipeError("no deployment to benchmark: give --url NAME=HOST:PORT (repeat it for each deployment)")
    endpoints = [parse_endpoint(s, triton_model) for s in specs]
    names = [e.name for e in endpoints]
    for n in names:
        if names.count(n) > 1:
            raise SpecpipeError(f"deployment name {n!r} is given twice in --url: give each deployment its own name")
    overrides = {}
    for spec in metrics:
        name, sep, url = spec.partition("=")
        if not sep or name not in names:
            raise SpecpipeError(f"--metrics {spec!r} must be NAME=URL for a NAME given with --url ({', '.join(names)})")
        overrides[name] = None if url.strip().lower() == "none" else url.strip()
    return [
        Endpoint(e.name, e.kind, e.address, e.model, overrides.get(e.name, e.metrics_url), e.chat)
        if e.name in overrides
        else e
        for e in endpoints
    ]
