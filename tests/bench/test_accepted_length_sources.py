"""``specpipe bench`` and ``specpipe validate`` read the mean accepted length from the deployment's
``target_forwards`` perf output where it returns one (the CPU runtime), exact also for a request that its
end id ended inside a step, and estimate it from the output tokens only where it does not (TensorRT-LLM),
saying which they used."""

import pytest

from specpipe.bench.load import make_record
from specpipe.bench.prompts import Prompt
from specpipe.bench.records import RequestRecord
from specpipe.bench.report import CSV_COLUMNS, REQUEST_COLUMNS
from specpipe.bench.stats import aggregate
from specpipe.client.llm import GenerationResult
from specpipe.client.validate import _figures

# 9 tokens sent, then the end id, generated but not sent: 10 generated = 6 forwards + 4 accepted drafts.
ENDED = {"num_output_tokens": 9, "total_accepted_draft_tokens": 4, "total_draft_tokens": 8, "acceptance_rate": 0.5}
# 12 tokens, max_tokens reached: 12 = 5 forwards + 7 accepted drafts.
FULL = {"num_output_tokens": 12, "total_accepted_draft_tokens": 7, "total_draft_tokens": 9, "acceptance_rate": 7 / 9}


def record(perf: dict, index: int = 0) -> RequestRecord:
    result = GenerationResult(text="x", latency_s=1.0, ttft_s=0.1, perf=dict(perf))
    return make_record("d", 1, index, Prompt(str(index), "p"), 0.0, result, int(perf["num_output_tokens"]), "server")


def test_a_record_uses_the_target_forwards_where_the_deployment_returns_them():
    exact = record({**ENDED, "target_forwards": 6})
    assert exact.target_forwards == 6
    assert exact.decoding_steps == (9, 5)  # (6 - 1 + 4) tokens after the first in 6 - 1 decoding forwards
    assert exact.mean_accepted_length == pytest.approx(1.8)
    estimated = record(ENDED)  # the end id's forward is missed: one step too few
    assert estimated.target_forwards is None and estimated.decoding_steps == (8, 4)
    assert estimated.mean_accepted_length == 2.0
    assert exact.to_dict()["target_forwards"] == 6 and estimated.to_dict()["target_forwards"] is None


def test_the_aggregate_length_and_its_source():
    exact = aggregate([record({**ENDED, "target_forwards": 6}, 0), record({**FULL, "target_forwards": 5}, 1)])
    assert exact.mean_accepted_length == pytest.approx((9 + 11) / (5 + 4))
    assert exact.accepted_length_source == "target forwards"
    estimated = aggregate([record(ENDED, 0), record(FULL, 1)])
    assert estimated.mean_accepted_length == pytest.approx((8 + 11) / (4 + 4))
    assert estimated.accepted_length_source == "output tokens"
    mixed = aggregate([record({**ENDED, "target_forwards": 6}, 0), record(FULL, 1)])
    assert mixed.mean_accepted_length == pytest.approx((9 + 11) / (5 + 4))  # FULL's estimate is exact: 4 steps
    assert mixed.accepted_length_source == "target forwards and output tokens"
    assert aggregate([record({"num_output_tokens": 5})]).accepted_length_source is None  # no draft counters
    assert "accepted_length_source" in CSV_COLUMNS and "target_forwards" in REQUEST_COLUMNS


def test_a_baseline_with_forwards_has_length_one():
    plain = {"num_output_tokens": 6, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}
    agg = aggregate([record({**plain, "target_forwards": 7})])  # 6 sent + the end id: 7 forwards
    assert agg.mean_accepted_length == 1.0 and agg.accepted_length_source == "target forwards"


def test_validate_reports_the_exact_length_and_says_which_it_used():
    exact = _figures("p", GenerationResult(perf={**ENDED, "target_forwards": 6}, latency_s=0.5))
    assert (exact.mean_accepted_length, exact.target_forwards, exact.length_source) == (1.8, 6, "target forwards")
    estimated = _figures("p", GenerationResult(perf=ENDED, latency_s=0.5))
    assert (estimated.mean_accepted_length, estimated.target_forwards) == (2.0, None)
    assert estimated.length_source == "output tokens"
    one_forward = _figures("p", GenerationResult(perf={"num_output_tokens": 1, "target_forwards": 1}))
    assert one_forward.mean_accepted_length == 1.0
