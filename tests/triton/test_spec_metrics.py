"""Speculative-decoding metrics named as vLLM's (``generation/spec_metrics.py``): the per-step deltas, the
CPU model's Triton series (Triton's Python-backend objects faked) and the scheduler's accepted count,
which must not count drafts the output never keeps."""

from __future__ import annotations

import sys

import pytest
from batch_helpers import run_batch, scheduler_for
from tiny_models import tiny_llama
from triton_fakes import FAKE_PB, FakeMetricFamily, generate_request, wait_for

from specpipe.generation import spec_metrics as names
from specpipe.generation.api import RequestStats, SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter
from specpipe.triton.models.scheduler_metrics import SchedulerMetrics, exported_series
from specpipe.triton.models.stop_requests import StopRequests
from specpipe.triton.models.tensorrt_llm_cpu import RequestWorker, TritonPythonModel


def self_drafting_engine(max_draft_len: int = 3) -> Deployment:
    """A chain engine whose drafter is its own target: every greedy draft is accepted."""
    model = tiny_llama(5, vocab_size=64)
    return Deployment(model, DraftModelDrafter(model), max_draft_len)


def test_request_progress_turns_cumulative_stats_into_steps():
    times = iter([10.5, 10.75, 11.5])
    progress = names.RequestProgress(10.0, clock=lambda: next(times))
    first = progress.step(RequestStats(num_input_tokens=4, num_output_tokens=1))
    assert (first.draft_tokens, first.accepted, first.output_tokens, first.ttft_s, first.itl_s) == (0, 0, 1, 0.5, None)
    assert not first.drafted
    second = progress.step(RequestStats(num_output_tokens=4, total_draft_tokens=3, total_accepted_draft_tokens=2))
    assert (second.draft_tokens, second.accepted, second.output_tokens, second.ttft_s, second.itl_s) == (
        3,
        2,
        3,
        None,
        0.25,
    )
    assert second.drafted and list(second.accepted_positions) == [0, 1]
    with pytest.raises(ValueError, match="out of order"):
        progress.step(RequestStats(num_output_tokens=2))


def test_names_map_one_to_one_onto_vllm():
    assert names.VLLM_NAMES[names.NUM_ACCEPTED_PER_POS] == "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert names.VLLM_NAMES[names.INTER_TOKEN_LATENCY] == "vllm:inter_token_latency_seconds"
    assert len(set(names.VLLM_NAMES.values())) == len(names.VLLM_NAMES)
    assert {
        "specpipe:time_to_first_token_seconds_bucket",
        "specpipe:time_to_first_token_seconds_count",
        names.NUM_DRAFTS,
    } <= exported_series()
    assert "specpipe:time_to_first_token_seconds" not in exported_series()  # a histogram is its three series


def test_a_step_an_end_id_or_stop_word_ends_counts_the_drafts_before_it_only():
    """A self-drafting engine accepts all 3 drafts of its first decoding step. When the first of them is the
    end id, that token is the step's own (the target chose it there) and the drafts after it never reach the
    output: 0 accepted, not 3 (nor 1). A 2-token stop word ending at the second draft: 1 accepted. Either
    way the generated tokens (sent + the end id or stop word) are the target forwards + the accepted drafts."""
    engine = self_drafting_engine()
    prompt = [5, 9, 11, 13]
    [free] = run_batch(engine, [(prompt, SamplingParams(max_tokens=8, end_id=63))])
    assert free.stats.total_accepted_draft_tokens > 3  # every draft accepted while nothing ends it
    end = free.tokens[1]
    assert end not in free.tokens[:1]
    stop_word = tuple(free.tokens[1:3])
    [ended, stopped] = run_batch(
        engine,
        [
            (prompt, SamplingParams(max_tokens=8, end_id=end)),
            (prompt, SamplingParams(max_tokens=8, end_id=63, stop_words=(stop_word,))),
        ],
    )
    for run, accepted, stopping in ((ended, 0, 1), (stopped, 1, 2)):
        assert run.tokens == free.tokens[:1] and run.reason == "stop"
        assert run.stats.target_forwards == 2 and run.stats.total_draft_tokens == 3
        assert run.stats.total_accepted_draft_tokens == accepted
        assert run.stats.num_generated_tokens == 1 + stopping == run.stats.target_forwards + accepted
    assert (
        free.stats.num_generated_tokens
        == len(free.tokens)
        == free.stats.target_forwards + free.stats.total_accepted_draft_tokens
    )


@pytest.fixture
def served(monkeypatch, single_thread):
    """The CPU model's ``execute`` on a self-drafting engine, with the metrics ``initialize`` wires up."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FAKE_PB)
    FakeMetricFamily.values = {}
    instance = TritonPythonModel()
    instance.exclude_input_default, instance.stops, instance.metrics = True, StopRequests(), SchedulerMetrics("tiny")
    instance.worker = RequestWorker(
        load=lambda: scheduler_for(self_drafting_engine(), max_batch_size=2),
        on_step=instance.metrics.update,
        track=instance.metrics.track,
    )
    yield instance
    instance.worker.close()


def value(name, **labels):
    return FakeMetricFamily.values.get((name, tuple(sorted({"model_name": "tiny", **labels}.items()))), 0.0)


def test_served_requests_give_consistent_speculative_series(served):
    requests = [generate_request(f"r{i}", [5 + i, 9, 11, 13], 6 + 3 * i) for i in range(3)]
    served.execute(requests)
    wait_for(lambda: all(r.sender.done.is_set() for r in requests))
    drafts, drafted = value(names.NUM_DRAFTS), value(names.NUM_DRAFT_TOKENS)
    accepted = value(names.NUM_ACCEPTED_TOKENS)
    per_position = [value(names.NUM_ACCEPTED_PER_POS, position=str(p)) for p in range(3)]
    assert drafts > 0 and 0 < accepted <= drafted <= 3 * drafts
    assert sum(per_position) == accepted
    assert drafts >= per_position[0] >= per_position[1] >= per_position[2] > 0
    assert value(names.NUM_ACCEPTED_PER_POS, position="3") == 0.0  # max_draft_len 3: positions 0..2
    assert value(names.GENERATION_TOKENS) == sum(len(r.sender.tokens()) for r in requests) == 6 + 9 + 12
    assert value(names.PROMPT_TOKENS) == 12
    ttft, itl = value(names.TIME_TO_FIRST_TOKEN), value(names.INTER_TOKEN_LATENCY)
    assert len(ttft) == len(requests) and all(t > 0 for t in ttft)
    responses = sum(len(r.sender.sent) for r in requests)  # streamed: one response per step
    assert len(itl) == responses - len(requests) and all(t > 0 for t in itl)
    assert value(names.REQUESTS_RUNNING) == 0.0 and value(names.REQUESTS_WAITING) == 0.0


def test_gateway_exports_the_vllm_named_counters():
    from specpipe.openai.metrics import EXPORTED_SERIES, GatewayMetrics

    metrics = GatewayMetrics()
    metrics.record(
        "m", {"num_output_tokens": 5, "num_input_tokens": 3, "total_draft_tokens": 8, "total_accepted_draft_tokens": 2}
    )
    metrics.record(
        "m", {"num_output_tokens": 1, "num_input_tokens": 2, "total_draft_tokens": 0, "total_accepted_draft_tokens": 0}
    )
    text = metrics.render().decode()
    assert 'specpipe:spec_decode_num_draft_tokens_total{model_name="m"} 8.0' in text
    assert 'specpipe:spec_decode_num_accepted_tokens_total{model_name="m"} 2.0' in text
    assert 'specpipe:generation_tokens_total{model_name="m"} 6.0' in text
    assert 'specpipe:prompt_tokens_total{model_name="m"} 5.0' in text
    assert 'specpipe_accepted_draft_tokens_total{model="m"} 2.0' in text  # the older series stay
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert exposed == EXPORTED_SERIES
