"""`specpipe build --runtime trtllm --dry-run`: the headline command offline and without torch, JSON mode, bad input."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specpipe.cli import main

HEADLINE = "build --target llama3-70b --draft eagle --gpu h100-80gb --tp 2 --runtime trtllm --dry-run".split()


def test_headline_dry_run_prints_plan_and_memory_table_offline(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", *HEADLINE, "--engines-dir", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        env=env,
    )
    out = proc.stdout
    assert "python3 /app/examples/eagle/convert_checkpoint.py" in out and "--num_eagle_layers 4" in out
    assert "trtllm-build --checkpoint_dir" in out and "--speculative_decoding_mode eagle --max_draft_len 63" in out
    assert "hf download yuhuili/EAGLE-LLaMA3-Instruct-70B" in out
    assert "memory per GPU (2 GPUs, bf16)" in out and "target KV cache" in out and "DOES NOT FIT" in out
    # 70B at 16 bits over two 80 GB GPUs plus four EAGLE nets: refused, with the fix.
    assert proc.returncode == 1 and "try --tp 4" in proc.stderr
    assert not (tmp_path / "e").exists()


def test_dry_run_imports_no_torch_or_transformers():
    code = (
        "import sys; from specpipe.cli import main\n"
        "try:\n    main(['build','--target','llama3-8b','--draft','eagle','--runtime','trtllm','--dry-run','--json'])\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in ('torch','transformers','huggingface_hub','tokenizers') if m in sys.modules), file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )
    assert proc.stderr.strip().splitlines()[-1] == "[]"


def test_json_is_one_document_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            *"build --target llama3.1-8b --draft llama3.2-1b --gpu h200-141gb -q fp8 --tp 2 --runtime trtllm --dry-run --json --engines-dir".split(),
            str(tmp_path / "e"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [s["name"] for s in doc["steps"]] == [
        "first-contact",
        "download-target",
        "download-draft",
        "convert-target",
        "convert-draft",
        "build-target",
        "build-draft",
    ]
    assert all(isinstance(a, str) for s in doc["steps"] for a in s["argv"])
    assert doc["steps"][-2]["argv"][0] == "trtllm-build"
    mem = doc["memory"]
    assert mem["unit"] == "bytes" and mem["fits"] is True and mem["gpu"] == "h200-141gb" and mem["gpus"] == 2
    assert mem["total"] == sum(
        mem[k]
        for k in (
            "target_weights",
            "draft_weights",
            "target_kv_cache",
            "draft_kv_cache",
            "activations",
            "runtime_overhead",
        )
    )
    assert doc["speculative"] == {"method": "draft-model", "max_draft_len": 4, "flavour": "causal-lm"}
    assert doc["release"]["tensorrt_llm"] == "1.2.1"
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "lama3-8b", "--draft", "eagle"], "did you mean 'llama3-8b'"),
        (["--target", "llama3-8b", "--draft", "eagel"], "did you mean 'eagle'"),
        (["--target", "llama3-8b", "--draft", "eagle", "--gpu", "rtx9090"], "unknown GPU 'rtx9090'"),
        (
            ["--target", "llama3-8b", "--draft", "eagle", "--tp", "3"],
            "--tp 3 does not divide the 32 attention heads of llama3-8b",
        ),
        (["--target", "llama3-8b", "--draft", "eagle", "--pp", "2"], "--pp 2 with eagle on --runtime trtllm"),
        (
            ["--target", "llama3.1-8b", "--draft", "ngram", "--pp", "2", "--runtime", "trtllm-llmapi"],
            "--pp 2 with ngram on --runtime trtllm-llmapi: the LLM API's PyExecutor raises NotImplementedError",
        ),
        (
            ["--target", "llama3.1-8b", "--draft", "llama3.2-1b", "--pp", "2", "--runtime", "trtllm-llmapi"],
            "use --pp 1 and raise --tp instead",
        ),
        (
            ["--target", "llama3.1-8b", "--draft", "eagle", "--pp", "2", "--runtime", "trtllm-llmapi"],
            "--pp 2 with eagle on --runtime trtllm-llmapi: EAGLE-3 does not support pipeline parallelism",
        ),
        (
            ["--target", "llama3-8b", "--draft", "eagle", "--choices", "[[0], [1], [2]]", "--max-draft-len", "2"],
            "tree has 3 nodes, max_draft_len is 2",
        ),
        (["--target", "llama3-8b", "--draft", "eagle", "--max-batch-size", "1024"], "EAGLE's limit of 512"),
        (["--target", "llama3-8b", "--draft", "llama3-8b"], "was made for llama3-70b"),
        (
            ["--target", "llama3-8b", "--draft", "lookahead", "--max-seq-len", "16384"],
            "exceeds target llama3-8b's 8192 positions",
        ),
        (["--target", "llama3-8b", "--draft", "smollm2-draft"], "was made for smollm2-135m"),
        (
            ["--target", "llama3-8b", "--draft", "lookahead", "-q", "int8-wo", "--gpu", "b200"],
            "not supported by TensorRT-LLM's engine flow",
        ),
        (["--target", "llama3-8b", "--draft", "none", "-q", "int4-awq", "--gpu", "b200"], "fails on SM 100"),
        (
            ["--target", "llama3-8b", "--draft", "llama3.2-1b", "--runtime", "trtllm-llmapi", "-q", "fp8"],
            "trtllm-llmapi",
        ),
        (
            ["--target", "llama3-8b", "--draft", "lookahead", "--runtime", "trtllm-llmapi"],
            "runs only on the TensorRT engine flow",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    argv = ["build", *args, "--dry-run", "--engines-dir", str(tmp_path / "e")]
    if "--runtime" not in args:
        argv += ["--runtime", "trtllm"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1, result.stdout + result.stderr
    assert message in result.stderr and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and not (tmp_path / "e").exists()
