"""Draining the CPU model before the server stops (:mod:`specpipe.triton.models.draining`): the drain
file's protocol, the worker refusing new requests and ending running ones at the deadline with a
"server stopping" error, the gateway's status for it, and how ``serve`` reports Triton's exit."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from batch_helpers import make_engine, prompts, run_alone, scheduler_for
from recording_sender import RecordingSender
from triton_fakes import FAKE_PB, FINAL, FakeSender, wait_for

from specpipe.errors import SpecpipeError
from specpipe.generation.api import SamplingParams
from specpipe.openai.protocol import api_error_for
from specpipe.serve import _report_unclean_exit
from specpipe.triton.models.draining import (
    ENDED_BY_STOP,
    REFUSED_WHILE_STOPPING,
    DrainSignal,
    clear_drain,
    idle_path,
    request_drain,
    wait_idle,
)
from specpipe.triton.models.engine_request import EngineRequest
from specpipe.triton.models.request_worker import ERROR_AFTER_DATA_S, RequestWorker, TritonSender


def test_the_drain_file_carries_a_deadline_and_the_idle_answer(tmp_path):
    drain_file = tmp_path / "run" / "triton.stopping"
    signal = DrainSignal(drain_file)
    assert signal.deadline() is None and DrainSignal(None).deadline() is None
    before = time.time()
    request_drain(drain_file, 5.0)
    assert before + 4.99 <= signal.deadline() <= time.time() + 5.01  # written to the millisecond
    assert not wait_idle(drain_file, 0.1)
    signal.report_idle()
    assert idle_path(drain_file).exists() and wait_idle(drain_file, 0.1)
    drain_file.write_text("garbled")
    assert signal.deadline() == 0.0  # unreadable: at once
    clear_drain(drain_file)
    assert not drain_file.exists() and not idle_path(drain_file).exists()
    assert not wait_idle(drain_file, 5.0, alive=lambda: False)  # a dead server is not waited for


def test_a_drain_requested_from_a_signal_handler_during_another_leaves_the_shorter_deadline(tmp_path, monkeypatch):
    """A second Ctrl-C arrives while ``serve`` is writing its first drain request: the handler's request
    (at once) must not take the interrupted request's temporary file away (CI: FileNotFoundError)."""
    drain_file = tmp_path / "triton.stopping"
    real_replace, interrupted = os.replace, []

    def replace_after_a_signal(source, target):
        if not interrupted:
            interrupted.append(source)
            request_drain(drain_file, 0.0)  # what the handler's hurry() does
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_after_a_signal)
    request_drain(drain_file, 60.0)
    assert interrupted and DrainSignal(drain_file).deadline() > time.time() + 50  # the outer call wrote last
    assert sorted(path.name for path in tmp_path.iterdir()) == ["triton.stopping"]  # no temporary file left


@pytest.fixture
def engine(single_thread):
    return make_engine("none")


def test_a_drain_lets_a_short_request_finish_and_reports_idle(engine, tmp_path):
    drain_file = tmp_path / "triton.stopping"
    worker = RequestWorker(load=lambda: scheduler_for(engine, max_batch_size=2), drain=DrainSignal(drain_file))
    prompt, params = prompts(1, seed=5)[0], SamplingParams(max_tokens=12)
    finished = RecordingSender()
    worker.submit(EngineRequest(prompt, params, streaming=True, exclude_input_in_output=True), finished)
    wait_for(lambda: finished.responses)  # running: a request still queued when the drain begins is refused
    request_drain(drain_file, 60.0)
    assert wait_idle(drain_file, 30.0)
    assert finished.finished.is_set() and not finished.errors
    assert finished.tokens() == run_alone(engine, prompt, params)
    worker.close()


def test_past_the_deadline_running_requests_end_with_an_error_and_new_ones_are_refused(engine, tmp_path):
    drain_file = tmp_path / "triton.stopping"
    worker = RequestWorker(load=lambda: scheduler_for(engine, max_batch_size=2), drain=DrainSignal(drain_file))
    long_prompt, params = prompts(1, seed=6)[0], SamplingParams(max_tokens=10_000)
    running = [RecordingSender(), RecordingSender()]
    for sender in running:
        worker.submit(EngineRequest(long_prompt, params, streaming=True, exclude_input_in_output=True), sender)
    wait_for(lambda: all(sender.responses for sender in running))
    request_drain(drain_file, 0.0)
    assert wait_idle(drain_file, 30.0)
    for sender in running:
        assert sender.errors == [(ENDED_BY_STOP, "UNAVAILABLE")] and len(sender.responses) < 10_000
        assert not any(final for _, final in sender.responses)
    refused = RecordingSender()
    worker.submit(EngineRequest(long_prompt, SamplingParams(max_tokens=4)), refused)
    assert refused.finished.wait(5) and refused.errors == [(REFUSED_WHILE_STOPPING, "UNAVAILABLE")]
    worker.close()


@pytest.mark.parametrize(
    "message, status",
    [
        ("in ensemble 'ensemble', " + REFUSED_WHILE_STOPPING, 503),
        ("in ensemble 'ensemble', " + ENDED_BY_STOP, 503),
        ("in ensemble 'ensemble', the CPU engine failed on this request: RuntimeError: boom", 500),
        ("in ensemble 'ensemble', server busy: 8 requests running and 32 waiting", 503),
        ("in ensemble 'ensemble', top_p must be in (0, 1]", 400),
    ],
)
def test_the_gateway_status_of_engine_errors(message, status):
    error = api_error_for(message)
    assert error.status == status and error.message.endswith(message.split(", ", 1)[1])
    assert error.kind == ("invalid_request_error" if status == 400 else "server_error")


class _StoppedServer:
    def __init__(self, log_path):
        self.log_path = log_path

    def failure(self, what):
        return SpecpipeError(f"{what}; log: {self.log_path}")


def test_serve_reports_a_crash_at_exit_and_only_warns_of_triton_exit_timeout(tmp_path, capsys):
    log = tmp_path / "triton.log"
    log.write_text(
        'E1202 main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."\n'
    )
    _report_unclean_exit(_StoppedServer(log), 1)
    assert "waited its exit timeout" in capsys.readouterr().err
    with pytest.raises(SpecpipeError, match="killed by SIGSEGV while stopping"):
        _report_unclean_exit(_StoppedServer(log), -11)
    log.write_text("Signal (15) received.\n")
    with pytest.raises(SpecpipeError, match="exited with status 1 while stopping"):
        _report_unclean_exit(_StoppedServer(log), 1)


def test_an_error_after_streamed_data_waits_for_the_ensembles_last_step(monkeypatch):
    """Triton 2.51 never releases an ensemble request whose engine error arrives while a postprocessing
    step of its last chunk still runs: the error waits ERROR_AFTER_DATA_S after the last data."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FAKE_PB)
    quiet, streamed = FakeSender(), FakeSender()
    started = time.monotonic()
    TritonSender(quiet).error("refused", "UNAVAILABLE")
    assert time.monotonic() - started < ERROR_AFTER_DATA_S / 2
    sender = TritonSender(streamed)
    sender.data({"output_ids": np.array([[1]], np.int32)}, final=False)
    sent = time.monotonic()
    sender.error(ENDED_BY_STOP, "UNAVAILABLE")
    assert time.monotonic() - sent >= ERROR_AFTER_DATA_S * 0.99
    assert [flags for _, flags in streamed.sent] == [0, FINAL] and streamed.sent[-1][0].error.code == "UNAVAILABLE"


def test_a_server_whose_serve_died_drains_at_once_and_is_signalled_when_idle(tmp_path):
    """``tritonserver`` outlives a SIGKILLed ``serve`` (its own session): the model notices that its
    server's parent changed, ends its requests and signals the server."""
    server = subprocess.Popen(["sleep", "60"])  # its parent is this process
    try:
        watched = DrainSignal(None, serve_pid=os.getpid(), server_pid=server.pid)
        assert watched.deadline() is None and not watched.orphaned
        orphan = DrainSignal(tmp_path / "drain", serve_pid=os.getppid(), server_pid=server.pid)
        assert orphan.deadline() == 0.0 and orphan.orphaned
        orphan.report_idle()
        assert server.wait(10) == -signal.SIGTERM
        assert idle_path(tmp_path / "drain").exists()
    finally:
        server.kill()
