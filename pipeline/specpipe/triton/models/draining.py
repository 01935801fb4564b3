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
import time
from pathlib import Path

#: Environment variable naming the drain file (set by ``specpipe serve`` for ``tritonserver``, whose
#: Python model processes inherit it).
DRAIN_FILE_ENV = "SPECPIPE_DRAIN_FILE"
#: How the error of a request refused or ended by a draining server begins (the gateway answers 503).
SERVER_STOPPING = "server stopping"


def idle_path(drain_file: Path) -> Path:
    """The file the model creates once a drain has left it without requests."""
    return drain_file.with_name(drain_file.name + ".idle")


def clear_drain(drain_file: Path) -> None:
    """Remove a drain request and its answer (before a server starts)."""
    for path in (drain_file, idle_path(drain_file)):
        path.unlink(missing_ok=True)


def request_drain(drain_file: Path, within_s: float) -> None:
    """Ask the model to finish within ``within_s`` seconds from now; written atomically, so the model
    never reads half a deadline. A second request replaces the first (a shorter one ends requests sooner)."""
    drain_file.parent.mkdir(parents=True, exist_ok=True)
    partial = drain_file.with_name(drain_file.name + ".partial")
    partial.write_text(f"{time.time() + max(0.0, within_s):.3f}\n")
    os.replace(partial, drain_file)


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

    Args:
        drain_file: the file ``serve`` writes; ``None`` when the server was not started by ``serve``
            (then :meth:`deadline` is always ``None``).
    """

    def __init__(self, drain_file: Path | None):
        self.drain_file = drain_file
        self._reported = False

    @classmethod
    def from_environment(cls) -> "DrainSignal":
        """The signal named by :data:`DRAIN_FILE_ENV` (none when unset)."""
        name = os.environ.get(DRAIN_FILE_ENV, "")
        return cls(Path(name) if name else None)

    def deadline(self) -> float | None:
        """The time (seconds since the epoch) by which every request must have ended, or ``None`` when
        no drain was asked. A file that cannot be parsed means at once."""
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
        """Tell ``serve`` that no request is left (once per drain; a failure to write is ignored, the
        server is stopped at its deadline anyway)."""
        if self._reported or self.drain_file is None:
            return
        try:
            idle_path(self.drain_file).touch()
            self._reported = True
        except OSError:
            pass
