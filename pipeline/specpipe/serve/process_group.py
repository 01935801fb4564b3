"""The processes of a local ``tritonserver``: its process group (the server and its Python-backend
stubs, started in a session of their own), waited for after the server exits."""

from __future__ import annotations

import os
import signal
import time

import psutil


def is_live(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes (:func:`is_live`) of process group ``pgid``."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and is_live(process):
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def wait_group_gone(pgid: int, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Wait until process group ``pgid`` has no live process (``tritonserver``'s stubs outlive it by
    up to a second); after ``timeout_s`` seconds SIGKILL what is left.

    Returns:
        whether the group ended by itself.
    """
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return False
        time.sleep(poll_s)
    return True
