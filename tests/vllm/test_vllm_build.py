"""``specpipe build --runtime vllm``: one plan per method (the speculative config and the vllm serve argv,
both checked against vLLM's definitions), the refusals naming the nearest choice, and the engine
directory a build writes."""

import json
import re

import pytest
from click.testing import CliRunner

from specpipe.cli import main
from specpipe.manifest import read_manifest
from specpipe.speculative import Runtime
from specpipe.vllm import release
from specpipe.vllm.flagcheck import parse_serve_argv

GPU = ["--gpu", "h100-80gb", "--gpus", "8"]


@pytest.fixture
def build(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engines = tmp_path / "engines"

    def invoke(*args, dry=True):
        argv = ["build", "--runtime", "vllm", "--engines-dir", str(engines), *GPU, *args]
        result = CliRunner().invoke(main, argv + (["--dry-run", "--json"] if dry else []))
        return result, engines

    return invoke


def plan_of(build, *args) -> dict:
    result, _ = build(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eagle_heads_of_the_preset_become_an_eagle_chain(build):
    plan = plan_of(build, "--target", "llama3-8b", "--draft", "eagle")
    assert plan["speculative_config"] == {
        "method": "eagle",
        "num_speculative_tokens": 3,
        "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
        "revision": "main",
    }
    parsed = parse_serve_argv(plan["command"])
    assert parsed["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert parsed["--speculative-config"] == plan["speculative_config"]
    assert (parsed["--tensor-parallel-size"], parsed["--pipeline-parallel-size"]) == (1, 1)
    assert (parsed["--max-model-len"], parsed["--max-num-seqs"], parsed["--dtype"]) == (8192, 8, "bfloat16")
    assert "--quantization" not in parsed
    assert plan["release"] == {"vllm": release.VLLM_VERSION, "image": release.IMAGE, "wheel": release.WHEEL}


def test_an_eagle3_head_is_vllm_s_eagle3_and_max_draft_len_is_the_chain(build):
    plan = plan_of(build, "--target", "llama3.1-8b", "--draft", "eagle", "--max-draft-len", "5")
    assert plan["speculative_config"]["method"] == "eagle3"
    assert plan["speculative_config"]["num_speculative_tokens"] == 5
    assert plan["speculative_config"]["model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def test_ngram_lookup_sizes_come_from_the_preset(build):
    plan = plan_of(build, "--target", "llama3-8b", "--draft", "ngram")
    assert plan["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    assert "model" not in plan["speculative_config"]


def test_a_draft_model_runs_at_the_target_s_tp_with_online_fp8(build):
    plan = plan_of(build, "--target", "llama3.1-70b", "--draft", "llama3.2-1b", "-q", "fp8", "--tp", "4")
    assert plan["speculative_config"] == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "revision": "main",
        "draft_tensor_parallel_size": 4,
    }
    parsed = parse_serve_argv(plan["command"])
    assert parsed["--quantization"] == "fp8" and parsed["--tensor-parallel-size"] == 4
    assert plan["quantization"] == "fp8"


def test_int8_weight_only_is_vllm_s_online_shorthand(build):
    plan = plan_of(build, "--target", "llama3-8b", "-q", "int8-wo")
    assert parse_serve_argv(plan["command"])["--quantization"] == "int8_per_channel_weight_only"


def test_plain_decoding_has_no_speculative_config_and_auto_tp_fits_the_gpu(build):
    plan = plan_of(build, "--target", "llama3-70b")
    assert plan["speculative_config"] is None
    assert "--speculative-config" not in plan["command"]
    assert plan["parallel"]["tp"] == 4 and plan["parallel"]["chosen"] == "auto"
    assert [o["tp"] for o in plan["parallel"]["tried"]] == [1, 2, 4]  # the smallest TP that fits, as on TensorRT-LLM
    assert parse_serve_argv(plan["command"])["--tensor-parallel-size"] == 4


def test_pipeline_parallelism_is_allowed_with_eagle(build):
    plan = plan_of(build, "--target", "llama3-70b", "--draft", "eagle", "--tp", "2", "--pp", "2")
    parsed = parse_serve_argv(plan["command"])
    assert (parsed["--tensor-parallel-size"], parsed["--pipeline-parallel-size"]) == (2, 2)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--draft", "medusa"],
            "has no vLLM 0.34.0 speculative method .*use --draft eagle .* with --runtime vllm, or "
            "--runtime cpu or --runtime trtllm",
        ),
        (["--draft", "lookahead"], "use --draft ngram .* with --runtime vllm, or --runtime trtllm"),
        (["-q", "int4-awq"], "already quantized with AWQ.*use --quantization fp8 or int8-wo"),
        (["-q", "int4-wo"], "use --quantization int8-wo"),
        (["--draft", "eagle", "--choices", "[[0],[1]]"], "no token tree"),
        (["--draft", "ngram", "--lookahead", "4,4,4"], "no lookahead decoding"),
        (["--max-draft-len", "3"], "no meaning with --draft none"),
        (["--tp", "3"], "does not divide the 32 attention heads"),
        (["--max-seq-len", "16384"], "exceeds target llama3-8b's 8192 positions"),
    ],
)
def test_what_vllm_cannot_run_is_refused_before_anything_is_written(build, args, message):
    result, engines = build("--target", "llama3-8b", *args)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert re.search(message, result.stderr), result.stderr
    assert not engines.exists()


def test_a_plan_that_does_not_fit_the_gpu_is_printed_then_refused(build):
    result, _ = build("--target", "llama3-70b", "--tp", "1", "--gpu", "l4-24gb")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["error"].startswith("the plan needs")
    assert "usable" in result.stderr


def test_a_build_writes_the_manifest_with_the_command_and_skips_an_unchanged_rebuild(build):
    result, engines = build("--target", "llama3-8b", "--draft", "ngram", dry=False)
    assert result.exit_code == 0, result.output
    manifest = read_manifest(engines / "llama3-8b-ngram")
    assert manifest.runtime is Runtime.VLLM
    assert manifest.vllm["image"] == release.IMAGE
    command = manifest.vllm["command"]
    assert parse_serve_argv(command)["--speculative-config"] == manifest.vllm["speculative_config"]
    assert manifest.speculative.max_draft_len == 5 and manifest.speculative.max_matching_ngram_size == 3
    assert sorted(p.name for p in (engines / "llama3-8b-ngram").iterdir()) == ["manifest.json"]
    again, _ = build("--target", "llama3-8b", "--draft", "ngram", dry=False)
    assert again.exit_code == 0 and "up to date" in again.stderr
    package = CliRunner().invoke(
        main, ["package", "llama3-8b-ngram", "--engines-dir", str(engines), "--repo-dir", str(engines.parent / "repo")]
    )
    assert package.exit_code == 1 and "without a Triton repository" in package.stderr
    assert "specpipe serve llama3-8b-ngram --runtime vllm" in package.stderr
    assert not (engines.parent / "repo").exists()


def test_parallelism_is_a_check_as_on_tensorrt_llm(tmp_path, monkeypatch):
    """Without a GPU the sizes are marked not checked with what auto picks on common GPUs; sizes beyond the
    GPUs at hand are a warning; fitted ones are ok."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi

    def parallelism(*args):
        argv = [
            *"build --runtime vllm --engines-dir".split(),
            str(tmp_path / "e"),
            *"--target llama3-70b --draft eagle --dry-run --json".split(),
            *args,
        ]
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 0, result.output
        return next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "parallelism")

    unknown = parallelism()
    assert unknown["status"] == "not checked"
    assert "with --gpu h100-80gb: TP 4 x PP 1; h200-141gb: TP 2 x PP 1" in unknown["detail"]
    assert parallelism("--gpu", "h100-80gb", "--gpus", "8")["status"] == "ok"
    beyond = parallelism("--gpu", "h100-80gb", "--gpus", "2", "--tp", "4")
    assert beyond["status"] == "warning" and "needs 4 GPUs, 2 available" in beyond["detail"]
