"""Stopping a real Triton CPU server (e2e): the CPU model is drained first, so requests still running
end with a "server stopping" error instead of hanging until Triton's exit timeout, and new ones are
refused (a fresh tester's find: a stop with streams running took 20 s, the streams stalled from the
SIGTERM on, and tritonserver once crashed at exit)."""

import threading
import time

import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine

from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e

PROMPT = "1 2 3"


def ask(server, request: GenerationRequest):
    async def go():
        async with LLMClient(server.grpc_url, timeout_s=120) as client:
            return await client.generate(request)

    return run_sync(go())


def test_a_drain_ends_running_streams_with_an_error_and_refuses_new_requests(tmp_path):
    engine = make_tiny_engine(tmp_path / "engines", "long", max_position_embeddings=8192)
    repo = package_engine(engine, tmp_path / "repo" / "long")
    log_path = tmp_path / "triton.log"
    server = LocalTritonServer(repo, free_port(), free_port(), free_port(), log_path=log_path)
    server.start()
    try:
        server.wait_ready(300)
        replies, streaming = {}, [threading.Event(), threading.Event()]

        def stream(key):
            async def go():
                async with LLMClient(server.grpc_url, timeout_s=120) as client:
                    request = GenerationRequest(PROMPT, max_tokens=8000, min_tokens=7900, stream=True)
                    return await client.generate(request, on_text=lambda text: streaming[key].set())

            replies[key] = run_sync(go())

        clients = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(2)]
        for client in clients:
            client.start()
        assert all(started.wait(60) for started in streaming), "the streams never started"
        started = time.monotonic()
        assert server.drain(1.0), "the model never reported that its requests had ended"
        assert time.monotonic() - started < 1.0 + 3.0
        for client in clients:
            client.join(10)
            assert not client.is_alive(), "a stream still runs after the drain"
        for reply in replies.values():
            assert reply.text and not reply.connection_lost, reply
            assert reply.error and "server stopping" in reply.error and "ended before it finished" in reply.error, reply
        refused = ask(server, GenerationRequest(PROMPT, max_tokens=4, stream=True))
        assert refused.error and "server stopping" in refused.error and "no new requests" in refused.error, refused
        started = time.monotonic()
        code = server.stop()
        # Ended right after their last chunk, the streams' ensemble requests were never released by
        # Triton 2.51 (ERROR_AFTER_DATA_S): it then waited out its 10 s exit timeout, status 1.
        assert code == 0 and "Exit timeout expired" not in log_path.read_text(), code
        assert time.monotonic() - started < 8
    finally:
        server.stop()
