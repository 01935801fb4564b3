"""Triton's Python-backend objects faked for the CPU ``tensorrt_llm`` model's ``execute`` (requests,
response senders, tensors, errors), and the ``model`` fixture: that model on a tiny n-gram engine."""

from __future__ import annotations

import sys
import threading
import time
import types
import weakref

import numpy as np
import pytest
from batch_helpers import make_engine, scheduler_for

from specpipe.triton.models.request_worker import RequestWorker
from specpipe.triton.models.scheduler_metrics import SchedulerMetrics
from specpipe.triton.models.stop_requests import StopRequests
from specpipe.triton.models.tensorrt_llm_cpu import TritonPythonModel

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


class FakeMetricFamily:
    """Triton's ``pb_utils.MetricFamily`` as far as it matters here: every metric's value lands in
    :attr:`values` (``(family name, sorted labels) -> value``), and a metric fails once its family object
    has been garbage-collected (Triton: "the corresponding 'MetricFamily' has been deleted")."""

    GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"
    values: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels, buckets=None):  # noqa: N802 - Triton's spelling
        if (buckets is not None) != (self.kind == self.HISTOGRAM):  # python_backend's CreateMetric refuses both
            raise ValueError("Failed to create metric. Unexpected or missing buckets.")
        return FakeMetric(weakref.ref(self), labels)


class FakeMetric:
    def __init__(self, family, labels):
        self.family, self.labels = family, labels

    def _key(self):
        family = self.family()
        if family is None:
            raise RuntimeError("Invalid metric operation as the corresponding 'MetricFamily' has been deleted")
        return family.name, tuple(sorted(self.labels.items()))

    def set(self, value):
        FakeMetricFamily.values[self._key()] = value

    def increment(self, value):
        key = self._key()
        FakeMetricFamily.values[key] = FakeMetricFamily.values.get(key, 0.0) + value

    def observe(self, value):
        """A histogram's observation: the list of observed values lands in ``values``."""
        FakeMetricFamily.values.setdefault(self._key(), []).append(value)


FAKE_PB = types.SimpleNamespace(
    Tensor=FakeTensor,
    InferenceResponse=FakeResponse,
    TritonError=FakeError,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
    get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
    MetricFamily=FakeMetricFamily,
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
        return [
            t
            for r, _ in self.sent
            if r is not None and "output_ids" in r.outputs
            for t in r.outputs["output_ids"].reshape(-1).tolist()
        ]


class FakeRequest:
    def __init__(self, request_id, **inputs):
        self.id, self.inputs, self.sender = request_id, {k: FakeTensor(k, v) for k, v in inputs.items()}, FakeSender()

    def request_id(self):
        return self.id

    def get_response_sender(self):
        return self.sender


def generate_request(request_id, prompt, max_tokens):
    return FakeRequest(
        request_id,
        input_ids=np.array([prompt], np.int32),
        input_lengths=np.array([[len(prompt)]], np.int32),
        request_output_len=np.array([[max_tokens]], np.int32),
        streaming=np.array([[True]]),
    )


def stop_request(request_id):
    return FakeRequest(
        request_id,
        input_ids=np.array([[0]], np.int32),
        input_lengths=np.array([[0]], np.int32),
        request_output_len=np.array([[0]], np.int32),
        stop=np.array([[True]]),
    )


@pytest.fixture
def model(monkeypatch, single_thread):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FAKE_PB)
    engine = make_engine("ngram")
    instance = TritonPythonModel()
    FakeMetricFamily.values = {}
    instance.exclude_input_default, instance.stops, instance.metrics = True, StopRequests(), SchedulerMetrics()
    instance.worker = RequestWorker(
        load=lambda: scheduler_for(engine, max_batch_size=4), on_step=instance.metrics.update
    )
    yield instance, engine
    instance.worker.close()


def wait_for(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
