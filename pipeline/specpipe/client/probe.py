"""Which protocol a port speaks, for error messages that name the wrong port a user gave.

A Triton server opens three ports (gRPC, HTTP, metrics) and ``specpipe serve`` may add an OpenAI
gateway; pointing a gRPC client at an HTTP port fails with "Socket closed", and an HTTP client at the
gRPC port with a parser error full of HTTP/2 frame bytes. Neither says what was wrong. The probe sends
one HTTP/1.0 request and reads the first bytes of the answer: an HTTP/1 server answers with a status
line (``HTTP/1.x``, RFC 9112 section 4); an HTTP/2 server, which every gRPC server is, answers with a
frame (a 9-byte header whose fourth byte is the frame type, RFC 9113 section 4.1: SETTINGS 0x4 or
GOAWAY 0x7 to a client that did not open with HTTP/2's preface).
"""

from __future__ import annotations

import socket

#: Frame types an HTTP/2 server sends first to a peer that spoke HTTP/1 (RFC 9113 sections 6.5, 6.8).
_HTTP2_FIRST_FRAMES = (0x4, 0x7)


def port_protocol(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """``"http/1"`` or ``"http/2"`` as ``host:port`` answers an HTTP/1.0 request (module doc), or ``None``
    when nothing answers within ``timeout_s`` seconds or the answer is neither. Never raises."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            head = conn.recv(16)
    except OSError:
        return None
    if head.startswith(b"HTTP/1."):
        return "http/1"
    if len(head) >= 9 and head[3] in _HTTP2_FIRST_FRAMES:
        return "http/2"
    return None


def split_host_port(address: str) -> tuple[str, int] | None:
    """``("host", port)`` of ``HOST:PORT`` or ``[IPv6]:PORT``, or of a URL's authority; ``None`` otherwise."""
    authority = address.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def not_grpc_hint(address: str) -> str:
    """For a gRPC client that could not talk to ``address``: a sentence saying that the port speaks plain
    HTTP, so it is another port of the server, and which port to give; ``""`` when the probe finds no
    HTTP/1 server there."""
    target = split_host_port(address)
    if target is None or port_protocol(*target) != "http/1":
        return ""
    return (
        f"{address} answers plain HTTP, not gRPC (it is Triton's HTTP or metrics port, or an OpenAI gateway): "
        f"give the deployment's gRPC port (specpipe serve prints it; Triton's default is 8001)"
    )


def not_http_hint(address: str) -> str:
    """For an HTTP client that could not talk to ``address``: a sentence saying that the port speaks HTTP/2
    as gRPC servers do, and what to give instead; ``""`` when the probe finds no HTTP/2 server there."""
    target = split_host_port(address)
    if target is None or port_protocol(*target) != "http/2":
        return ""
    host, port = target
    return (
        f"{host}:{port} answers HTTP/2 as gRPC servers do (Triton's gRPC port), not an OpenAI-compatible HTTP "
        f"API: give it without openai:// to talk to Triton, or give the gateway's port "
        f"(specpipe serve --openai-port)"
    )
