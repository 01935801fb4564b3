"""Ports on the loopback interface for the servers tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
