"""EAGLE head preparation for TensorRT-LLM's converter (prepare-eagle-head), run for real with torch on
tiny heads, and the converter's input contract in the pre-flight (refused before anything is written)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from trtllm_fakes import causal_lm, eagle1_head, llama_config

from specpipe.build_request import BuildRequest
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.checkpoint_flavour import CheckpointFlavourError, read_safetensors_header
from specpipe.trtllm.eagle_head import EagleHeadError
from specpipe.trtllm.prepare_eagle import prepare

HIDDEN, HEADS, KV, INTER, VOCAB = 64, 4, 2, 128, 256


def head_tensors(dtype=torch.float16, bias=False, drop=()):
    """The EAGLE authors' layout (cnets1.py): fc over [embedding; feature], one decoder layer without input_layernorm."""
    hd = HIDDEN // HEADS
    shapes = {
        "embed_tokens.weight": (VOCAB, HIDDEN),
        "fc.weight": (HIDDEN, 2 * HIDDEN),
        "layers.0.self_attn.q_proj.weight": (HEADS * hd, HIDDEN),
        "layers.0.self_attn.k_proj.weight": (KV * hd, HIDDEN),
        "layers.0.self_attn.v_proj.weight": (KV * hd, HIDDEN),
        "layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * hd),
        "layers.0.mlp.gate_proj.weight": (INTER, HIDDEN),
        "layers.0.mlp.up_proj.weight": (INTER, HIDDEN),
        "layers.0.mlp.down_proj.weight": (HIDDEN, INTER),
        "layers.0.post_attention_layernorm.weight": (HIDDEN,),
    }
    if bias:
        shapes["fc.bias"] = (HIDDEN,)
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items() if k not in drop}


def write_head(directory: Path, tensors, *, fmt="bin", **config) -> Path:
    directory.mkdir(parents=True)
    cfg = llama_config(HIDDEN, 1, HEADS, KV, INTER, VOCAB, 2048, bias=False) | config
    (directory / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(tensors, directory / "pytorch_model.bin")
    else:
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


def prepare_as_the_step_does(src: Path, dst: Path) -> subprocess.CompletedProcess:
    """``python -m specpipe.trtllm.prepare_eagle SRC DST``, as the plan's host step runs it."""
    return subprocess.run(
        [sys.executable, "-m", "specpipe.trtllm.prepare_eagle", str(src), str(dst)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )


def prepared(dst: Path) -> dict:
    """What the converter's loader reads from ``dst``: its safetensors files (model_weights_loader.py @ 7eb710f)."""
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    return load_file(str(dst / "model.safetensors"))


def test_a_pickled_head_without_bias_gets_a_zero_fc_bias(tmp_path):
    original = head_tensors(torch.float16)
    src = write_head(tmp_path / "src", original, fmt="bin")
    proc = prepare_as_the_step_does(src, tmp_path / "dst")
    assert proc.returncode == 0, proc.stderr
    assert "added a zero fc.bias" in proc.stderr
    state = prepared(tmp_path / "dst")
    assert state["fc.bias"].shape == (HIDDEN,) and state["fc.bias"].dtype == torch.float16
    assert torch.count_nonzero(state["fc.bias"]) == 0
    assert all(torch.equal(state[k], v) for k, v in original.items())
    assert json.loads((tmp_path / "dst" / "config.json").read_text())["bias"] is True
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "pytorch_model.bin"]  # the download is untouched


def test_a_safetensors_head_stays_safetensors(tmp_path):
    original = head_tensors(torch.bfloat16)
    src = write_head(tmp_path / "src", original, fmt="safetensors")
    done = prepare(src, tmp_path / "dst")
    assert done["added"] == ["a zero fc.bias"] and done["dtype"] == "bfloat16"
    state = prepared(tmp_path / "dst")
    assert state["fc.bias"].dtype == torch.bfloat16 and not state["fc.bias"].any()
    assert set(state) == set(original) | {"fc.bias"}


def test_a_head_with_its_bias_keeps_it(tmp_path):
    original = head_tensors(torch.float16, bias=True)
    src = write_head(tmp_path / "src", original, fmt="safetensors", bias=True)
    assert prepare(src, tmp_path / "dst")["added"] == []
    state = prepared(tmp_path / "dst")
    assert torch.equal(state["fc.bias"], original["fc.bias"])


def test_the_zero_bias_leaves_the_head_output_unchanged():
    fc = head_tensors(torch.float32)["fc.weight"]
    x = torch.randn(3, 2 * HIDDEN, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.nn.functional.linear(x, fc), torch.nn.functional.linear(x, fc, torch.zeros(HIDDEN)))


@pytest.mark.parametrize(
    "drop, config, message",
    [
        (("fc.weight",), {}, "has no fc.weight, which TensorRT-LLM's EAGLE converter reads unconditionally"),
        (
            ("embed_tokens.weight",),
            {},
            "has no embed_tokens.weight, which TensorRT-LLM's EAGLE converter reads from the head "
            "(it does not take the target's): re-export the head with the target's embedding",
        ),
        ((), {"vocab_size": 512}, "has embed_tokens.weight [256, 64], TensorRT-LLM's EAGLE converter needs [512, 64]"),
        (("layers.0.mlp.down_proj.weight",), {}, "lacks layers.0.mlp.down_proj.weight of its 1 decoder layer"),
        (
            (),
            {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
            "has a qwen2 config, TensorRT-LLM's EAGLE converter loads",
        ),
    ],
)
def test_the_step_refuses_a_head_the_converter_would_reject_in_one_line(tmp_path, drop, config, message):
    src = write_head(tmp_path / "src", head_tensors(drop=drop), fmt="bin", **config)
    proc = prepare_as_the_step_does(src, tmp_path / "dst")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: EAGLE head ") and message in lines[0]
    assert not (tmp_path / "dst").exists()


@pytest.fixture
def target(tmp_path):
    return causal_lm(
        tmp_path / "tiny-target", hidden=HIDDEN, layers=2, heads=HEADS, kv=KV, inter=INTER, vocab=VOCAB, positions=16384
    )


def plan_for(tmp_path, target, head):
    return plan_build(
        BuildRequest(
            target=str(target),
            draft="eagle",
            draft_model=str(head),
            runtime="trtllm",
            dry_run=True,
            engines_dir=tmp_path / "engines",
            executor="docker",
            choices="[[0], [0, 0], [1]]",
        ),
        importable=lambda: False,
    )


def without(path: Path, key: str) -> Path:
    config = json.loads((path / "config.json").read_text())
    del config[key]
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: write_head(p, head_tensors(drop=("layers.0.self_attn.q_proj.weight",)), fmt="safetensors"),
            r"lacks layers\.0\.self_attn\.q_proj\.weight of its 1 decoder layer\(s\) \(config num_hidden_layers\): TensorRT-LLM's "
            r"converter would start from random weights; pass the complete head",
        ),
        (
            lambda p: write_head(
                p, head_tensors(), fmt="safetensors", model_type="mistral", architectures=["MistralForCausalLM"]
            ),
            r"has a mistral config, TensorRT-LLM's EAGLE converter loads heads as Llama .*: use an EAGLE-1/2 head with a Llama config",
        ),
        (
            lambda p: without(write_head(p, head_tensors(), fmt="safetensors"), "intermediate_size"),
            r"config\.json lacks intermediate_size, which TensorRT-LLM's EAGLE converter reads .*: add them",
        ),
        (
            lambda p: without(
                eagle1_head(p, hidden=HIDDEN, heads=HEADS, kv=KV, inter=INTER, vocab=VOCAB), "hidden_size"
            ),
            r"config\.json lacks hidden_size",
        ),
    ],
)
def test_preflight_refuses_what_the_converter_would_reject_before_anything_is_written(tmp_path, target, make, message):
    head = make(tmp_path / "head")
    with pytest.raises(EagleHeadError, match=message) as info:
        plan_for(tmp_path, target, head)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "engines").exists()


def test_preflight_reports_what_preparation_adds(tmp_path, target):
    head = write_head(tmp_path / "head", head_tensors(), fmt="safetensors")
    plan, _, _ = plan_for(tmp_path, target, head)
    check = next(c for c in plan.preflight.checks if c.name == "EAGLE head vs TensorRT-LLM's converter")
    assert (
        check.status == "ok"
        and ("adds a zero fc.bias, max_position_embeddings 2048 -> 16384 (the target's; the engine serves up to it)")
        in check.detail
    )
    assert "embed_tokens [256, 64]" in check.detail and "model.safetensors from" not in check.detail
    pickled = write_head(tmp_path / "pickled", head_tensors(), fmt="bin")
    plan, _, _ = plan_for(tmp_path, target, pickled)
    check = next(c for c in plan.preflight.checks if c.name == "EAGLE head vs TensorRT-LLM's converter")
    assert check.status == "ok" and "prepare-eagle-head checks embed_tokens/fc/layers before conversion" in check.detail
    assert "model.safetensors from pytorch_model.bin" in check.detail
    assert not (tmp_path / "engines").exists()


def test_the_default_llama3_heads_are_prepared_in_the_plan(tmp_path):
    plan, _, _ = plan_build(
        BuildRequest(
            target="llama3-70b",
            draft="eagle",
            runtime="trtllm",
            tp=4,
            dry_run=True,
            engines_dir=tmp_path / "e",
            executor="docker",
        ),
        importable=lambda: False,
    )
    names = [s.name for s in plan.steps]
    assert names == [
        "first-contact",
        "download-draft",
        "prepare-eagle-head",
        "download-target",
        "convert-target",
        "build-target",
    ]
    prepare_step, convert = plan.step("prepare-eagle-head"), plan.step("convert-target").argv
    assert prepare_step.argv == [
        "python3",
        "-m",
        "specpipe.trtllm.prepare_eagle",
        plan.step("download-draft").output,
        prepare_step.output,
        "--max-position-embeddings",
        "8192",
    ]  # llama3-70b's positions
    assert convert[convert.index("--eagle_model_dir") + 1] == prepare_step.output
    assert plan.step("download-draft").argv[2] == "yuhuili/EAGLE-LLaMA3-Instruct-70B"
    assert not (tmp_path / "e").exists()


def test_a_head_with_both_formats_is_read_as_the_converter_reads_it_safetensors_first(tmp_path):
    """ModelWeightsLoader.detect_format takes *.safetensors whenever the folder holds one; a .bin beside it is
    never read, so its tensors must not count (here only the .bin has the bias)."""
    src = write_head(tmp_path / "src", head_tensors(torch.float16), fmt="safetensors")
    torch.save(head_tensors(torch.float16, bias=True), src / "pytorch_model.bin")
    done = prepare(src, tmp_path / "dst")
    assert done["added"] == ["a zero fc.bias"]
    assert not prepared(tmp_path / "dst")["fc.bias"].any()


@pytest.mark.parametrize(
    "head_positions, target_positions, written", [(2048, 8192, 8192), (8192, 8192, 8192), (16384, 8192, 16384)]
)
def test_the_head_is_given_the_targets_positions_when_it_has_fewer(tmp_path, head_positions, target_positions, written):
    src = write_head(tmp_path / "src", head_tensors(), fmt="safetensors", max_position_embeddings=head_positions)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specpipe.trtllm.prepare_eagle",
            str(src),
            str(tmp_path / "dst"),
            "--max-position-embeddings",
            str(target_positions),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert config["max_position_embeddings"] == written and config["bias"] is True
    assert (f"max_position_embeddings {head_positions} -> {target_positions}" in proc.stderr) == (
        head_positions < target_positions
    )
    assert json.loads((src / "config.json").read_text())["max_position_embeddings"] == head_positions


class _NotATensor:
    pass


@pytest.mark.parametrize(
    "name, content",
    [
        ("pytorch_model.bin", b"<html>rate limited</html>"),  # what a failed download may leave
        ("pytorch_model.bin", None),  # a pickle of an object, which weights_only=True refuses to run
        ("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}"),
    ],
)
def test_a_file_that_is_not_weights_is_refused_in_one_line_naming_it(tmp_path, name, content):
    src = write_head(tmp_path / "src", head_tensors(), fmt="bin")
    (src / "pytorch_model.bin").unlink()
    if content is None:
        torch.save({"fc.weight": _NotATensor()}, src / name)
    else:
        (src / name).write_bytes(content)
    proc = prepare_as_the_step_does(src, tmp_path / "dst")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {src / name} is not a safetensors/PyTorch weights file (")
    assert lines[0].endswith("): re-download it") and "weights_only" not in lines[0]
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    "content",
    [b"<html>rate limited</html>", b"\x02\x00\x00\x00\x00\x00\x00\x00[]", b'\x09\x00\x00\x00\x00\x00\x00\x00{"a": {}}'],
)
def test_draft_model_with_a_file_that_is_not_weights_is_refused_naming_it(tmp_path, content):
    """``--draft-model PATH`` reads its safetensors headers: a header that is no name -> tensor mapping too."""
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointFlavourError) as refused:
        read_safetensors_header(tmp_path / "model.safetensors")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'model.safetensors'} is not a safetensors/PyTorch weights file (")
    assert message.endswith("): re-download it") and "\n" not in message
