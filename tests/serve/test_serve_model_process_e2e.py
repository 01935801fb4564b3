"""A real Triton CPU server whose engine process is killed mid-stream: ``specpipe serve``'s supervision
stops the server, and the client's stream ends with an error instead of hanging (a fresh tester's find:
Triton kept reporting ready and the stream stayed open for minutes)."""

import os
import signal
import threading
import time

import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.errors import SpecpipeError
from specpipe.serve.local import LocalTritonServer
from specpipe.serve.model_processes import model_processes, supervise
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e


def test_a_killed_engine_process_stops_the_server_and_ends_its_streams(tmp_path):
    engine = make_tiny_engine(tmp_path / "engines", "tiny", max_position_embeddings=8192)
    repo = package_engine(engine, tmp_path / "repo" / "tiny")
    server = LocalTritonServer(repo, free_port(), free_port(), free_port(), log_path=tmp_path / "triton.log")
    server.start()
    try:
        server.wait_ready(300)
        stubs = model_processes(server.process.pid)
        assert {"preprocessing", "tensorrt_llm", "postprocessing"} <= set(stubs.values())
        outcome, streaming = {}, threading.Event()

        def stream():
            async def go():
                async with LLMClient(server.grpc_url, timeout_s=120) as client:
                    request = GenerationRequest("1 2 3", max_tokens=8000, stream=True)
                    return await client.generate(request, on_text=lambda text: streaming.set())

            outcome["reply"] = run_sync(go())
            outcome["ended"] = time.monotonic()

        def watch():
            try:
                supervise(server, poll_s=0.1)
            except SpecpipeError as exc:
                outcome["served"] = exc

        supervisor = threading.Thread(target=watch, daemon=True)
        supervisor.start()  # as serve does from ready on
        client = threading.Thread(target=stream, daemon=True)
        client.start()
        assert streaming.wait(60), "the stream never started"
        os.kill(next(pid for pid, model in stubs.items() if model == "tensorrt_llm"), signal.SIGKILL)
        killed = time.monotonic()
        supervisor.join(60)
        assert not supervisor.is_alive(), "the dead engine process went unnoticed"
        assert "'tensorrt_llm'" in str(outcome["served"]) and "start it again" in str(outcome["served"])
        assert server.process.poll() is not None
        client.join(15)  # the server gets 2 s to exit, not Triton's exit timeout for requests that cannot end
        assert not client.is_alive(), "the stream still hangs after the server stopped"
        reply = outcome["reply"]  # the client reports a broken stream in its result
        assert reply.connection_lost and "UNAVAILABLE" in reply.error
        assert (
            outcome["ended"] - killed < 10
        )  # a fresh tester's clients waited 20 s: Triton's exit timeout, then SIGKILL
    finally:
        server.stop()
