"""``specpipe serve`` (a subprocess, real Triton) under the signals a user or an orchestrator sends
(e2e). A fresh tester's finds: 30 SIGTERMs 30 ms apart, or SIGKILL while draining, left
``tritonserver`` and its stubs running, ports held, answering ready and refusing every request."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.serve.ports import port_is_free
from specpipe.serve.process_group import group_members, is_live
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e
NAME = "long"


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    engine = make_tiny_engine(root / "engines", NAME, max_position_embeddings=8192)
    package_engine(engine, root / "repo" / NAME)
    return root


class Serve:
    """``specpipe serve`` in a subprocess, with the gateway; ready when constructed."""

    def __init__(self, root, wait_ready: bool = True):
        self.ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port(), "openai": free_port()}
        self.log_path = root / f"serve-{self.ports['grpc']}.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specpipe.cli",
                "serve",
                NAME,
                "--repo-dir",
                str(root / "repo"),
                *[arg for name, port in self.ports.items() for arg in (f"--{name}-port", str(port))],
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if not wait_ready:
            deadline = time.monotonic() + 30
            while not (
                children := [p for p in psutil.Process(self.process.pid).children() if "tritonserver" in p.name()]
            ):
                assert time.monotonic() < deadline, self.output()
                time.sleep(0.1)
            self.triton = children[0]
            return
        deadline = time.monotonic() + 300
        while not self.health(timeout=2) == 200:
            assert self.process.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.5)
        self.triton = next(p for p in psutil.Process(self.process.pid).children() if "tritonserver" in p.name())

    def health(self, timeout=10) -> int | None:
        try:
            with urllib.request.urlopen(f"http://localhost:{self.ports['openai']}/health", timeout=timeout) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stream(self):
        """Start a long stream in a thread; returns (thread, started event, replies)."""
        started, replies = threading.Event(), []

        async def go():
            async with LLMClient(f"localhost:{self.ports['grpc']}", timeout_s=120) as client:
                request = GenerationRequest("1 2 3", max_tokens=8000, min_tokens=7900, stream=True)
                return await client.generate(request, on_text=lambda text: started.set())

        thread = threading.Thread(target=lambda: replies.append(run_sync(go())), daemon=True)
        thread.start()
        assert started.wait(60), "the stream never started"
        return thread, replies

    def assert_gone(self, within_s: float) -> None:
        """tritonserver, its stubs and every port are gone within ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while left := [p for p in [self.triton, *group_members(self.triton.pid)] if is_live(p)]:
            assert time.monotonic() < deadline, f"still running: {[(p.pid, p.name()) for p in left]}\n{self.output()}"
            time.sleep(0.2)
        for name, port in self.ports.items():
            assert port_is_free(port), f"the {name} port {port} is still held"


def test_a_burst_of_signals_still_stops_tritonserver(repo_root):
    serve = Serve(repo_root)
    try:
        thread, replies = serve.stream()
        serve.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while serve.health() != 503:  # the gateway tells load balancers at once
            assert time.monotonic() < deadline, "the gateway's /health did not turn 503 during the drain"
            time.sleep(0.05)
        for _ in range(30):
            serve.process.send_signal(signal.SIGTERM)
            time.sleep(0.03)
        code = serve.process.wait(60)
        thread.join(10)
        assert code == 0, serve.output()
        assert replies and replies[0].error and "server stopping" in replies[0].error, replies
        serve.assert_gone(within_s=5)
        assert "Aborted" not in serve.output() and "Traceback" not in serve.output(), serve.output()
    finally:
        serve.process.kill()


def test_a_killed_serve_takes_tritonserver_with_it(repo_root):
    serve = Serve(repo_root)
    try:
        serve.stream()  # the drain waits for it: Triton has not been signalled when serve dies
        serve.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        serve.process.kill()
        serve.process.wait(10)
        serve.assert_gone(within_s=30)  # Triton's own shutdown: up to its 10 s exit timeout
    finally:
        for process in [serve.triton, *group_members(serve.triton.pid)]:
            try:
                process.kill()
            except psutil.Error:
                pass


def test_a_stop_during_startup_is_quick_and_not_a_failure(repo_root):
    """Triton installs its signal handler only once ready: before, the SIGTERM kills it, which is what
    was asked (it used to exit 1 with "killed by SIGTERM", after a 13 s drain of nothing)."""
    serve = Serve(repo_root, wait_ready=False)
    try:
        time.sleep(1.0)
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(30) == 0, serve.output()
        assert "not ready yet" in serve.output() and "error" not in serve.output(), serve.output()
        serve.assert_gone(within_s=5)
    finally:
        serve.process.kill()


def test_a_closed_terminal_drains_like_ctrl_c(repo_root):
    serve = Serve(repo_root)
    try:
        serve.process.send_signal(signal.SIGHUP)
        assert serve.process.wait(30) == 0, serve.output()
        assert "running requests get" in serve.output(), serve.output()
        serve.assert_gone(within_s=5)
    finally:
        serve.process.kill()
