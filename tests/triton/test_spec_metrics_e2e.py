"""A served CPU deployment (real Triton, tiny n-gram engine) shows the vLLM-named speculative series on its
metrics port, consistent with what its requests' perf outputs said."""

import urllib.request

import pytest
from loopback import free_port
from prometheus_client.parser import text_string_to_metric_families
from tiny_engine import make_tiny_engine

from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.generation import spec_metrics as names
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e

#: Repetitive prompts, so that the n-gram drafter drafts; streamed and not.
REQUESTS = [
    ("1 2 3 4 1 2 3 4 1 2 3 4", True),
    ("a b a b a b a b", False),
    ("The quick brown fox", True),
    ("x y z x y z x y z", False),
]


def _samples(url):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return [
        s for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith("specpipe:")
    ]


def _value(samples, name, **labels):
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


def test_served_requests_show_consistent_speculative_series(tmp_path):
    engine = make_tiny_engine(tmp_path / "engines", "tiny", method="ngram", max_draft_len=3)
    repo = package_engine(engine, tmp_path / "repo" / "tiny")
    server = LocalTritonServer(
        repo, free_port(), free_port(), free_port(), log_path=tmp_path / "triton.log", ready_timeout_s=300
    )
    server.start()
    try:
        server.wait_ready(300)

        async def go():
            async with LLMClient(server.grpc_url) as client:
                return [
                    await client.generate(GenerationRequest(prompt, max_tokens=16, stream=stream))
                    for prompt, stream in REQUESTS
                ]

        results = run_sync(go())
        assert all(r.error is None for r in results)
        samples = _samples(server.metrics_url)
    finally:
        server.stop()
    model = {names.MODEL_LABEL: "tiny"}
    drafts, drafted = _value(samples, names.NUM_DRAFTS, **model), _value(samples, names.NUM_DRAFT_TOKENS, **model)
    accepted = _value(samples, names.NUM_ACCEPTED_TOKENS, **model)
    assert drafted == sum(r.perf["total_draft_tokens"] for r in results) > 0
    assert accepted == sum(r.perf["total_accepted_draft_tokens"] for r in results)
    assert drafts <= drafted <= 3 * drafts and accepted <= drafted
    positions = {int(s.labels["position"]): s.value for s in samples if s.name == names.NUM_ACCEPTED_PER_POS}
    assert sum(positions.values()) == accepted and set(positions) <= {0, 1, 2}
    ordered = [drafts] + [positions.get(p, 0.0) for p in range(3)]
    assert ordered == sorted(ordered, reverse=True)
    assert _value(samples, names.GENERATION_TOKENS, **model) == sum(r.perf["num_output_tokens"] for r in results)
    assert _value(samples, names.PROMPT_TOKENS, **model) == sum(r.perf["num_input_tokens"] for r in results)
    ttft_count = _value(samples, names.TIME_TO_FIRST_TOKEN + "_count", **model)
    assert ttft_count == len(REQUESTS)
    buckets = [s for s in samples if s.name == names.TIME_TO_FIRST_TOKEN + "_bucket"]
    assert [float(s.labels["le"]) for s in buckets] == [*names.TTFT_BUCKETS, float("inf")]
    assert buckets[-1].value == ttft_count and [s.value for s in buckets] == sorted(s.value for s in buckets)
    assert _value(samples, names.TIME_TO_FIRST_TOKEN + "_sum", **model) > 0
    assert _value(samples, names.INTER_TOKEN_LATENCY + "_count", **model) > 0
    assert _value(samples, names.REQUESTS_WAITING, **model) == 0.0
