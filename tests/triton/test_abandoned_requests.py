"""``postprocessing`` stops the engine request of an abandoned ensemble request itself (a client gone
without sending its stop request): once per id, through the CPU engine's stop path."""

from __future__ import annotations

import types

import numpy as np
from batch_helpers import prompts, run_alone
from triton_fakes import FAKE_PB, FINAL, FakeRequest, generate_request, model, wait_for  # noqa: F401 - model is a fixture

from specpipe.generation.api import SamplingParams
from specpipe.triton.interface import TENSORRT_LLM
from specpipe.triton.models.stop_requests import AbandonedRequests, stop_request_values


def test_abandoned_requests_get_one_stop_each_and_a_failed_stop_is_tried_again():
    sent, failing, clock = [], {"flaky"}, [100.0]

    def send(request_id):
        if request_id in failing:
            failing.discard(request_id)
            raise RuntimeError("engine busy")
        sent.append(request_id)

    abandoned = AbandonedRequests(send, window_s=5.0, clock=lambda: clock[0])
    assert not abandoned.check("live", cancelled=False)  # a request still wanted: nothing to do
    assert not abandoned.check("", cancelled=True)  # no id: nothing names the engine request
    assert abandoned.check("a", cancelled=True) and not abandoned.check("a", cancelled=True)
    assert not abandoned.check("flaky", cancelled=True) and abandoned.check("flaky", cancelled=True)
    assert sent == ["a", "flaky"]
    clock[0] += 4.0
    assert not abandoned.check("a", cancelled=True)  # the same abandoned request's later chunks
    clock[0] += 2.0
    assert abandoned.check("a", cancelled=True)  # a later request reusing the id gets its own stop
    assert sent == ["a", "flaky", "a"] and list(abandoned._stopped) == ["a"]  # stale ids are forgotten


class _Echo:
    """A detokenizer for the fake model: token ids as text."""

    def delta(self, prior, ids):
        return " ".join(map(str, ids))


class _Cancelled(FakeRequest):
    """A postprocessing request the ensemble created cancelled (its client went away)."""

    def __init__(self, request_id, tokens):
        super().__init__(
            request_id, TOKENS_BATCH=np.array([[tokens]], np.int32), SEQUENCE_LENGTH=np.array([[len(tokens)]], np.int32)
        )

    def is_cancelled(self):
        return True


def postprocessing_stopping_through(instance, monkeypatch):
    """A postprocessing model whose stop requests (BLS calls, decoupled) run on the engine model ``instance``;
    returns it and the ``(model name, request id)`` of every stop request sent."""
    from specpipe.triton.models import postprocessing

    calls = []

    class _BlsRequest:
        def __init__(self, model_name, inputs, requested_output_names, request_id):
            calls.append((model_name, request_id))
            self.request = FakeRequest(request_id, **{t.name: t.value for t in inputs})

        def exec(self, decoupled):
            assert decoupled
            instance.execute([self.request])
            return [
                types.SimpleNamespace(has_error=lambda: response.error is not None, error=lambda: response.error)
                for response, _ in self.request.sender.sent
                if response is not None
            ]

    monkeypatch.setattr(FAKE_PB, "InferenceRequest", _BlsRequest, raising=False)
    post = postprocessing.TritonPythonModel()
    post.detok = _Echo()
    post.abandoned = AbandonedRequests(lambda rid: postprocessing.send_stop_request("tensorrt_llm", rid))
    return post, calls


def test_postprocessing_stops_the_engine_request_of_a_cancelled_ensemble_request(model, monkeypatch):
    """The BLS call of ``send_stop_request`` reaches the engine model's ``execute`` as a client's stop
    request would: the abandoned request ends at the next step, its neighbour is untouched."""

    instance, engine = model
    post, bls_calls = postprocessing_stopping_through(instance, monkeypatch)
    ps = prompts(2, seed=5)
    abandoned, neighbour = generate_request("gone", ps[0], 400), generate_request("here", ps[1], 30)
    instance.execute([abandoned, neighbour])
    wait_for(lambda: len(abandoned.sender.sent) >= 3)
    for _ in range(3):  # each later streamed chunk of the request reaches postprocessing cancelled
        (reply,) = post.execute([_Cancelled("gone", [5, 6])])
        assert reply.error is None  # answered as usual: Triton releases the ensemble request only then
    assert bls_calls == [("tensorrt_llm", "gone")]  # one stop request, whatever the number of chunks
    assert abandoned.sender.done.wait(60) and neighbour.sender.done.wait(60)
    assert abandoned.sender.sent[-1] == (None, FINAL) and len(abandoned.sender.tokens()) < 100
    assert neighbour.sender.tokens() == run_alone(engine, ps[1], SamplingParams(max_tokens=30))
    assert set(stop_request_values()) <= {spec.name for spec in TENSORRT_LLM.inputs}


def test_a_request_sent_without_an_id_is_stopped_by_the_id_the_engine_gave_it(model, monkeypatch):
    """tritonclient sends no request id unless asked: such a request gets one from the engine model,
    returned as ``engine_request_id`` and handed by the ensemble to postprocessing, which stops the
    abandoned request by it (issue 34: a stream cancelled with tritonclient's own call kept decoding)."""
    from specpipe.triton.interface import ENSEMBLE_STEPS, POSTPROCESSING

    instance, engine = model
    post, bls_calls = postprocessing_stopping_through(instance, monkeypatch)
    ps = prompts(3, seed=6)
    anonymous, other = generate_request("", ps[0], 400), generate_request("", ps[1], 30)
    instance.execute([anonymous, other])
    wait_for(lambda: len(anonymous.sender.sent) >= 3 and other.sender.sent)
    ids = {response.outputs["engine_request_id"].reshape(-1)[0] for response, _ in anonymous.sender.sent}
    assert len(ids) == 1 and (given := ids.pop().decode()).startswith("specpipe-anonymous-")
    assert other.sender.sent[0][0].outputs["engine_request_id"].reshape(-1)[0].decode() != given
    cancelled = _Cancelled("", [5, 6])
    cancelled.inputs["ENGINE_REQUEST_ID"] = types.SimpleNamespace(
        as_numpy=lambda: np.array([[given.encode()]], np.object_)
    )
    (reply,) = post.execute([cancelled])
    assert reply.error is None and bls_calls == [("tensorrt_llm", given)]
    assert anonymous.sender.done.wait(60) and other.sender.done.wait(60)
    assert anonymous.sender.sent[-1] == (None, FINAL) and len(anonymous.sender.tokens()) < 100
    assert other.sender.tokens() == run_alone(engine, ps[1], SamplingParams(max_tokens=30))
    # the ensemble hands the id over (CPU runtime's wiring)
    engine_step, post_step = ENSEMBLE_STEPS[1], ENSEMBLE_STEPS[2]
    assert ("engine_request_id", "_ENGINE_REQUEST_ID") in engine_step.output_map
    assert ("ENGINE_REQUEST_ID", "_ENGINE_REQUEST_ID") in post_step.input_map
    assert any(spec.name == "ENGINE_REQUEST_ID" and spec.optional for spec in POSTPROCESSING.inputs)
