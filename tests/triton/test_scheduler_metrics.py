"""The CPU ``tensorrt_llm`` model's Prometheus metrics (``triton/models/scheduler_metrics.py``), with
Triton's Python-backend objects faked (``triton_fakes``)."""

from __future__ import annotations

import gc
import types

import numpy as np
import pytest
from triton_fakes import FakeMetricFamily, FakeRequest, generate_request, model, wait_for  # noqa: F401 - model is a fixture

from specpipe.runtime.cpu.scheduler.scheduler import ServerBusy
from specpipe.triton.models.common import ENGINE_FAILED
from specpipe.triton.models.draining import ENDED_BY_STOP, REFUSED_WHILE_STOPPING
from specpipe.triton.models.scheduler_metrics import ERROR_REASONS, SchedulerMetrics, error_reason


def errors(reason):
    return FakeMetricFamily.values.get(("specpipe_request_errors_total", (("reason", reason),)), 0.0)


def test_scheduler_metrics_survive_garbage_collection(monkeypatch):
    monkeypatch.setattr(
        "specpipe.triton.models.scheduler_metrics.pb_utils",
        lambda: types.SimpleNamespace(MetricFamily=FakeMetricFamily),
    )
    FakeMetricFamily.values = {}
    metrics = SchedulerMetrics()
    gc.collect()
    scheduler = types.SimpleNamespace(last_draft_lengths=[3, 0, 3], active=[1, 2, 3], waiting=2)
    metrics.update(scheduler)
    metrics.update(scheduler)
    metrics.request_failed("server_busy")
    values = FakeMetricFamily.values
    assert values[("specpipe_batch_size", ())] == 3.0
    assert values[("specpipe_waiting_requests", ())] == 2.0
    assert values[("specpipe_draft_length", (("stat", "mean"),))] == 2.0
    assert values[("specpipe_draft_length", (("stat", "max"),))] == 3.0
    assert values[("specpipe_decode_steps_total", (("draft_length", "3"),))] == 4.0
    assert values[("specpipe_decode_steps_total", (("draft_length", "0"),))] == 2.0
    assert errors("server_busy") == 1.0 and errors("engine_failed") == 0.0


@pytest.mark.parametrize(
    "message, code, reason",
    [
        ("input_ids is empty: send at least one prompt token", "INVALID_ARG", "invalid_request"),
        (str(ServerBusy("server busy: it holds 40 requests already")), "UNAVAILABLE", "server_busy"),
        (REFUSED_WHILE_STOPPING, "UNAVAILABLE", "refused_while_stopping"),
        (ENDED_BY_STOP, "UNAVAILABLE", "ended_by_stop"),
        (f"{ENGINE_FAILED}: RuntimeError: boom", "INTERNAL", "engine_failed"),
    ],
)
def test_each_error_the_model_sends_has_its_reason(message, code, reason):
    assert error_reason(message, code) == reason
    assert reason in ERROR_REASONS


def test_served_requests_count_their_errors_by_reason(model):
    """Through the model's ``execute``: a bad request is counted as invalid, a good one not at all."""
    instance, _ = model
    bad = FakeRequest(
        "bad",
        input_ids=np.array([[1, 2]], np.int32),
        input_lengths=np.array([[2]], np.int32),
        request_output_len=np.array([[0]], np.int32),
    )
    good = generate_request("good", [5, 6, 7], 4)
    instance.execute([bad, good])
    wait_for(lambda: bad.sender.done.is_set() and good.sender.done.is_set())
    assert bad.sender.sent[-1][0].error is not None and good.sender.sent[-1][0].error is None
    assert errors("invalid_request") == 1.0
    assert sum(errors(reason) for reason in ERROR_REASONS) == 1.0


def test_refusals_while_busy_are_counted(model):
    instance, engine = model
    scheduler = instance.worker.engine
    scheduler.max_queue = 0
    requests = [generate_request(f"r{i}", [5, 6, 7 + i], 40) for i in range(6)]
    instance.execute(requests)
    wait_for(lambda: all(r.sender.done.is_set() for r in requests))
    refused = [r for r in requests if r.sender.sent[-1][0] is not None and r.sender.sent[-1][0].error is not None]
    assert len(refused) == 2 and all(r.sender.sent[-1][0].error.code == "UNAVAILABLE" for r in refused)
    assert errors("server_busy") == 2.0 and errors("invalid_request") == 0.0
