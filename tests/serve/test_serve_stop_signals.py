"""How ``specpipe serve`` stops, without a server: repeated signals hurry the stop instead of escaping
it, a hurried drain gets no time, the stubs' process group is waited for, a busy port names its holder,
and the gateway's ``/health`` answers 503 while the server stops (a fresh tester's finds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from loopback import free_port
from openai_fake import FakeLLM, tokenizer_dir

from specpipe.errors import SpecpipeError
from specpipe.openai.http_server import GatewayServer
from specpipe.openai.server import Gateway
from specpipe.serve.local import LocalTritonServer
from specpipe.serve.ports import check_ports, port_holder
from specpipe.serve.process_group import group_members, wait_group_gone
from specpipe.serve.stop_signals import StopSignals
from specpipe.triton.models.draining import DrainSignal, idle_path


def test_the_first_signal_raises_and_later_ones_only_hurry():
    hurried = []
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals(hurry=lambda: hurried.append(time.monotonic())) as signals:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        for signum in [signal.SIGTERM, signal.SIGINT] * 15:
            os.kill(os.getpid(), signum)
            time.sleep(0.01)
        assert signals.repeats == len(hurried) >= 1
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_hold_stops_the_first_signal_from_raising():
    hurried = []
    with StopSignals(hurry=lambda: hurried.append(1)) as signals:
        signals.hold()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    assert hurried == [1]


@pytest.fixture
def fake_server(tmp_path):
    """A LocalTritonServer whose 'tritonserver' is a sleeping process."""
    server = LocalTritonServer(
        tmp_path / "repo", free_port(), free_port(), free_port(), log_path=tmp_path / "triton.log"
    )
    server.process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield server
    server.process.kill()
    server.process.wait()


def _report_idle_when_drained(server):
    def watch():
        while DrainSignal(server.drain_path).deadline() is None:
            time.sleep(0.01)
        idle_path(server.drain_path).touch()

    threading.Thread(target=watch, daemon=True).start()


def test_a_hurried_server_drains_with_no_time_left(fake_server):
    fake_server.hurry()
    _report_idle_when_drained(fake_server)
    assert fake_server.drain(30.0)
    assert DrainSignal(fake_server.drain_path).deadline() <= time.time()


def test_hurry_during_a_drain_moves_its_deadline_to_now(fake_server):
    deadlines = []

    def hurry_later():
        while DrainSignal(fake_server.drain_path).deadline() is None:
            time.sleep(0.01)
        deadlines.append(DrainSignal(fake_server.drain_path).deadline())
        fake_server.hurry()
        deadlines.append(DrainSignal(fake_server.drain_path).deadline())
        idle_path(fake_server.drain_path).touch()

    threading.Thread(target=hurry_later, daemon=True).start()
    assert fake_server.drain(30.0)
    assert deadlines[0] > time.time() + 20 and deadlines[1] <= time.time()


def test_stop_waits_for_the_process_group_and_kills_what_stays():
    leader = subprocess.Popen(["sh", "-c", "sleep 0.5 & sleep 60 & exit 0"], start_new_session=True)
    leader.wait()
    assert len(group_members(leader.pid)) == 2
    started = time.monotonic()
    assert not wait_group_gone(leader.pid, timeout_s=1.0)
    assert time.monotonic() - started >= 1.0
    deadline = time.monotonic() + 5
    while group_members(leader.pid):
        assert time.monotonic() < deadline, "SIGKILL left a group member alive"
        time.sleep(0.05)
    quick = subprocess.Popen(["sh", "-c", "sleep 0.3 & exit 0"], start_new_session=True)
    quick.wait()
    assert wait_group_gone(quick.pid, timeout_s=5.0)


def test_a_busy_port_names_the_process_listening_on_it():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_holder(port) == f"'{_own_name()}' (pid {os.getpid()})"
        with pytest.raises(SpecpipeError, match=rf"gRPC port {port} is already in use by '.+' \(pid {os.getpid()}\)"):
            check_ports({"gRPC": port})
    assert port_holder(port) is None


def _own_name() -> str:
    import psutil

    return psutil.Process().name()


def test_the_gateway_health_answers_503_while_the_server_stops(tmp_path):
    gateway = Gateway("unused:0", "fake", tokenizer_dir=str(tokenizer_dir(tmp_path)), client=FakeLLM())
    with GatewayServer(gateway, free_port(), host="127.0.0.1") as running:
        url = running.url.removesuffix("/v1") + "/health"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200 and json.loads(reply.read()) == {"ready": True}
        gateway.stopping = True
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 503 and json.loads(refused.value.read()) == {"ready": False, "stopping": True}
