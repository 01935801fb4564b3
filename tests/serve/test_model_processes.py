"""``specpipe serve`` stops a server whose Python model process died (a fresh tester's SIGKILL of the
engine's stub left its streams hanging while Triton kept reporting ready)."""

import os
import shutil
import signal
import subprocess
import threading
import time

import psutil
import pytest

from specpipe.errors import SpecpipeError
from specpipe.serve.model_processes import STUB, ModelProcessWatch, model_processes, supervise


class FakeServer:
    """A process tree shaped like tritonserver's: a parent with one stub child per model, named as the
    real stub is and running ``<repo>/<model>/1/model.py``."""

    def __init__(self, tmp_path, models):
        stub = tmp_path / STUB
        os.symlink(shutil.which("sh"), stub)
        children = " ".join(f"{stub} -c 'sleep 60; true' {tmp_path}/repo/{m}/1/model.py &" for m in models)
        self.process = subprocess.Popen(["sh", "-c", f"{children} wait"], start_new_session=True)
        self.stopped = False

    def stop(self, grace_s=20.0, drain_s=0.0):
        self.stopped, self.grace_s, self.drain_s = True, grace_s, drain_s
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def failure(self, what):
        return SpecpipeError(what)


def stubs_of(server, count):
    deadline = time.monotonic() + 10
    while len(found := model_processes(server.process.pid)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture
def server(tmp_path):
    server = FakeServer(tmp_path, ["preprocessing", "tensorrt_llm", "postprocessing"])
    yield server
    if server.process.poll() is None:
        server.stop()


def test_the_stubs_are_found_by_model(server):
    assert sorted(stubs_of(server, 3).values()) == ["postprocessing", "preprocessing", "tensorrt_llm"]
    assert model_processes(2**22 + 12345) == {}  # no such server


def test_a_killed_stub_is_reported_lost(server):
    stubs_of(server, 3)
    watch = ModelProcessWatch(server.process.pid)
    assert watch.lost() == []
    engine = next(pid for pid, model in watch.stubs.items() if model == "tensorrt_llm")
    os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not watch.lost() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch.lost() == [(engine, "tensorrt_llm")]


def test_supervise_stops_the_server_and_names_the_model_when_a_stub_dies(server):
    stubs = stubs_of(server, 3)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(SpecpipeError, supervise, server, 0.05)))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and not server.stopped  # everything running: it keeps serving
    engine = next(pid for pid, model in stubs.items() if model == "tensorrt_llm")
    os.kill(engine, signal.SIGKILL)
    thread.join(10)
    assert not thread.is_alive() and server.stopped and server.grace_s <= 2.0  # its requests can never finish
    assert server.drain_s is None  # nor can the dead model drain them
    message = str(errors[0].value)
    assert f"'tensorrt_llm' (pid {engine})" in message and "start it again" in message


def test_supervise_reports_a_server_that_exits_and_kills_the_stubs_it_left(server):
    stubs = stubs_of(server, 3)
    threading.Timer(0.2, lambda: os.kill(server.process.pid, signal.SIGKILL)).start()  # the server alone
    with pytest.raises(SpecpipeError, match="tritonserver exited unexpectedly with status -9"):
        supervise(server, 0.05)
    time.sleep(0.2)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in stubs)
