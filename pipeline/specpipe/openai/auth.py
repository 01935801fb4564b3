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
Kubernetes Secret or a compose file sets: the key stays out of process lists and manifests) or
``--api-key-file`` (a mounted secret file): :func:`resolve_api_key`.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from specpipe.errors import SpecpipeError

#: Paths answered without the key (probes and Prometheus).
PUBLIC_PATHS = frozenset({"/health", "/metrics"})
#: The environment variable the gateway reads its key from.
API_KEY_ENV = "SPECPIPE_API_KEY"

MISSING_KEY = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
               "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
WRONG_KEY = "Incorrect API key provided. Use the key this gateway was started with (--api-key, $SPECPIPE_API_KEY or --api-key-file)."


class APIKeyError(SpecpipeError):
    """An API key given twice, empty, or in a file that cannot be read."""


def resolve_api_key(key: str | None = None, key_file: Path | None = None) -> str | None:
    """The gateway's key from ``--api-key`` (or its environment variable) or ``--api-key-file``.

    The file's content is the key, surrounding whitespace (a trailing newline) removed. An empty
    ``key`` counts as none (an environment variable set to nothing), as vLLM treats its
    ``VLLM_API_KEY``. Returns ``None``: no key, the gateway is open.

    Raises:
        APIKeyError: both given, an unreadable or empty file, or a key with whitespace or
            non-ASCII characters (it could never be sent in an HTTP header as it is).
    """
    key = key or None
    if key is not None and key_file is not None:
        raise APIKeyError(f"--api-key (or ${API_KEY_ENV}) and --api-key-file both give a key: pass one of them")
    if key_file is not None:
        try:
            key = Path(key_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise APIKeyError(f"cannot read the API key file {key_file} ({exc}): give a readable text file holding the key") from exc
        if not key:
            raise APIKeyError(f"the API key file {key_file} is empty: write the key into it")
    if key is not None and (not key.isascii() or any(c.isspace() for c in key)):
        raise APIKeyError("the API key has whitespace or non-ASCII characters, which an Authorization header cannot carry: "
                          "use printable ASCII, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return key


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
