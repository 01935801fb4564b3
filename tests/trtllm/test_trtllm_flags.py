"""TensorRT-LLM's flag definitions as data, and the checker that holds generated commands to them."""

import json

import pytest

from specpipe.trtllm.flagcheck import FLAGS_DIR, TOOLS, InvalidCommandError, check_argv, load_tool

EX = "/app/examples"


@pytest.mark.parametrize("key", sorted(TOOLS))
def test_every_flag_table_names_its_source_and_release(key):
    data = json.loads((FLAGS_DIR / TOOLS[key]).read_text())
    assert data["release"] == "1.2.x"
    first = data["sources"][0]
    assert first["repo"] == "NVIDIA/TensorRT-LLM" and first["path"].endswith((".py",))
    assert len(first["commit"]) == 40 and int(first["commit"], 16) >= 0
    for name, spec in data["flags"].items():
        assert name.startswith("-"), name
        assert spec.get("action") == "store_true" or spec.get("type") in ("str", "int", "float"), name


def test_transcribed_facts_of_the_pinned_sources():
    build = load_tool("trtllm-build")
    assert build.flags["--speculative_decoding_mode"]["choices"] == [
        "draft_tokens_external",
        "lookahead_decoding",
        "medusa",
        "explicit_draft_tokens",
        "eagle",
    ]
    assert build.flags["--max_draft_len"] == {"type": "int", "default": 0}
    assert build.flags["--tokens_per_block"]["default"] == 32  # pydantic PluginConfig (older releases: 128)
    assert build.flags["--use_paged_context_fmha"]["default"] == "enable"
    assert "--auto_parallel" not in build.flags  # removed before 1.x
    assert build.aliases["--max_decoder_seq_len"] == "--max_seq_len"
    assert load_tool("eagle-convert").flags["--num_eagle_layers"]["default"] == 4
    assert load_tool("medusa-convert").flags["--dtype"]["choices"] == ["float32", "bfloat16", "float16"]
    assert "int4_awq" in load_tool("quantize").flags["--qformat"]["choices"]


@pytest.mark.parametrize(
    "key, argv",
    [
        # Commands printed in TensorRT-LLM's own example READMEs for this release line.
        (
            "eagle-convert",
            [
                "python3",
                f"{EX}/eagle/convert_checkpoint.py",
                "--model_dir",
                "./vicuna-7b-v1.3",
                "--eagle_model_dir",
                "EAGLE-Vicuna-7B-v1.3",
                "--output_dir",
                "./tllm_checkpoint_1gpu_eagle",
                "--dtype",
                "float16",
                "--max_draft_len",
                "63",
                "--num_eagle_layers",
                "4",
                "--max_non_leaves_per_layer",
                "10",
            ],
        ),
        (
            "trtllm-build",
            [
                "trtllm-build",
                "--checkpoint_dir",
                "./c",
                "--output_dir",
                "./e",
                "--gemm_plugin",
                "float16",
                "--use_paged_context_fmha",
                "enable",
                "--speculative_decoding_mode",
                "eagle",
                "--max_batch_size",
                "4",
            ],
        ),
        (
            "trtllm-build",
            [
                "trtllm-build",
                "--checkpoint_dir=./c",
                "--output_dir=./e",
                "--gpt_attention_plugin=float16",
                "--gemm_plugin=float16",
                "--max_batch_size=32",
                "--max_input_len=1024",
                "--max_seq_len=2048",
                "--max_beam_width=1",
                "--log_level=error",
                "--max_draft_len=83",
                "--speculative_decoding_mode=lookahead_decoding",
            ],
        ),
        (
            "quantize",
            [
                "python3",
                f"{EX}/quantization/quantize.py",
                "--model_dir",
                "/m",
                "--dtype",
                "float16",
                "--qformat",
                "fp8",
                "--kv_cache_dtype",
                "fp8",
                "--output_dir",
                "/o",
                "--calib_size",
                "512",
                "--tp_size",
                "1",
                "--medusa_model_dir",
                "/h",
                "--num_medusa_heads",
                "4",
            ],
        ),
        (
            "medusa-convert",
            [
                "python3",
                f"{EX}/medusa/convert_checkpoint.py",
                "--model_dir",
                "./vicuna-7b-v1.3",
                "--medusa_model_dir",
                "medusa-vicuna-7b-v1.3",
                "--output_dir",
                "./ck",
                "--dtype",
                "float16",
                "--num_medusa_heads",
                "4",
            ],
        ),
        (
            "llama-convert",
            [
                "python3",
                f"{EX}/models/core/llama/convert_checkpoint.py",
                "--model_dir",
                "/m",
                "--output_dir",
                "/o",
                "--dtype",
                "float16",
                "--tp_size",
                "2",
                "--use_weight_only",
                "--weight_only_precision",
                "int8",
            ],
        ),
    ],
)
def test_commands_from_tensorrt_llm_docs_pass(key, argv):
    check_argv(key, argv)


@pytest.mark.parametrize(
    "key, argv, message",
    [
        (
            "trtllm-build",
            ["trtllm-build", "--checkpoint_dir", "c", "--max_output_len", "5"],
            "unknown flag --max_output_len",
        ),
        (
            "trtllm-build",
            ["trtllm-build", "--checkpoint_dir", "c", "--speculative_decoding_mode", "ngram"],
            "not one of",
        ),
        ("trtllm-build", ["trtllm-build", "--checkpoint_dir", "c", "--max_batch_size", "four"], "takes a int"),
        ("trtllm-build", ["trtllm-build", "--checkpoint_dir", "c", "--max_batch_size"], "exactly one value"),
        ("trtllm-build", ["trtllm-build", "--checkpoint_dir", "c", "--strip_plan", "yes"], "takes no value"),
        ("trtllm-build", ["trtllm-build", "--checkpoint_dir", "c", "--workers", "2", "--workers", "4"], "given twice"),
        ("trtllm-build", ["trtllm-build", "--output_dir", "e"], "one of --checkpoint_dir, --model_config is required"),
        (
            "trtllm-build",
            ["trtllm-build", "--checkpoint_dir", "c", "--gather_context_logits", "--max_draft_len", "4"],
            "gather_context_logits",
        ),
        (
            "trtllm-build",
            [
                "trtllm-build",
                "--checkpoint_dir",
                "c",
                "--speculative_decoding_mode",
                "eagle",
                "--max_batch_size",
                "1024",
            ],
            "512",
        ),
        ("trtllm-build", ["trtllm-build", "--checkpoint_dir", "c", "--use_paged_context_fmha", "on"], "not one of"),
        ("trtllm-build", ["trtllm", "--checkpoint_dir", "c"], "must start with"),
        (
            "eagle-convert",
            [
                "python3",
                f"{EX}/eagle/convert_checkpoint.py",
                "--model_dir",
                "m",
                "--eagle_model_dir",
                "e",
                "--output_dir",
                "o",
                "--pp_size",
                "2",
            ],
            "pp_size 1",
        ),
        (
            "eagle-convert",
            ["python3", f"{EX}/eagle/convert_checkpoint.py", "--model_dir", "m", "--output_dir", "o"],
            "required flag --eagle_model_dir",
        ),
        (
            "llama-convert",
            [
                "python3",
                f"{EX}/models/core/llama/convert_checkpoint.py",
                "--model_dir",
                "m",
                "--output_dir",
                "o",
                "--use_weight_only",
                "--weight_only_precision",
                "int4_awq",
            ],
            "quantize.py",
        ),
        (
            "medusa-convert",
            [
                "python3",
                f"{EX}/medusa/convert_checkpoint.py",
                "--model_dir",
                "m",
                "--medusa_model_dir",
                "h",
                "--output_dir",
                "o",
                "--model_type",
                "mistral",
            ],
            "rejected by the script",
        ),
        (
            "quantize",
            ["python3", f"{EX}/quantization/quantize.py", "--model_dir", "m", "--output_dir", "o", "--qformat", "awq"],
            "not one of",
        ),
    ],
)
def test_defects_are_caught(key, argv, message):
    with pytest.raises(InvalidCommandError, match=message):
        check_argv(key, argv)
