"""Watching a local Triton server's Python model processes.

Each Python-backend model instance runs in a stub process that ``tritonserver`` starts
(``triton_python_backend_stub <repo>/<model>/<version>/model.py ...``). When a stub dies (killed, out of
memory, a crash in native code) Triton keeps running and keeps answering ``/v2/health/ready`` and the
model's own ready endpoint with 200, but the model can never serve again: its running requests hang
(a decoupled model's streams are never closed) and every new one fails with "Stub process ... is not
healthy" (Triton 2.51, python backend r24.10). So ``specpipe serve`` watches the stubs it saw at ready
and, when one is gone, stops the server, whose clients then get ``UNAVAILABLE`` instead of hanging.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from specpipe.serve.process_group import is_live

STUB = "triton_python_backend_stub"
#: Seconds a server whose model process died gets to exit before SIGKILL. Its requests in flight can
#: never finish, and Triton would wait its whole exit timeout for them while the clients wait too.
DEAD_MODEL_GRACE_S = 2.0
#: How the stubs' shared-memory regions in ``/dev/shm`` are named (an argument of each stub).
SHM_PREFIX = "triton_python_backend_shm_region"


def _stubs(server_pid: int) -> list[tuple[psutil.Process, list[str]]]:
    """The Python-backend stubs under the process ``server_pid`` and their command lines (none when the
    server is gone)."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    stubs = []
    for child in children:
        try:
            args = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if args and Path(args[0]).name == STUB:
            stubs.append((child, args))
    return stubs


def _model_of(args: list[str]) -> str:
    """The model a stub serves: the folder of the ``model.py`` it runs (``?`` when it names none)."""
    script = next((Path(a) for a in args[1:] if a.endswith("model.py")), None)
    return script.parent.parent.name if script else "?"


def model_processes(server_pid: int) -> dict[int, str]:
    """The Python-backend stubs under the process ``server_pid``: pid -> model name. Empty when the
    server is gone."""
    return {process.pid: _model_of(args) for process, args in _stubs(server_pid)}


class ModelProcessWatch:
    """The stubs of a ready server, checked for exits. The processes are held as ``psutil.Process``
    objects, which know their start time: a pid the system reuses later is never taken for a stub.

    Args:
        server_pid: the ``tritonserver`` process.
    """

    def __init__(self, server_pid: int):
        stubs = _stubs(server_pid)
        self.processes = {process: _model_of(args) for process, args in stubs}
        self.shared_memory = [Path("/dev/shm") / a for _, args in stubs for a in args[1:] if a.startswith(SHM_PREFIX)]

    @property
    def stubs(self) -> dict[int, str]:
        """pid -> model name of the watched stubs."""
        return {process.pid: model for process, model in self.processes.items()}

    def lost(self) -> list[tuple[int, str]]:
        """``(pid, model)`` of each watched stub that has exited."""
        return [(process.pid, model) for process, model in self.processes.items() if not is_live(process)]

    def clean_up(self) -> None:
        """After the server exited: kill the stubs it left running (a SIGKILLed ``tritonserver`` cannot
        stop them, and init adopts them) and remove their shared-memory regions."""
        for process in self.processes:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        for region in self.shared_memory:
            region.unlink(missing_ok=True)


def supervise(server, poll_s: float = 0.5) -> None:
    """Block while ``server`` (a ready :class:`~specpipe.serve.local.LocalTritonServer`) and every Python
    model process it had at ready run.

    Raises:
        SpecpipeError: ``tritonserver`` exited (the model processes it left are killed and their shared
            memory removed); or a model process exited, after which the server is stopped (the message
            names the model and says to restart it).
    """
    watch = ModelProcessWatch(server.process.pid)
    while True:
        lost = watch.lost()
        if server.process.poll() is not None:
            watch.clean_up()
            raise server.failure(f"tritonserver exited unexpectedly with status {server.process.returncode}")
        if lost:
            server.stop(grace_s=DEAD_MODEL_GRACE_S, drain_s=None)  # a dead model cannot drain
            watch.clean_up()
            names = ", ".join(f"'{model}' (pid {pid})" for pid, model in lost)
            raise server.failure(
                f"the Python model process of {names} exited while tritonserver ran (killed, out of memory or "
                "crashed); Triton cannot serve that model again and would keep reporting ready, so the server "
                "was stopped: start it again"
            )
        time.sleep(poll_s)
