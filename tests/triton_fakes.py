"""Triton's Python-backend objects faked for the CPU ``tensorrt_llm`` model's ``execute`` (requests,
response senders, tensors, errors), and the ``model`` fixture: that model on a tiny n-gram engine."""

from __future__ import annotations

import sys
import threading
import time
import types

import numpy as np
import pytest

from specpipe.triton.models.stop_requests import StopRequests
from specpipe.triton.models.tensorrt_llm_cpu import RequestWorker, TritonPythonModel
from batch_helpers import make_engine, scheduler_for

FINAL = 1

class FakeTensor:
    def __init__(self, name, value):
        self.name, self.value = name, value

    def as_numpy(self):
        return self.value


class FakeResponse:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name: t.value for t in output_tensors}
        self.error = error


class FakeError:
    INVALID_ARG, INTERNAL, UNAVAILABLE, CANCELLED = "INVALID_ARG", "INTERNAL", "UNAVAILABLE", "CANCELLED"

    def __init__(self, message, code=None):
        self.message, self.code = message, code


FAKE_PB = types.SimpleNamespace(
    Tensor=FakeTensor, InferenceResponse=FakeResponse, TritonError=FakeError, TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
    get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
)


class FakeSender:
    """Triton's ``InferenceResponseSender``: records ``(response or None, flags)``."""

    def __init__(self):
        self.sent, self.done = [], threading.Event()

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))
        if flags & FINAL:
            self.done.set()

    def is_cancelled(self):
        return False

    def tokens(self):
        return [t for r, _ in self.sent if r is not None and "output_ids" in r.outputs
                for t in r.outputs["output_ids"].reshape(-1).tolist()]


class FakeRequest:
    def __init__(self, request_id, **inputs):
        self.id, self.inputs, self.sender = request_id, {k: FakeTensor(k, v) for k, v in inputs.items()}, FakeSender()

    def request_id(self):
        return self.id

    def get_response_sender(self):
        return self.sender


def generate_request(request_id, prompt, max_tokens):
    return FakeRequest(request_id, input_ids=np.array([prompt], np.int32), input_lengths=np.array([[len(prompt)]], np.int32),
                    request_output_len=np.array([[max_tokens]], np.int32), streaming=np.array([[True]]))


def stop_request(request_id):
    return FakeRequest(request_id, input_ids=np.array([[0]], np.int32), input_lengths=np.array([[0]], np.int32),
                    request_output_len=np.array([[0]], np.int32), stop=np.array([[True]]))


@pytest.fixture
def model(monkeypatch, single_thread):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FAKE_PB)
    engine = make_engine("ngram")
    instance = TritonPythonModel()
    instance.exclude_input_default, instance.stops = True, StopRequests()
    instance.worker = RequestWorker(load=lambda: scheduler_for(engine, max_batch_size=4))
    yield instance, engine
    instance.worker.close()


def wait_for(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


