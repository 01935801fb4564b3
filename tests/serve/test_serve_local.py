"""The local Triton launcher: locating Triton, environment, ports, and the real server on a tiny engine."""

from __future__ import annotations

import queue
import socket
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.errors import SpecpipeError
from specpipe.serve import resolve_runtime, serve_repository
from specpipe.serve.local import LocalTritonServer
from specpipe.serve.ports import check_ports
from specpipe.serve.triton_install import (
    find_triton,
    prepare_backends_dir,
    server_command,
    server_environment,
)
from specpipe.serve.triton_log import model_load_failures
from specpipe.triton.repository import package_engine


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    engine = make_tiny_engine(root / "engines", "tiny", method="ngram")
    return package_engine(engine, root / "triton_repo" / "tiny")


@pytest.fixture
def listening_socket():
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_triton_is_found_in_the_wheel():
    install = find_triton()
    assert install.binary.name == "tritonserver" and install.binary.is_file()
    assert install.stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (install.python_backend_dir / "libtriton_python.so").is_file()
    assert install.libs_dir.name == "nvidia_pytriton.libs" and install.version == "0.7.0"


def test_backends_dir_holds_backend_and_stub(tmp_path):
    install = find_triton()
    first = prepare_backends_dir(install, tmp_path)
    assert sorted(p.name for p in (first / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert prepare_backends_dir(install, tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_environment_and_command(tmp_path):
    install = find_triton()
    env = server_environment(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"})
    ld = env["LD_LIBRARY_PATH"].split(":")
    assert ld[0] == str(install.libs_dir) and ld[1] == sysconfig.get_config_var("LIBDIR") and ld[-1] == "/opt/lib"
    assert env["PATH"].split(":") == [str(Path(sys.executable).parent), "/usr/bin"]
    cmd = server_command(install, tmp_path / "b", tmp_path / "r", 1, 2, 3)
    assert cmd[0] == str(install.binary)
    assert cmd[1:] == [
        f"--model-repository={tmp_path / 'r'}",
        f"--backend-directory={tmp_path / 'b'}",
        "--grpc-port=1",
        "--http-port=2",
        "--metrics-port=3",
        "--exit-timeout-secs=5",
    ]


def test_busy_port_is_refused_before_starting(repo, listening_socket):
    server = LocalTritonServer(repo, grpc_port=listening_socket, http_port=free_port(), metrics_port=free_port())
    with pytest.raises(SpecpipeError, match=f"gRPC port {listening_socket} is already in use"):
        server.start()
    assert server.process is None
    with pytest.raises(SpecpipeError, match="HTTP and metrics ports are both 9000"):
        check_ports({"gRPC": 9001, "HTTP": 9000, "metrics": 9000})


def test_missing_repository(tmp_path):
    with pytest.raises(SpecpipeError, match="no Triton model repository"):
        LocalTritonServer(tmp_path / "nope", free_port(), free_port(), free_port()).start()
    with pytest.raises(SpecpipeError, match="run 'specpipe package nope' first$"):
        serve_repository(tmp_path / "nope")
    for name in ("tiny-none", "tiny-eagle"):
        (tmp_path / name / "ensemble").mkdir(parents=True)
    with pytest.raises(
        SpecpipeError, match=f"run 'specpipe package nope' first \\(packaged in {tmp_path}: tiny-eagle, tiny-none\\)"
    ):
        serve_repository(tmp_path / "nope")


def test_runtime_is_read_from_the_repository(repo):
    assert resolve_runtime(repo, "auto") == "cpu"
    with pytest.raises(SpecpipeError, match="not written for a TensorRT-LLM runtime \\(no specpipe.json\\)"):
        serve_repository(repo, runtime="trtllm", print_only=True)


def test_print_only_shows_environment_and_command(repo, capsys):
    serve_repository(repo, grpc_port=18501, http_port=18500, metrics_port=18502, print_only=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("export LD_LIBRARY_PATH=") and lines[1].startswith("export PATH=")
    assert "tritonserver --model-repository=" in lines[2] and f"={repo}" in lines[2]
    assert "--grpc-port=18501 --http-port=18500 --metrics-port=18502" in lines[2]


def test_a_restart_keeps_the_previous_log(repo, tmp_path, monkeypatch):
    log = tmp_path / "triton.log"
    log.write_text("the previous run\n")
    server = LocalTritonServer(repo, free_port(), free_port(), free_port(), log_path=log)
    monkeypatch.setattr(server, "command", lambda: ([sys.executable, "-c", "print('this run')"], {}))
    server.start()
    server.process.wait(timeout=60)
    assert log.read_text() == "this run\n" and server.previous_log_path.read_text() == "the previous run\n"


def test_load_failure_lines_are_recognised():
    log = "I1 ok\nE1129 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm' version 1: Internal: boom\"\n"
    assert model_load_failures(log) == [log.splitlines()[1]]


# --- the real server -------------------------------------------------------------------------------


def _input(name, array, dtype):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def _generate(url, prompt, max_tokens, stream, exclude=True, perf=True):
    """(text chunks, last perf outputs, error message) of one request over the gRPC stream."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = [
        _input("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        _input("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        _input("stream", np.array([[stream]]), "BOOL"),
        _input("exclude_input_in_output", np.array([[exclude]]), "BOOL"),
        _input("return_perf_metrics", np.array([[perf]]), "BOOL"),
    ]
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        chunks, perf_out = [], {}
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return chunks, perf_out, str(error)
            text = result.as_numpy("text_output")
            if text is not None:
                chunks.append(text.reshape(-1)[0].decode())
            for name in (
                "acceptance_rate",
                "total_draft_tokens",
                "total_accepted_draft_tokens",
                "num_input_tokens",
                "num_output_tokens",
            ):
                value = result.as_numpy(name)
                if value is not None:
                    perf_out[name] = value.reshape(-1)[0].item()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return chunks, perf_out, None
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "triton.log"
    with LocalTritonServer(repo, free_port(), free_port(), free_port(), log_path=log, ready_timeout_s=240) as running:
        yield running


@pytest.mark.e2e
def test_real_server_plain_and_streamed(server):
    assert server.is_ready()
    prompt = "Café 日本 🙂 Paris"
    plain, perf, error = _generate(server.grpc_url, prompt, 24, stream=False)
    assert error is None and len(plain) == 1
    assert perf["num_input_tokens"] > 0 and 0 < perf["num_output_tokens"] <= 24
    assert 0.0 <= perf["acceptance_rate"] <= 1.0
    assert perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]
    streamed, streamed_perf, error = _generate(server.grpc_url, prompt, 24, stream=True)
    assert error is None
    assert 1 < len(streamed) <= streamed_perf["num_output_tokens"]  # one chunk per engine step
    assert "".join(streamed) == plain[0]
    # greedy: the same tokens; the draft counters follow the load-adaptive rule, whose choices read
    # timings (the cost curve is refined from served forwards), so only their consistency is fixed
    assert {k: streamed_perf[k] for k in ("num_input_tokens", "num_output_tokens")} == {
        k: perf[k] for k in ("num_input_tokens", "num_output_tokens")
    }
    assert streamed_perf["total_accepted_draft_tokens"] <= streamed_perf["total_draft_tokens"]
    echoed, _, error = _generate(server.grpc_url, prompt, 24, stream=False, exclude=False, perf=False)
    assert error is None and echoed[0] == prompt + plain[0]


@pytest.mark.e2e
def test_real_server_rejects_bad_requests_and_keeps_serving(server):
    _, _, error = _generate(server.grpc_url, "hello", 0, stream=False)
    assert "max_tokens must be >= 1, got 0" in error
    _, _, error = _generate(server.grpc_url, "", 4, stream=True)
    assert "text_input is empty" in error
    _, _, error = _generate(server.grpc_url, "word " * 80, 4, stream=False)
    assert "context limit is 64 tokens" in error
    chunks, perf, error = _generate(server.grpc_url, "hello", 4, stream=False, perf=False)
    assert error is None and len(chunks) == 1 and perf == {}


@pytest.mark.e2e
def test_real_server_reports_a_model_that_fails_to_load(repo, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(repo, broken)
    config = broken / "tensorrt_llm" / "config.pbtxt"
    config.write_text(config.read_text().replace(str(repo.parent.parent / "engines" / "tiny"), str(tmp_path / "gone")))
    server = LocalTritonServer(broken, free_port(), free_port(), free_port(), log_path=tmp_path / "log.txt")
    server.start()
    try:
        with pytest.raises(SpecpipeError, match="(?s)failed to load.*tensorrt_llm.*does not exist"):
            server.wait_ready(timeout_s=240)
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_ready_waits_for_the_metrics_port_too(tmp_path):
    """Triton's health endpoint turns ready some milliseconds before its metrics service listens: a
    client that scrapes metrics right after ``wait_ready`` must find them."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    health = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    metrics = socket.socket()
    metrics.bind(("127.0.0.1", 0))
    try:
        server = LocalTritonServer(tmp_path, free_port(), health.server_address[1], metrics.getsockname()[1])
        assert not server.is_ready()  # the metrics port is bound but not listening yet
        metrics.listen()
        assert server.is_ready()
    finally:
        metrics.close()
        health.shutdown()
        health.server_close()
