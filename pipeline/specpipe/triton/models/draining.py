"""Stopping a CPU deployment without leaving its clients hanging: the drain signal between
``specpipe serve`` and the ``tensorrt_llm`` CPU model.

Once ``tritonserver`` has its SIGTERM it stops its models (Triton core's ``InferenceServer::Stop``)
and the running streams get no more responses (measured with the pytriton 0.7.0 server, 2.51: the
engine thread blocks in its next send); it waits its exit timeout for them and exits with them
unfinished, and the clients see their streams cut only then.
So the server is drained before it is signalled. ``serve`` writes a deadline (seconds since the
epoch, as text) into the file named by the environment variable :data:`DRAIN_FILE_ENV`; from then on
the model refuses new requests (``UNAVAILABLE``, message starting with :data:`SERVER_STOPPING`), lets
the running ones go on until the deadline, ends those still running then with the same error, and,
once it has no request left, creates the file's ``.idle`` sibling. ``serve`` waits for that file,
then stops Triton, which now has nothing in flight.

A file rather than a signal: the Python backend's stub runs Python signal handlers only when its main
thread next runs Python code, which it does only when Triton hands it a request.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import psutil

#: Environment variable naming the drain file (set by ``specpipe serve`` for ``tritonserver``, whose
#: Python model processes inherit it).
DRAIN_FILE_ENV = "SPECPIPE_DRAIN_FILE"
#: Environment variable holding the pid of the process that started ``tritonserver`` (``serve``).
SERVE_PID_ENV = "SPECPIPE_SERVE_PID"
#: How often the model looks whether that process is still ``tritonserver``'s parent, seconds.
ORPHAN_CHECK_S = 0.5
#: How the error of a request refused or ended by a draining server begins (the gateway answers 503).
SERVER_STOPPING = "server stopping"
#: The errors (``UNAVAILABLE``) of a request refused, or ended unfinished, because the server is stopping.
REFUSED_WHILE_STOPPING = (
    f"{SERVER_STOPPING}: it takes no new requests; send the request to another replica, or again once this one is back"
)
ENDED_BY_STOP = f"{SERVER_STOPPING}: the request was ended before it finished; send it again once the server is back"


def idle_path(drain_file: Path) -> Path:
    """The file the model creates once a drain has left it without requests."""
    return drain_file.with_name(drain_file.name + ".idle")


def clear_drain(drain_file: Path) -> None:
    """Remove a drain request and its answer (before a server starts)."""
    for path in (drain_file, idle_path(drain_file)):
        path.unlink(missing_ok=True)


def request_drain(drain_file: Path, within_s: float) -> None:
    """Ask the model to finish within ``within_s`` seconds from now; written atomically, so the model
    never reads half a deadline. A second request replaces the first (a shorter one ends requests sooner).
    Each call writes its own temporary file, so a call from a signal handler that interrupts another
    (a second Ctrl-C during a drain) cannot take that call's file away."""
    drain_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor, partial = tempfile.mkstemp(prefix=drain_file.name + ".", suffix=".partial", dir=drain_file.parent)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(f"{time.time() + max(0.0, within_s):.3f}\n")
        os.replace(partial, drain_file)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def wait_idle(drain_file: Path, timeout_s: float, alive=lambda: True, poll_s: float = 0.05) -> bool:
    """Wait until the model reports that it has no request left.

    Args:
        timeout_s: at most this long, seconds.
        alive: returns false once the server has exited (no point in waiting then).

    Returns:
        whether the model reported idle in time.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if idle_path(drain_file).exists():
            return True
        time.sleep(poll_s)
    return idle_path(drain_file).exists()


class DrainSignal:
    """The model's side: whether ``serve`` asked it to drain, and by when.

    ``serve`` may also die without asking (SIGKILL, out of memory). ``tritonserver`` runs in a session
    of its own and would outlive it: ready, holding its ports, refusing nothing and stopped by no one.
    So when the process that started ``tritonserver`` is no longer its parent, the model drains at once
    and, with no request left, signals ``tritonserver`` itself (SIGTERM): the stop ``serve`` would have
    made. (Signalling Triton straight from the kernel when ``serve`` dies, ``PR_SET_PDEATHSIG``, was
    tried: Triton stops its models first, so running streams stall, and its gRPC server then waits for
    them forever.)

    Args:
        drain_file: the file ``serve`` writes; ``None`` when the server was not started by ``serve``
            (then :meth:`deadline` is always ``None``).
        serve_pid: the pid of the process that started ``tritonserver``; ``None``: not watched.
        server_pid: ``tritonserver``'s pid (the model process's parent).
    """

    def __init__(self, drain_file: Path | None, serve_pid: int | None = None, server_pid: int | None = None):
        self.drain_file, self.serve_pid, self.server_pid = drain_file, serve_pid, server_pid
        self.orphaned = self._server_signalled = False
        self._next_check = 0.0

    @classmethod
    def from_environment(cls) -> "DrainSignal":
        """The signal named by :data:`DRAIN_FILE_ENV` (none when unset), watching :data:`SERVE_PID_ENV`."""
        name, serve_pid = os.environ.get(DRAIN_FILE_ENV, ""), os.environ.get(SERVE_PID_ENV, "")
        return cls(Path(name) if name else None, int(serve_pid) if serve_pid.isdigit() else None, os.getppid())

    def deadline(self) -> float | None:
        """The time (seconds since the epoch) by which every request must have ended, or ``None`` when
        no drain was asked. A file that cannot be parsed, or a server whose ``serve`` is gone, means at once."""
        if self._serve_gone():
            return 0.0
        if self.drain_file is None:
            return None
        try:
            text = self.drain_file.read_text()
        except OSError:
            return None
        try:
            return float(text.strip())
        except ValueError:
            return 0.0

    def report_idle(self) -> None:
        """Tell ``serve`` that no request is left (again if the answer was removed; a failure to write is
        ignored, the server is stopped at its deadline anyway)."""
        if self.orphaned and not self._server_signalled:
            self._server_signalled = True
            try:
                os.kill(self.server_pid, signal.SIGTERM)
            except OSError:
                pass
        if self.drain_file is None or idle_path(self.drain_file).exists():
            return
        try:
            idle_path(self.drain_file).touch()
        except OSError:
            pass

    def _serve_gone(self) -> bool:
        """Whether ``tritonserver``'s parent is no longer :attr:`serve_pid` (looked at every
        :data:`ORPHAN_CHECK_S` seconds; a reparented process keeps its new parent)."""
        if self.serve_pid is None or self.server_pid is None or self.orphaned:
            return self.orphaned
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + ORPHAN_CHECK_S
            try:
                self.orphaned = psutil.Process(self.server_pid).ppid() != self.serve_pid
            except psutil.Error:
                self.orphaned = False
        return self.orphaned
