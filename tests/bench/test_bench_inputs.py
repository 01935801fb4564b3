"""``specpipe bench`` inputs: prompt sets, deployment URLs, load settings, Prometheus parsing, SSE parsing."""

import asyncio
import json

import pytest
from click.testing import CliRunner

from specpipe.bench.endpoints import parse_endpoint, parse_endpoints
from specpipe.bench.load import counter_delta
from specpipe.bench.metrics import memory_used, parse_samples, spec_counters
from specpipe.bench.openai_backend import _sse_events
from specpipe.bench.prompts import BUILTIN_SETS, builtin_path, load_prompts, parse_prompts
from specpipe.bench.runner import BenchSettings
from specpipe.cli import main
from specpipe.errors import SpecpipeError


@pytest.mark.parametrize("name", BUILTIN_SETS)
def test_builtin_sets_ship_in_the_package(name):
    prompts, label = load_prompts(name)
    assert label == name and len(prompts) >= 20
    assert len({p.id for p in prompts}) == len(prompts) and all(p.id.startswith(f"{name}-") for p in prompts)
    assert all(len(p.text.split()) >= 5 for p in prompts)
    assert "specpipe" in (builtin_path(name).parent / "SOURCES.md").read_text()


def test_summarize_prompts_carry_their_passage():
    prompts, _ = load_prompts("summarize")
    assert all(p.text.startswith("Summarize the following passage") and len(p.text.split()) > 60 for p in prompts)


def test_prompts_file(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a b c", "id": "x"}\n\n{"prompt": "d"}\n')
    prompts, label = load_prompts(str(good))
    assert [(p.id, p.text) for p in prompts] == [("x", "a b c"), ("3", "d")] and label == str(good)
    with pytest.raises(SpecpipeError, match="line 2 is not valid JSON"):
        parse_prompts(['{"prompt": "a"}', "{oops"], "f")
    with pytest.raises(SpecpipeError, match='line 1 has no non-empty string "prompt"'):
        parse_prompts(['{"text": "a"}'], "f")
    with pytest.raises(SpecpipeError, match='line 1 has no non-empty string "prompt"'):
        parse_prompts(['{"prompt": "  "}'], "f")
    with pytest.raises(SpecpipeError, match="line 1 is not a JSON object"):
        parse_prompts(['["a list"]'], "f")
    with pytest.raises(SpecpipeError, match="holds no prompt"):
        parse_prompts(["", "  "], "prompts file e.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SpecpipeError, match="empty.jsonl holds no prompt"):
        load_prompts(str(tmp_path / "empty.jsonl"))
    with pytest.raises(SpecpipeError, match="neither a built-in set"):
        load_prompts(str(tmp_path / "missing.jsonl"))


def test_triton_and_openai_urls():
    triton = parse_endpoint("baseline=localhost:8001")
    assert (triton.kind, triton.address, triton.model, triton.metrics_url) == (
        "triton",
        "localhost:8001",
        "ensemble",
        "http://localhost:8002/metrics",
    )
    vllm = parse_endpoint("vllm=openai://gpu-box:8000/v1?model=meta/llama&chat=1")
    assert (vllm.kind, vllm.address, vllm.model, vllm.chat, vllm.metrics_url) == (
        "openai",
        "http://gpu-box:8000/v1",
        "meta/llama",
        True,
        "http://gpu-box:8000/metrics",
    )
    tls = parse_endpoint("t=openai+https://api.example:443")
    assert tls.address == "https://api.example:443/v1" and tls.model is None and not tls.chat
    for bad, message in (
        ("localhost:8001", "must be NAME=HOST:PORT"),
        ("a=localhost", "is not HOST:PORT"),
        ("a=http://h:1", "use HOST:PORT for Triton"),
        ("a b=h:1", "must be letters"),
        ("a=openai://h/v1", "give the host and port"),
    ):
        with pytest.raises(SpecpipeError, match=message):
            parse_endpoint(bad)


def test_endpoint_list_and_metrics_overrides():
    endpoints = parse_endpoints(["a=h:9001", "b=h:9011"], ["b=http://m:1/metrics", "a=none"])
    assert [e.metrics_url for e in endpoints] == [None, "http://m:1/metrics"]
    with pytest.raises(SpecpipeError, match="given twice"):
        parse_endpoints(["a=h:1", "a=h:2"])
    with pytest.raises(SpecpipeError, match="for a NAME given with --url"):
        parse_endpoints(["a=h:1"], ["z=http://m/metrics"])
    with pytest.raises(SpecpipeError, match="no deployment to benchmark"):
        parse_endpoints([])


def test_concurrency_list_keeps_order_and_drops_duplicates():
    from specpipe.cli.options import PositiveIntList

    assert PositiveIntList().convert("1,2,2, 4", None, None) == (1, 2, 4)
    settings = BenchSettings(prompts="chat", concurrencies=(1, 8))
    assert settings.requests_for(1) == 8 and settings.requests_for(8) == 32
    assert BenchSettings(prompts="chat", concurrencies=(1,), duration_s=5.0).requests_for(1) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "0"], "must list positive integers"),
        (["--concurrency", "1,0"], "must list positive integers"),
        (["--concurrency", "x"], "must list positive integers"),
        (["--concurrency", "2,-1"], "must list positive integers"),
        (["--concurrency", ""], "must list positive integers"),
        (["--max-tokens", "0"], "must be a positive integer, got 0"),
        (["--num-requests", "2", "--duration", "1"], "not both"),
        (["--num-requests", "0"], "'--num-requests': must be a positive integer"),
        (["--duration", "-1"], "--duration"),
        (["--warmup", "-1"], "--warmup"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_bad_bench_settings_are_usage_errors_before_any_request(args, message):
    result = CliRunner().invoke(main, ["bench", "--url", "baseline=localhost:1", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


TRITON_METRICS = """# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 2500
# HELP nv_cpu_memory_used_bytes CPU memory used, in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 77
"""


def test_memory_prefers_gpu_then_cpu():
    assert memory_used(parse_samples(TRITON_METRICS)) == (3500.0, "gpu")
    cpu_only = "\n".join(line for line in TRITON_METRICS.splitlines() if "gpu" not in line) + "\n"
    assert memory_used(parse_samples(cpu_only)) == (77.0, "cpu")
    assert memory_used(parse_samples("# TYPE x counter\nx_total 1\n")) is None


def test_speculative_counters_from_gateway_and_vllm():
    gateway = (
        'specpipe_draft_tokens_total{model="a"} 10\nspecpipe_draft_tokens_total{model="b"} 99\n'
        'specpipe_accepted_draft_tokens_total{model="a"} 4\nspecpipe_output_tokens_total{model="a"} 30\n'
        'specpipe_requests_total{model="a"} 3\n'
    )
    assert spec_counters(parse_samples(gateway), "a") == {
        "source": "specpipe",
        "draft_tokens": 10.0,
        "accepted_draft_tokens": 4.0,
        "output_tokens": 30.0,
        "requests": 3.0,
        "drafts": None,
        "accepted_per_position": {},
    }
    vllm = 'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30\nvllm:spec_decode_num_accepted_tokens_total{engine="0"} 12\n'
    found = spec_counters(parse_samples(vllm), "any-model")
    assert (found["source"], found["draft_tokens"], found["accepted_draft_tokens"], found["output_tokens"]) == (
        "vllm",
        30.0,
        12.0,
        None,
    )
    assert spec_counters(parse_samples(TRITON_METRICS)) is None
    before = {
        "source": "vllm",
        "draft_tokens": 30.0,
        "accepted_draft_tokens": 12.0,
        "output_tokens": None,
        "requests": None,
    }
    after = {**before, "draft_tokens": 50.0, "accepted_draft_tokens": 20.0}
    delta = counter_delta(before, after)
    assert (delta.draft_tokens, delta.accepted_draft_tokens, delta.output_tokens) == (20.0, 8.0, None)
    assert counter_delta(None, after) is None


def test_server_sent_events_are_split_per_event():
    async def lines():
        for line in (b": comment\n", b'data: {"a": 1}\n', b"\n", b"data:[DONE]\n", b"\n", b"data: x\n", b"data: y\n"):
            yield line

    async def collect():
        return [event async for event in _sse_events(lines())]

    events = asyncio.run(collect())
    assert events == ['{"a": 1}', "[DONE]", "x\ny"]
    assert json.loads(events[0]) == {"a": 1}


def test_a_zero_memory_gauge_counts_as_not_yet_measured():
    assert memory_used(parse_samples("nv_cpu_memory_used_bytes 0\n")) is None
    assert memory_used(parse_samples('nv_gpu_memory_used_bytes{gpu_uuid="a"} 0\nnv_cpu_memory_used_bytes 5\n')) == (
        5.0,
        "cpu",
    )


def test_optional_flags_are_sent_only_when_asked():
    from specpipe.client.request import GenerationRequest, build_inputs

    names = lambda request: [t.name() for t in build_inputs(request, batched=True)]  # noqa: E731
    assert "return_perf_metrics" in names(GenerationRequest("x")) and "return_num_output_tokens" not in names(
        GenerationRequest("x")
    )
    assert "return_perf_metrics" not in names(GenerationRequest("x", return_perf_metrics=None))
    both = names(GenerationRequest("x", return_num_tokens=True))
    assert "return_num_input_tokens" in both and "return_num_output_tokens" in both


@pytest.mark.parametrize(
    "asked, sent",
    [
        ((None, None, None, None), (None, None, None, None)),  # nothing set: greedy
        ((0.0, 5, 0.9, 1), (None, None, None, None)),  # temperature 0: greedy, the rest dropped
        ((0.9, None, None, 42), (0.9, None, 1.0, 42)),  # a temperature alone samples (top_p 1.0 sent)
        ((None, 0, None, 3), (None, 0, 1.0, 3)),  # top_k 0 (all) samples at the server's temperature
        ((0.7, 4, 0.5, None), (0.7, 4, 0.5, None)),
    ],
)
def test_sampling_fields_follow_tensorrt_llms_rule(asked, sent):
    from specpipe.client.request import sampling_fields

    fields = sampling_fields(*asked)
    assert (fields["temperature"], fields["top_k"], fields["top_p"], fields["seed"]) == sent


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_tokens", 2**31, "max_tokens must be 1-2147483647"),
        ("max_tokens", 0, "max_tokens must be 1-2147483647"),
        ("seed", -1, "seed must be 0-18446744073709551615"),
        ("seed", 2**64, "seed must be 0-18446744073709551615"),
        ("top_k", 2**31, "top_k must be 0-2147483647"),
        ("end_id", -3, "end_id must be 0-2147483647"),
    ],
)
def test_values_a_tensor_cannot_hold_are_refused_not_wrapped(field, value, message):
    from specpipe.client.request import GenerationRequest, build_inputs

    with pytest.raises(SpecpipeError, match=message):
        build_inputs(GenerationRequest("x", **{field: value}), batched=True)
    edge = {"max_tokens": 2**31 - 1, "seed": 2**64 - 1, "top_k": 2**31 - 1, "end_id": 0}[field]
    tensors = {t.name(): t for t in build_inputs(GenerationRequest("x", **{field: edge}), batched=True)}
    assert field in tensors
