"""The Triton CPU model's worker in batch mode: requests run concurrently in the scheduler on the worker
thread (the one that loaded the engine), each streams its own responses, a client cancellation ends
only that request, and a request past the queue bound gets UNAVAILABLE ("server busy") at once."""

import gc
import types
import weakref

import pytest

from specpipe.generation.api import SamplingParams
from specpipe.triton.models import tensorrt_llm_cpu
from specpipe.triton.models.engine_request import EngineRequest
from specpipe.triton.models.tensorrt_llm_cpu import RequestWorker
from batch_helpers import make_engine, prompts, run_alone, scheduler_for
from recording_sender import RecordingSender as Sender

pytestmark = pytest.mark.usefixtures("single_thread")


def test_worker_batches_streams_cancels_and_answers_busy():
    engine = make_engine("ngram")
    ps = prompts(4, seed=3)
    params = SamplingParams(max_tokens=20)
    worker = RequestWorker(load=lambda: scheduler_for(engine, max_batch_size=2, max_queue=1))
    senders = [Sender(), Sender(cancel_after=2), Sender(), Sender()]
    for prompt, sender in zip(ps, senders):
        worker.submit(EngineRequest(prompt, params, streaming=True, exclude_input_in_output=True,
                                    return_perf_metrics=True), sender)
    busy = Sender()
    # the queue is drained in one go: 2 running + 1 waiting fit, the 4th and this one are refused
    worker.submit(EngineRequest(ps[0], params), busy)
    worker.close()
    assert busy.errors and busy.errors[0][1] == "UNAVAILABLE" and "server busy" in busy.errors[0][0]
    assert senders[3].errors and senders[3].errors[0][1] == "UNAVAILABLE"
    for i in (0, 2):
        assert senders[i].tokens() == run_alone(engine, ps[i], params)
        assert senders[i].responses[-1][1] is True
        assert "total_draft_tokens" in senders[i].responses[-1][0]
        lengths = [int(outputs["draft_length"][0, 0]) for outputs, _ in senders[i].responses]
        assert all(0 <= k <= engine.max_draft_len for k in lengths) and any(k > 0 for k in lengths)
        assert senders[i].threads == {"specpipe-engine"}
    cancelled = senders[1]
    assert cancelled.finished.is_set() and 2 <= len(cancelled.responses) < 20
    assert all(not final for _, final in cancelled.responses)


class _FakeMetricFamily:
    """Triton's ``pb_utils.MetricFamily`` as far as it matters here: a metric fails once its family
    object has been garbage-collected (Triton: "the corresponding 'MetricFamily' has been deleted")."""

    GAUGE, COUNTER = "gauge", "counter"

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels):  # noqa: N802 - Triton's spelling
        return _FakeMetric(weakref.ref(self), labels)


class _FakeMetric:
    values: dict = {}

    def __init__(self, family, labels):
        self.family, self.labels = family, labels

    def _key(self):
        family = self.family()
        if family is None:
            raise RuntimeError("Invalid metric operation as the corresponding 'MetricFamily' has been deleted")
        return family.name, tuple(sorted(self.labels.items()))

    def set(self, value):
        _FakeMetric.values[self._key()] = value

    def increment(self, value):
        key = self._key()
        _FakeMetric.values[key] = _FakeMetric.values.get(key, 0.0) + value


def test_scheduler_metrics_survive_garbage_collection(monkeypatch):
    fake = types.SimpleNamespace(MetricFamily=_FakeMetricFamily)
    monkeypatch.setattr(tensorrt_llm_cpu, "pb_utils", lambda: fake)
    _FakeMetric.values = {}
    metrics = tensorrt_llm_cpu.SchedulerMetrics()
    gc.collect()
    scheduler = types.SimpleNamespace(last_draft_lengths=[3, 0, 3], active=[1, 2, 3], waiting=2)
    metrics.update(scheduler)
    metrics.update(scheduler)
    values = _FakeMetric.values
    assert values[("specpipe_batch_size", ())] == 3.0
    assert values[("specpipe_waiting_requests", ())] == 2.0
    assert values[("specpipe_draft_length", (("stat", "mean"),))] == 2.0
    assert values[("specpipe_draft_length", (("stat", "max"),))] == 3.0
    assert values[("specpipe_decode_steps_total", (("draft_length", "3"),))] == 4.0
    assert values[("specpipe_decode_steps_total", (("draft_length", "0"),))] == 2.0
