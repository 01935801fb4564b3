"""Statistics of ``specpipe bench`` from hand-made request records: every figure computed by hand."""

import pytest

from specpipe.bench.records import CounterAcceptance, LevelResult, RequestRecord
from specpipe.bench.stats import Distribution, aggregate, benchmark_duration, level_aggregate, percentile, speedup


def rec(index, start, latency, ttft, out, drafts=None, accepted=None, error=None, source="server"):
    return RequestRecord(
        deployment="d",
        concurrency=2,
        index=index,
        prompt_id=str(index),
        start_s=start,
        latency_s=latency,
        ttft_s=ttft,
        output_tokens=out,
        output_tokens_source=source,
        draft_tokens=drafts,
        accepted_draft_tokens=accepted,
        acceptance_rate=(accepted / drafts) if drafts else None,
        error=error,
    )


# Three completed requests and one failure that ends last (it still bounds the benchmark window).
RECORDS = [
    rec(0, start=0.0, latency=1.0, ttft=0.2, out=9, drafts=8, accepted=4),
    rec(1, start=0.5, latency=2.0, ttft=0.4, out=5, drafts=4, accepted=1),
    rec(2, start=1.0, latency=3.0, ttft=1.0, out=17, drafts=16, accepted=12),
    rec(3, start=1.5, latency=3.5, ttft=None, out=None, error="boom"),
]


def test_percentiles_interpolate_linearly():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([0, 10], 90) == 9.0
    assert percentile([200, 400, 1000], 90) == pytest.approx(880.0, abs=1e-9)  # rank 1.8: 400 + 0.8 * 600
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    dist = Distribution.of([3, 1, 2])
    assert (dist.count, dist.mean, dist.min, dist.max, dist.p50) == (3, 2.0, 1.0, 3.0, 2.0)
    assert Distribution.of([]).p99 is None


def test_per_request_derived_values():
    first, second = RECORDS[0], RECORDS[1]
    assert first.end_s == 1.0 and RECORDS[3].end_s == 5.0
    assert first.itl_s == pytest.approx(0.1, abs=1e-12)  # (1.0 - 0.2) / (9 - 1)
    assert second.itl_s == pytest.approx(0.4, abs=1e-12)  # (2.0 - 0.4) / (5 - 1)
    assert first.mean_accepted_length == 2.0  # 8 tokens in 8 - 4 = 4 steps
    assert second.mean_accepted_length == pytest.approx(4 / 3)
    assert RECORDS[3].itl_s is None and RECORDS[3].mean_accepted_length is None and not RECORDS[3].ok
    assert rec(9, 0, 1, 0.5, out=1, drafts=0, accepted=0).itl_s is None  # one token: no inter-token gap


def test_throughput_window_and_latency_distributions():
    agg = aggregate(RECORDS)
    assert (agg.requests, agg.completed, agg.errors) == (4, 3, 1)
    assert benchmark_duration(RECORDS) == 5.0  # first send 0.0 -> last response 5.0 (the failure)
    assert agg.duration_s == 5.0 and agg.output_tokens == 31
    assert agg.output_token_throughput == pytest.approx(31 / 5.0, abs=1e-12)
    assert agg.request_throughput == pytest.approx(3 / 5.0, abs=1e-12)
    assert (agg.ttft_ms.p50, agg.ttft_ms.p90, agg.ttft_ms.p99) == pytest.approx((400.0, 880.0, 988.0), abs=1e-9)
    assert (agg.e2e_ms.p50, agg.e2e_ms.p90, agg.e2e_ms.p99) == pytest.approx((2000.0, 2800.0, 2980.0), abs=1e-9)
    assert agg.e2e_ms.count == 3  # the failure is not a latency sample
    assert (agg.itl_ms.p50, agg.itl_ms.p99) == pytest.approx((125.0, 125.0 + 0.98 * 275.0), abs=1e-9)
    assert agg.output_tokens_per_request.mean == pytest.approx(31 / 3)
    assert agg.token_count_sources == ("server",)


def test_acceptance_is_token_weighted_and_per_request():
    agg = aggregate(RECORDS)
    assert agg.acceptance_rate == pytest.approx(17 / 28, abs=1e-12)  # (4 + 1 + 12) / (8 + 4 + 16)
    assert agg.acceptance_rate_mean == pytest.approx(0.5, abs=1e-12)  # mean of 0.5, 0.25, 0.75
    assert agg.mean_accepted_length == pytest.approx(28 / 11, abs=1e-12)  # (8 + 4 + 16) / (4 + 3 + 4)
    assert agg.mean_accepted_length_mean == pytest.approx((2 + 4 / 3 + 4) / 3, abs=1e-12)
    assert agg.acceptance_source == "perf outputs"


def test_baseline_has_no_acceptance_and_length_one():
    records = [rec(0, 0.0, 2.0, 0.5, out=11, drafts=0, accepted=0), rec(1, 0.0, 4.0, 1.0, out=21, drafts=0, accepted=0)]
    agg = aggregate(records)
    assert agg.acceptance_rate is None and agg.acceptance_rate_mean is None
    assert agg.mean_accepted_length == 1.0
    assert agg.output_token_throughput == pytest.approx(32 / 4.0)


def test_server_counters_stand_in_for_missing_perf_outputs():
    records = [rec(0, 0.0, 1.0, 0.1, out=10, source="usage"), rec(1, 1.0, 1.0, 0.1, out=20, source="usage")]
    level = LevelResult(
        "openai",
        1,
        records=records,
        counters=CounterAcceptance(
            draft_tokens=10, accepted_draft_tokens=4, output_tokens=30, requests=2, source="specpipe"
        ),
    )
    agg = level_aggregate(level)
    assert agg.acceptance_source == "server counters"
    assert agg.acceptance_rate == pytest.approx(0.4)
    assert agg.mean_accepted_length == pytest.approx(28 / 24)  # (30 - 2) tokens after the first, in 28 - 4 steps
    assert agg.token_count_sources == ("usage",)
    assert aggregate(records).acceptance_rate is None


def test_empty_level_and_speedup():
    agg = aggregate([])
    assert agg.duration_s is None and agg.output_token_throughput is None and agg.request_throughput is None
    assert speedup(30.0, 20.0) == 1.5
    assert speedup(None, 20.0) is None and speedup(10.0, None) is None and speedup(10.0, 0.0) is None
