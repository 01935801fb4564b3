"""Memory of a deployment served on this machine: its own process tree, not the host's.

Triton's ``nv_cpu_memory_used_bytes`` is the memory in use on the whole machine (every server and
benchmark on the host counts), so for a server listening on a local port the benchmark instead finds
the process that listens on it (``tritonserver``) and sums its process tree: the server and its
Python-backend stub processes (one per Python model instance, where the CPU engine lives).

Each process counts its PSS (proportional set size: its private pages plus its share of pages it
shares, from ``/proc/PID/smaps_rollup`` through psutil), so libraries mapped by several processes
of the tree are counted once in total; where PSS cannot be read, its RSS. Bytes.
"""

from __future__ import annotations

import ipaddress
import socket

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 possibly in brackets) is this machine's loopback."""
    host = host.strip("[]")
    if host in LOCAL_NAMES or host == socket.gethostname():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine, or ``None`` (not found, no permission, or
    psutil missing)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except Exception:  # psutil missing, AccessDenied on another user's sockets: no figure
        return None
    return None


def tree_memory(pid: int) -> int | None:
    """Bytes of the process ``pid`` and all its descendants (PSS each, else RSS); ``None`` when it is gone."""
    try:
        import psutil

        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except Exception:  # gone, or psutil missing
        return None
    total = 0
    for process in processes:
        try:
            try:
                total += int(process.memory_full_info().pss)
            except (AttributeError, psutil.AccessDenied):
                total += int(process.memory_info().rss)
        except psutil.Error:  # exited while being read
            continue
    return total


def local_server_pid(address: str) -> int | None:
    """For a ``HOST:PORT`` address on this machine, the pid listening on PORT; else ``None``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not is_local_host(host):
        return None
    return listening_pid(int(port))
