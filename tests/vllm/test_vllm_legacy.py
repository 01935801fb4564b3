"""``specpipe build --from-vllm-args``: a guide's old-style vllm serve line becomes the current spec, one
line per flag saying what it became; every old flag of the issue is covered."""

import json

import pytest
from click.testing import CliRunner

from specpipe.cli import main
from specpipe.vllm.flagcheck import load_table, parse_serve_argv
from specpipe.vllm.legacy import OLD_FLAGS, LegacyArgsError, translate

MODEL = "vllm serve meta-llama/Meta-Llama-3-8B-Instruct"


def change(translation, flag: str) -> str:
    lines = [line for line in translation.changes if line.startswith(flag + ":")]
    assert len(lines) == 1, translation.changes
    return lines[0]


def test_every_old_flag_is_gone_from_the_pinned_vllm():
    assert not set(OLD_FLAGS) & set(load_table()["flags"])


def test_the_model_becomes_the_target_preset_and_the_runtime_vllm():
    t = translate(MODEL)
    assert t.options == {"runtime": "vllm", "target": "llama3-8b"}
    assert t.changes == ["meta-llama/Meta-Llama-3-8B-Instruct: --target llama3-8b"]
    assert (
        translate("python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct").options[
            "target"
        ]
        == "llama3.1-8b"
    )


@pytest.mark.parametrize(
    "model, draft, draft_model",
    [
        ("[ngram]", "ngram", None),
        ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle", None),  # the preset's head for this target
        ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),  # another target's
        ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b", None),  # a draft-model preset
        ("someone/own-draft", "none", "someone/own-draft"),  # method from its config at build time
    ],
)
def test_speculative_model_becomes_a_draft(model, draft, draft_model):
    t = translate(f"{MODEL} --speculative-model {model}")
    assert t.options.get("draft") == draft and t.options.get("draft_model") == draft_model
    assert change(t, "--speculative-model").startswith(
        "--speculative-model: speculative_config.model -> --draft " + draft
    )


def test_num_speculative_tokens_becomes_max_draft_len():
    t = translate(f"{MODEL} --speculative-model [ngram] --num-speculative-tokens 6")
    assert t.options["max_draft_len"] == 6
    assert change(t, "--num-speculative-tokens") == (
        "--num-speculative-tokens: speculative_config.num_speculative_tokens -> --max-draft-len 6"
    )


@pytest.mark.parametrize("flag", ["--speculative-draft-tensor-parallel-size", "--draft-model-tp-size"])
def test_the_draft_tp_flags_are_the_draft_tensor_parallel_size_field(flag):
    t = translate(f"{MODEL} --speculative-model [ngram] {flag} 1")
    assert "speculative_config.draft_tensor_parallel_size" in change(t, flag)
    assert "tp" not in t.options


def test_target_model_tp_size_becomes_tp():
    t = translate(f"{MODEL} --target-model-tp-size 2")
    assert t.options["tp"] == 2
    assert change(t, "--target-model-tp-size") == "--target-model-tp-size: --tensor-parallel-size -> --tp 2"


def test_use_v2_block_manager_is_dropped_as_removed():
    t = translate(f"{MODEL} --use-v2-block-manager --max-model-len 4096")
    assert change(t, "--use-v2-block-manager") == (
        "--use-v2-block-manager: removed: block manager v2 is the only one: dropped"
    )
    assert t.options["max_seq_len"] == 4096  # the switch took no value


def test_ngram_lookup_sizes_reach_the_speculative_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = f"{MODEL} --speculative-model [ngram] --ngram-prompt-lookup-max 4 --ngram-prompt-lookup-min 2"
    t = translate(line)
    assert t.options["ngram_lookup"] == (4, 2)
    assert (
        change(t, "--ngram-prompt-lookup-max") == "--ngram-prompt-lookup-max: speculative_config.prompt_lookup_max = 4"
    )
    assert (
        change(t, "--ngram-prompt-lookup-min") == "--ngram-prompt-lookup-min: speculative_config.prompt_lookup_min = 2"
    )
    result = CliRunner().invoke(
        main, ["build", "--from-vllm-args", line, "--engines-dir", str(tmp_path), "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["speculative_config"]
    assert (config["prompt_lookup_max"], config["prompt_lookup_min"]) == (4, 2)
    assert "from vllm args: --ngram-prompt-lookup-max: speculative_config.prompt_lookup_max = 4" in result.stderr
    with pytest.raises(LegacyArgsError, match="without an n-gram draft"):
        translate(f"{MODEL} --ngram-prompt-lookup-max 4")


def test_the_acceptance_method_rejection_sampler_is_the_default_and_typical_is_refused():
    t = translate(f"{MODEL} --spec-decoding-acceptance-method rejection_sampler")
    assert "rejection_sample_method standard" in change(t, "--spec-decoding-acceptance-method")
    with pytest.raises(LegacyArgsError, match="no typical acceptance .*standard, synthetic, block, fly"):
        translate(f"{MODEL} --spec-decoding-acceptance-method typical_acceptance_sampler")


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--speculative-max-model-len", "2048"),
        ("--speculative-disable-by-batch-size", "4"),
        ("--speculative-disable-mqa-scorer", None),
        ("--speculative-model-quantization", "fp8"),
        ("--typical-acceptance-sampler-posterior-threshold", "0.1"),
    ],
)
def test_the_other_old_flags_are_dropped_with_a_line(flag, value):
    t = translate(f"{MODEL} {flag}" + (f" {value}" if value else "") + " --max-num-seqs 16")
    assert change(t, flag).endswith("dropped")
    assert t.options["max_batch_size"] == 16


def test_current_flags_are_read_or_listed_as_not_translated():
    t = translate(
        f"{MODEL} -tp 2 -pp 2 -q fp8 --max-model-len 4096 --max-num-seqs 4 --gpu-memory-utilization 0.8 "
        '--speculative-config \'{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
        '"num_speculative_tokens": 4}\''
    )
    assert {
        k: t.options[k] for k in ("tp", "pp", "quantization", "max_seq_len", "max_batch_size", "draft", "max_draft_len")
    } == {
        "tp": 2,
        "pp": 2,
        "quantization": "fp8",
        "max_seq_len": 4096,
        "max_batch_size": 4,
        "draft": "eagle",
        "max_draft_len": 4,
    }
    assert "not translated" in change(t, "--gpu-memory-utilization")


@pytest.mark.parametrize(
    "line, message",
    [
        ("vllm serve", "has no model"),
        (f"{MODEL} --speculative-modle x", "neither a vLLM 0.34.0 flag"),
        (f"{MODEL} --num-speculative-tokens five", "takes an integer"),
        (f"{MODEL} --num-speculative-tokens", "needs a value"),
        ("vllm serve someone/unknown-model", "no target preset"),
        (f"{MODEL} -q awq", "online quantizations only"),
    ],
)
def test_lines_that_cannot_be_a_spec_are_refused(line, message):
    with pytest.raises(LegacyArgsError, match=message):
        translate(line)


def test_the_cli_prints_one_line_per_flag_and_plans_the_current_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = (
        f"{MODEL} --speculative-model yuhuili/EAGLE-LLaMA3-Instruct-8B --num-speculative-tokens 5 "
        "--use-v2-block-manager --target-model-tp-size 2 --draft-model-tp-size 2"
    )
    result = CliRunner().invoke(
        main,
        [
            "build",
            "--from-vllm-args",
            line,
            "--engines-dir",
            str(tmp_path),
            "--gpu",
            "h100-80gb",
            "--max-batch-size",
            "4",
            "--dry-run",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sum(line.startswith("from vllm args: ") for line in result.stderr.splitlines()) == 6
    parsed = parse_serve_argv(json.loads(result.stdout)["command"])
    assert parsed["--tensor-parallel-size"] == 2 and parsed["--max-num-seqs"] == 4  # the CLI's option wins
    assert parsed["--speculative-config"] == {
        "method": "eagle",
        "num_speculative_tokens": 5,
        "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
        "revision": "main",
    }
    refused = CliRunner().invoke(main, ["build", "--from-vllm-args", line, "--runtime", "trtllm", "--dry-run"])
    assert refused.exit_code == 2 and "plans for vLLM" in refused.stderr
