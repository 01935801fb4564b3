"""The gateway's API key: OpenAI's ``Authorization: Bearer KEY``, checked before any route runs.

With a key configured, every request must carry ``Authorization: Bearer KEY`` except those to
:data:`PUBLIC_PATHS`: ``/health`` (load balancers' and Kubernetes' probes) and ``/metrics``
(Prometheus scrapes), which stay open as in vLLM, whose ``--api-key`` middleware guards every route
but its health, metrics and documentation endpoints (vLLM
``vllm/entrypoints/serve/middleware/authenticate.py`` @ baaf6e9, facts only). Unknown paths are
guarded too (a request without the key learns nothing about the routes). A refused request gets
HTTP 401 with OpenAI's error object, as OpenAI's API answers: ``type`` ``invalid_request_error``,
``code`` ``invalid_api_key`` for a wrong key and ``null`` for a missing one, and the
``WWW-Authenticate: Bearer`` header of RFC 6750 section 3. Keys are compared in constant time
(:func:`hmac.compare_digest` over their SHA-256 digests, so the key's length does not leak either).

The key reaches the gateway by ``--api-key``, the ``SPECPIPE_API_KEY`` environment variable (what a
compose file passes through: the key stays out of process lists and files) or ``--api-key-file`` (a
mounted Kubernetes Secret: the key stays out of the environment too): :func:`resolve_api_key`, which
strips and checks every source the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from specpipe.errors import SpecpipeError

#: Paths answered without the key (probes and Prometheus).
PUBLIC_PATHS = frozenset({"/health", "/metrics"})
#: The environment variable the gateway reads its key from.
API_KEY_ENV = "SPECPIPE_API_KEY"

MISSING_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
WRONG_KEY = "Incorrect API key provided. Use the key this gateway was started with (--api-key, $SPECPIPE_API_KEY or --api-key-file)."


class APIKeyError(SpecpipeError):
    """An API key given twice, empty, or in a file that cannot be read."""


def _clean(value: str, source: str) -> str:
    """``value`` without surrounding whitespace (a secret file's or ``print``'s trailing newline).

    Raises:
        APIKeyError: nothing left (an explicitly given key must not silently open the gateway), or
            whitespace or non-ASCII characters inside the key (an HTTP header cannot carry them).
    """
    key = value.strip()
    if not key:
        raise APIKeyError(
            f"{source} gives an empty API key, which would leave the gateway open: put the key there, "
            f"or give no key at all for an open gateway"
        )
    if not key.isascii() or any(c.isspace() for c in key):
        raise APIKeyError(
            f"the API key of {source} has whitespace or non-ASCII characters inside it, which an Authorization "
            f"header cannot carry: use printable ASCII, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key


def resolve_api_key(
    key: str | None = None, key_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The gateway's key from ``--api-key``, the :data:`API_KEY_ENV` variable of ``environ``
    (default :data:`os.environ`) or ``--api-key-file``, one rule for all three.

    ``--api-key`` wins over the variable. Every source has its surrounding whitespace removed (the
    trailing newline of a file, of a Kubernetes Secret made from one, of ``$(...)``). A source that
    is given but empty (``--api-key ''``, the variable set to nothing, an empty file) is refused: an
    empty Secret value must not start an open gateway. Returns ``None`` when no source is given: no
    key, the gateway is open.

    Raises:
        APIKeyError: a file together with the flag or the variable, an unreadable file, an empty
            key, or whitespace or non-ASCII characters inside the key.
    """
    environ = os.environ if environ is None else environ
    given: list[tuple[str, str]] = []
    if key is not None:
        given.append(("--api-key", key))
    elif API_KEY_ENV in environ:
        given.append((f"${API_KEY_ENV}", environ[API_KEY_ENV]))
    if key_file is not None:
        if given:
            raise APIKeyError(f"{given[0][0]} and --api-key-file both give a key: pass one of them")
        try:
            given.append((f"the API key file {key_file}", Path(key_file).read_text()))
        except (OSError, UnicodeDecodeError) as exc:
            raise APIKeyError(
                f"cannot read the API key file {key_file} ({exc}): give a readable text file holding the key"
            ) from exc
    return _clean(given[0][1], given[0][0]) if given else None


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (scheme case-insensitive), else ``None``."""
    scheme, _, token = (header or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def refusal(header: str | None, key: str) -> tuple[str, str | None] | None:
    """``None`` when ``header`` carries ``key``; otherwise the 401's (message, OpenAI ``code``)."""
    token = bearer_token(header)
    if token is None:
        return MISSING_KEY, None
    if not hmac.compare_digest(_digest(token), _digest(key)):
        return WRONG_KEY, "invalid_api_key"
    return None


def api_key_middleware(key: str):
    """aiohttp middleware refusing requests without ``Authorization: Bearer key`` (see the module doc)."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        refused = refusal(request.headers.get("Authorization"), key)
        if refused is None:
            return await handler(request)
        message, code = refused
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
        return web.json_response(body, status=401, headers={"WWW-Authenticate": 'Bearer realm="specpipe"'})

    return middleware
