"""The TCP ports a local server binds: checked before it starts, so a busy or repeated port fails with
a message naming it instead of a server that dies while loading."""

from __future__ import annotations

import socket

import psutil

from specpipe.errors import SpecpipeError


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a TCP listener could bind ``host:port`` now (``SO_REUSEADDR``, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str | None:
    """Who listens on TCP ``port`` (``"'tritonserver' (pid 123)"``), or ``None`` where that cannot be
    seen (no listener, or another user's process without the right to list its sockets)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return f"'{psutil.Process(conn.pid).name()}' (pid {conn.pid})"
            except psutil.Error:
                return f"pid {conn.pid}"
    return None


def check_ports(ports: dict[str, int]) -> None:
    """Raise :class:`SpecpipeError` if two ports are equal or one is already in use.

    Args:
        ports: label (``"gRPC"``, ``"HTTP"``, ``"metrics"``) -> port.
    """
    seen: dict[int, str] = {}
    for label, port in ports.items():
        if not 0 < port < 65536:
            raise SpecpipeError(f"the {label} port {port} is not a TCP port: choose one in 1..65535")
        if port in seen:
            raise SpecpipeError(f"the {seen[port]} and {label} ports are both {port}: give each its own port")
        seen[port] = label
    for label, port in ports.items():
        if not port_is_free(port):
            holder = port_holder(port)
            who = f"by {holder}" if holder else "(another server?)"
            raise SpecpipeError(
                f"the {label} port {port} is already in use {who}: stop that process or choose "
                f"another port with --{label.lower()}-port"
            )
