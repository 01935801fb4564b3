"""A ``tritonserver`` process on this machine (:class:`LocalTritonServer`): start, readiness, cold-start
times, draining and stopping. Where Triton comes from and how it is started (the ``nvidia-pytriton``
wheel, the backends directory, the environment and the command line) is :mod:`specpipe.serve.triton_install`.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.paths import cache_dir
from specpipe.progress import LIBRARY_BARS_OFF
from specpipe.serve.cold_start import ColdStart, model_load_times
from specpipe.serve.ports import check_ports
from specpipe.serve.process_group import wait_group_gone
from specpipe.serve.triton_install import (
    WHEEL,
    TritonInstall,
    find_triton,
    prepare_backends_dir,
    server_command,
    server_environment,
)
from specpipe.serve.triton_log import log_tail, model_load_failures
from specpipe.triton.models.draining import DRAIN_FILE_ENV, SERVE_PID_ENV, clear_drain, request_drain, wait_idle

#: Seconds a drained CPU model gets past its deadline to end its requests and report (one batch step
#: and the error responses).
DRAIN_MARGIN_S = 3.0
#: Seconds the Python-backend stubs get to exit after ``tritonserver`` has (then SIGKILL).
STUB_EXIT_S = 5.0


class LocalTritonServer:
    """A ``tritonserver`` process serving one model repository on this machine.

    Use as a context manager (``with LocalTritonServer(...) as server:`` starts it, waits until it
    is ready and stops it on exit) or call :meth:`start`, :meth:`wait_ready` and :meth:`stop`.

    Args:
        repo_dir: the model repository (``triton_repo/NAME``).
        grpc_port, http_port, metrics_port: TCP ports to serve on.
        log_path: file for Triton's own output (default ``<cache>/logs/triton-<repo name>-<grpc port>.log``);
            a restart moves the previous run's to :attr:`previous_log_path` (``<log>.1``).
        ready_timeout_s: seconds the context manager waits for readiness.
    """

    def __init__(
        self,
        repo_dir: Path,
        grpc_port: int = 8001,
        http_port: int = 8000,
        metrics_port: int = 8002,
        log_path: Path | None = None,
        ready_timeout_s: float = 300.0,
    ):
        self.repo_dir = Path(repo_dir).absolute()
        self.grpc_port, self.http_port, self.metrics_port = int(grpc_port), int(http_port), int(metrics_port)
        self.log_path = (
            Path(log_path) if log_path else cache_dir() / "logs" / f"triton-{self.repo_dir.name}-{self.grpc_port}.log"
        )
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None
        self._install: TritonInstall | None = None
        self._started_at: float | None = None
        self.ready_after_s: float | None = None
        self._hurried = False

    # -- endpoints --------------------------------------------------------------------------------
    @property
    def grpc_url(self) -> str:
        """gRPC endpoint ``localhost:PORT`` (tritonclient.grpc form)."""
        return f"localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """HTTP endpoint ``http://localhost:PORT``."""
        return f"http://localhost:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics ``http://localhost:PORT/metrics``."""
        return f"http://localhost:{self.metrics_port}/metrics"

    # -- launch -----------------------------------------------------------------------------------
    def _ports(self) -> dict[str, int]:
        return {"gRPC": self.grpc_port, "HTTP": self.http_port, "metrics": self.metrics_port}

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The command line and the environment variables specpipe sets (``LD_LIBRARY_PATH``, ``PATH``).

        Raises:
            SpecpipeError: Triton cannot be found (see :func:`find_triton`).
        """
        install = self._install or find_triton()
        self._install = install
        backends = prepare_backends_dir(install)
        cmd = server_command(install, backends, self.repo_dir, self.grpc_port, self.http_port, self.metrics_port)
        env = server_environment(
            install, {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
        )
        return cmd, {k: env[k] for k in ("LD_LIBRARY_PATH", "PATH")}

    def start(self) -> None:
        """Start ``tritonserver`` in the background (returns at once; see :meth:`wait_ready`).

        Raises:
            SpecpipeError: no repository at ``repo_dir``, a port is busy or repeated, Triton cannot
                be found, or the process cannot be started.
        """
        if self.process is not None and self.process.poll() is None:
            raise SpecpipeError(f"this server is already running (pid {self.process.pid}): stop it first")
        if not self.repo_dir.is_dir():
            raise SpecpipeError(f"no Triton model repository at {self.repo_dir}: run 'specpipe package' first")
        check_ports(self._ports())
        cmd, env_vars = self.command()
        env = {
            **os.environ,
            **env_vars,
            DRAIN_FILE_ENV: str(self.drain_path),
            SERVE_PID_ENV: str(os.getpid()),
            LIBRARY_BARS_OFF: "1",
        }  # the log is a file: no tqdm redraws in it
        clear_drain(self.drain_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.is_file() and self.log_path.stat().st_size:  # a restart keeps the last run's log
            os.replace(self.log_path, self.previous_log_path)
        with open(self.log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
                )
                self._started_at, self.ready_after_s, self._hurried = time.monotonic(), None, False
            except OSError as exc:
                raise SpecpipeError(f"cannot start {cmd[0]} ({exc}): reinstall '{WHEEL}'") from exc

    @property
    def previous_log_path(self) -> Path:
        """Where :meth:`start` keeps the previous run's log (one generation)."""
        return self.log_path.with_name(self.log_path.name + ".1")

    def failure(self, what: str) -> SpecpipeError:
        tail = log_tail(self.log_path)
        return SpecpipeError(f"{what}; Triton's log ({self.log_path}) ends with:\n{tail}")

    def is_ready(self) -> bool:
        """Whether ``GET /v2/health/ready`` answers 200 and the metrics port accepts connections (Triton
        starts its metrics service some milliseconds after the health endpoint turns ready)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as reply:
                if reply.status != 200:
                    return False
            with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 0.5) -> None:
        """Poll ``/v2/health/ready`` until it answers 200.

        Raises:
            SpecpipeError: the server was not started, exited, reported a model that failed to load,
                or was not ready within ``timeout_s`` seconds; the message ends with the tail of
                Triton's log.
        """
        if self.process is None:
            raise SpecpipeError("the server was not started: call start() first")
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise self.failure(f"tritonserver exited with status {code} before it was ready")
            if self.is_ready():
                if self.ready_after_s is None and self._started_at is not None:
                    self.ready_after_s = time.monotonic() - self._started_at
                return
            failures = model_load_failures(log_tail(self.log_path, 400))
            if failures:
                self.stop()
                raise self.failure(f"a model of {self.repo_dir} failed to load: {failures[0].strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise self.failure(f"tritonserver was not ready after {timeout_s:g} s")
            time.sleep(poll_s)

    def cold_start(self) -> ColdStart | None:
        """Time to ready (measured by :meth:`wait_ready`) and each model's load time (from the log);
        ``None`` before the server was seen ready."""
        if self.ready_after_s is None:
            return None
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        return ColdStart(round(self.ready_after_s, 3), model_load_times(text))

    @property
    def drain_path(self) -> Path:
        """The file through which :meth:`drain` asks the CPU model to finish (:mod:`specpipe.triton.models.draining`)."""
        return self.log_path.with_suffix(".stopping")

    def drain(self, within_s: float) -> bool:
        """Let the running requests finish before the server stops: the CPU model refuses new requests
        at once (``UNAVAILABLE``, "server stopping"), ends those still running after ``within_s``
        seconds with that error, and reports when none is left. A ``KeyboardInterrupt`` while waiting
        (a second Ctrl-C) ends them at once.

        Returns:
            whether the model reported no request left (false for a server that is not running, or a
            repository whose model does not take part).
        """
        process = self.process
        if process is None or process.poll() is not None:
            return False
        alive = lambda: process.poll() is None  # noqa: E731
        request_drain(self.drain_path, 0.0 if self._hurried else within_s)
        if self._hurried:  # hurry() may have run between the two lines above
            request_drain(self.drain_path, 0.0)
        try:
            return wait_idle(self.drain_path, within_s + DRAIN_MARGIN_S, alive)
        except KeyboardInterrupt:
            request_drain(self.drain_path, 0.0)
            return wait_idle(self.drain_path, DRAIN_MARGIN_S, alive)

    def hurry(self) -> None:
        """End the running requests now: a drain under way, or the next one, gets no more time (a
        repeated Ctrl-C, :class:`~specpipe.serve.stop_signals.StopSignals`)."""
        self._hurried = True
        if self.drain_path.exists():  # a drain is under way (the file goes when the server stops)
            request_drain(self.drain_path, 0.0)

    def stop(self, grace_s: float = 20.0, drain_s: float | None = 0.0) -> int | None:
        """Stop the server: :meth:`drain` it (``drain_s`` seconds for the running requests; with 0 they
        end at once with a "server stopping" error rather than hang: Triton sends no response once it
        has its signal; ``None``: no drain, for a model that cannot answer), SIGTERM, then SIGKILL to
        its process group after ``grace_s`` seconds.

        Returns:
            the exit status (negative: killed by that signal), or ``None`` if it was not running.
        """
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            if drain_s is not None:
                self.drain(drain_s)
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the server and its Python-backend stubs
                except ProcessLookupError:
                    pass
                process.wait(10)
        # A restart on the same ports must find them free. Stubs whose server died of a signal (one
        # stopped while loading: Triton installs its handler once ready) crash or hang: no wait then.
        wait_group_gone(process.pid, STUB_EXIT_S if process.returncode >= 0 else 0.0)
        clear_drain(self.drain_path)
        return process.returncode

    def __enter__(self) -> "LocalTritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def shell_lines(self) -> list[str]:
        """The launch as shell lines: ``export`` of the environment, then the command."""
        cmd, env = self.command()
        return [f"export {k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(cmd)]
