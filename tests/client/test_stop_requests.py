"""TensorRT-LLM's stop request (input ``stop`` true + the request id) on the CPU ``tensorrt_llm`` model:
the registry, and the model's ``execute`` with Triton's Python-backend objects faked
(``triton_fakes``)."""

from __future__ import annotations

import numpy as np
import pytest
from batch_helpers import prompts, run_alone
from triton_fakes import FINAL, generate_request, model, stop_request, wait_for  # noqa: F401 - model is a fixture

from specpipe.generation.api import SamplingParams
from specpipe.triton.models.stop_requests import StopRequests, is_stop_request


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_stop_before_its_request_is_kept_for_a_while():
    clock = _Clock()
    stops = StopRequests(pending_s=10.0, clock=clock)
    assert not stops.is_stopped("a")
    stops.stop("a")
    assert stops.is_stopped("a") and not stops.is_stopped("b") and not stops.is_stopped("")
    clock.now += 9.0
    assert stops.is_stopped("a")
    clock.now += 2.0
    assert not stops.is_stopped("a")  # expired: a request arriving now runs
    stops.stop("c")
    assert "a" not in stops._stopped  # expired entries are dropped, so the registry stays small
    with pytest.raises(ValueError, match="request id"):
        stops.stop("")


def test_a_running_request_stays_stopped_and_a_late_stop_spares_the_next_request_with_its_id():
    clock = _Clock()
    stops = StopRequests(pending_s=10.0, clock=clock)
    stops.started("r")
    stops.stop("r")
    clock.now += 30.0
    assert stops.is_stopped("r")  # running: stopped however long its current step takes
    stops.ended("r")
    assert not stops.is_stopped("r")
    stops.stop("r")  # late: the request has ended
    stops.started("r")  # a client reusing the id
    assert not stops.is_stopped("r")
    stops.ended("r")
    clock.now += 11.0
    stops.stop("r")  # long after: an id not seen for a while is a stop ahead of its request again
    assert stops.is_stopped("r")


def test_ended_ids_are_forgotten_as_requests_end_without_any_stop_request():
    clock = _Clock()
    stops = StopRequests(pending_s=10.0, clock=clock)
    for i in range(5000):  # 10 requests a second, no stop request among them
        stops.started(f"id{i}")
        stops.ended(f"id{i}")
        clock.now += 0.1
    assert len(stops._ended) <= 101  # the last 10 s only, not every id ever served
    stops.stop("id4999")  # still remembered as just ended: a late stop is ignored
    assert not stops.is_stopped("id4999")
    stops.started("long")
    stops.stop("long")
    for i in range(300):  # a stopped request that runs on while 30 s of others end
        stops.started(f"other{i}")
        stops.ended(f"other{i}")
        clock.now += 0.1
    assert stops.is_stopped("long")


def test_two_running_requests_with_one_id_are_stopped_together():
    stops = StopRequests()
    stops.started("x")
    stops.started("x")
    stops.stop("x")
    stops.ended("x")
    assert stops.is_stopped("x")  # the other one is still running
    stops.ended("x")
    assert not stops.is_stopped("x")


@pytest.mark.parametrize("value, expected", [(None, False), (np.array([[True]]), True), (np.array([False]), False)])
def test_is_stop_request(value, expected):
    assert is_stop_request(lambda name: value if name == "stop" else None) is expected


def test_is_stop_request_refuses_more_than_one_value():
    with pytest.raises(ValueError, match="'stop' must hold one value"):
        is_stop_request(lambda name: np.array([True, False]))


# --- the model's execute, with Triton's Python-backend objects faked ---------------------------------


def test_a_stop_request_cancels_the_running_request_with_its_id_and_no_other(model):
    instance, engine = model
    ps = prompts(2, seed=5)
    running, neighbour = generate_request("req-1", ps[0], 400), generate_request("req-2", ps[1], 30)
    instance.execute([running, neighbour])
    wait_for(lambda: len(running.sender.sent) >= 3)
    stop = stop_request("req-1")
    instance.execute([stop])
    # the stop request is answered at once with one empty final response, as TensorRT-LLM's backend does
    assert len(stop.sender.sent) == 1 and stop.sender.sent[0][1] == FINAL and stop.sender.sent[0][0].outputs == {}
    assert running.sender.done.wait(60) and neighbour.sender.done.wait(60)
    # the stopped request ends with the final flag alone, long before its 400 tokens
    assert running.sender.sent[-1] == (None, FINAL)
    assert len(running.sender.tokens()) < 100
    assert neighbour.sender.tokens() == run_alone(engine, ps[1], SamplingParams(max_tokens=30))
    assert not instance.stops.is_stopped("req-1")  # forgotten once its request ended


def test_a_stop_arriving_after_its_request_ended_does_not_cancel_a_request_reusing_the_id(model):
    instance, engine = model
    prompt, params = prompts(1, seed=7)[0], SamplingParams(max_tokens=12)
    first = generate_request("same", prompt, 12)
    instance.execute([first])
    assert first.sender.done.wait(60) and len(first.sender.tokens()) == 12
    instance.execute([stop_request("same")])
    again = generate_request("same", prompt, 12)
    instance.execute([again])
    assert again.sender.done.wait(60)
    assert again.sender.tokens() == first.sender.tokens() == run_alone(engine, prompt, params)


def test_a_stop_that_arrives_before_its_request_cancels_it_on_arrival(model):
    instance, _ = model
    instance.execute([stop_request("early")])
    late = generate_request("early", prompts(1, seed=6)[0], 400)
    instance.execute([late])
    assert late.sender.done.wait(60)
    assert late.sender.sent[-1] == (None, FINAL) and len(late.sender.tokens()) <= 12


def test_a_stop_request_without_an_id_is_a_clear_error(model):
    instance, _ = model
    stop = stop_request("")
    instance.execute([stop])
    ((response, flags),) = stop.sender.sent
    assert flags == FINAL and response.error.code == "INVALID_ARG" and "request id" in response.error.message


# --- the client: stop requests sent at the same time on a fresh client -----------------------------


class _FakeStream:
    def __init__(self, sent, iterator):
        self.sent, self.iterator = sent, iterator

    def __aiter__(self):
        return self._responses()

    async def _responses(self):
        async for request in self.iterator:
            self.sent.append(request)
            yield object(), None

    def cancel(self):
        pass


class _FakeTriton:
    """``tritonclient.grpc.aio.InferenceServerClient`` as far as ``LLMClient.stop`` uses it; reading a
    config takes a while, so concurrent stops overlap the first reading."""

    ENSEMBLE = {
        "platform": "ensemble",
        "ensemble_scheduling": {
            "step": [
                {"model_name": "preprocessing", "input_map": {"QUERY": "text_input"}},
                {"model_name": "tensorrt_llm", "input_map": {"input_ids": "_INPUT_ID"}},
            ]
        },
    }
    ENGINE = {"max_batch_size": 1, "input": [{"name": "input_ids"}, {"name": "stop"}]}

    def __init__(self):
        self.sent, self.config_reads = [], 0

    async def get_model_config(self, model, as_json=True):
        import asyncio

        self.config_reads += 1
        await asyncio.sleep(0.05)
        return {"config": self.ENSEMBLE if model == "ensemble" else self.ENGINE}

    def stream_infer(self, iterator, stream_timeout=None):
        return _FakeStream(self.sent, iterator)


def test_stops_sent_together_on_a_fresh_client_all_go_out():
    import asyncio

    from specpipe.client.llm import LLMClient

    async def go():
        client = LLMClient("unused:1")
        client._client = fake = _FakeTriton()
        done = await asyncio.gather(*(client.stop(f"id-{i}") for i in range(3)))
        return done, fake

    done, fake = asyncio.run(go())
    assert done == [True, True, True]
    assert sorted(r["request_id"] for r in fake.sent) == ["id-0", "id-1", "id-2"]
    assert {r["model_name"] for r in fake.sent} == {"tensorrt_llm"} and fake.config_reads == 2
    stop = next(t for t in fake.sent[0]["inputs"] if t.name() == "stop")
    assert stop.shape() == [1, 1]


def test_sigterm_cancels_a_client_run_like_ctrl_c_and_exits_143():
    import asyncio
    import os
    import signal

    from specpipe.client.llm import run_sync

    cleaned = []

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # cleanup that awaits, as LLMClient.close waits for its stop requests
            cleaned.append(True)

    with pytest.raises(SystemExit) as exit_info:
        run_sync(work())
    assert exit_info.value.code == 143 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# --- the client: a server that dies mid-stream ---------------------------------------------------------


class _TextResponse:
    """A streamed response carrying ``text`` (not the final one)."""

    def __init__(self, text):
        self.text = text

    def as_numpy(self, name):
        import numpy as np

        return np.array([self.text.encode()], dtype=object) if name == "text_output" else None

    def get_response(self):
        class _Parameters(dict):
            pass

        class _Response:
            parameters = _Parameters()

        return _Response()


class _DyingStream(_FakeStream):
    """Two text chunks, then the connection breaks as when tritonserver is killed."""

    async def _responses(self):
        import grpc

        async for request in self.iterator:
            self.sent.append(request)
        for text in ("Once", " upon"):
            yield _TextResponse(text), None
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="Stream removed (Socket closed)",
        )


class _DyingTriton(_FakeTriton):
    def stream_infer(self, iterator, stream_timeout=None):
        return _DyingStream(self.sent, iterator)


def test_a_server_dying_mid_stream_is_a_lost_connection_not_a_rejection_and_no_stop_is_sent():
    import asyncio

    from specpipe.client.llm import LLMClient
    from specpipe.client.request import GenerationRequest

    async def go():
        client = LLMClient("unused:1")
        client._client = fake = _DyingTriton()
        client._batched = True
        result = await client.generate(GenerationRequest(prompt="Hi", max_tokens=64, stream=True))
        await asyncio.sleep(0.1)  # a stop request, had one been sent, would have gone out by now
        return result, fake

    result, fake = asyncio.run(go())
    assert result.connection_lost and result.error == "UNAVAILABLE: Stream removed (Socket closed)"
    assert result.chunks == ["Once", " upon"]
    assert [r["model_name"] for r in fake.sent] == ["ensemble"]  # the request itself; no stop to a dead server


def test_generate_names_a_lost_connection_and_what_to_check(monkeypatch):
    from specpipe.client import generate as generate_module
    from specpipe.client.llm import GenerationResult
    from specpipe.client.request import GenerationRequest
    from specpipe.errors import SpecpipeError

    lost = GenerationResult(chunks=["Once"], error="UNAVAILABLE: Socket closed", connection_lost=True)

    async def fake_generate(job, on_text):
        return lost

    monkeypatch.setattr(generate_module, "_generate", fake_generate)
    job = generate_module.GenerateJob(url="localhost:8201", request=GenerationRequest(prompt="Hi"))
    with pytest.raises(
        SpecpipeError, match=r"lost the connection to localhost:8201 after 1 chunk of text \(UNAVAILABLE"
    ):
        generate_module.generate(job)
    rejected = GenerationResult(error="top_p must be in (0, 1]")
    monkeypatch.setattr(generate_module, "_generate", lambda job, on_text: _done(rejected))
    with pytest.raises(SpecpipeError, match=r"the server rejected the request: top_p"):
        generate_module.generate(job)


async def _done(value):
    return value
