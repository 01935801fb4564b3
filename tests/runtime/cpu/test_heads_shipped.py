"""The heads and distilled draft shipped for smollm2-135m: float16, only the weights that differ from the
target, names and shapes as TensorRT-LLM's converters read them, a recipe; and building them for the CPU
runtime (tree and head facts in the manifest, greedy output identical to the baseline, bad input refused
before anything is written)."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from smollm2_prompts import chat_ids

from specpipe import heads_format
from specpipe.cli import main
from specpipe.models.heads import shipped_dir
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import NoDrafter
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

H, V, INTER, HEADS, KV, HEAD_DIM = 576, 49152, 1536, 9, 3, 64


def _tensors(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft-model"])
def test_shipped_files_are_small_float16_deltas_with_a_recipe(method):
    folder = shipped_dir("smollm2-135m", method)
    assert folder is not None, f"no shipped {method} weights"
    path = folder / heads_format.COMPACT_FILES[method]
    assert path.stat().st_size < 30 * 2**20
    tensors, meta = _tensors(path)
    assert (
        meta["format"] == heads_format.FORMAT
        and json.loads(meta["hidden_size"]) == H
        and json.loads(meta["vocab_size"]) == V
    )
    floats = {k: v for k, v in tensors.items() if v.is_floating_point()}
    assert floats and all(v.dtype == torch.float16 for v in floats.values())
    assert not any("embed_tokens" in k or "lm_head" in k for k in tensors)  # the target's, never stored
    if method == "eagle":
        expected = heads_format.expected_eagle_tensors(H, INTER, HEADS, KV, HEAD_DIM, V)
        expected.pop("embed_tokens.weight")
        assert {k: tuple(v.shape) for k, v in floats.items()} == expected
    elif method == "medusa":
        n, layers = json.loads(meta["num_heads"]), json.loads(meta["num_layers"])
        expected = {k: s for k, s in heads_format.expected_medusa_tensors(H, V, n, layers).items() if ".linear." in k}
        assert {k: tuple(v.shape) for k, v in floats.items()} == expected
    else:
        layers = json.loads(meta["num_layers"])
        assert {k for k in floats} == {
            "model.norm.weight",
            *(
                f"model.layers.{i}.{name}"
                for i in range(layers)
                for name in (
                    "self_attn.q_proj.weight",
                    "self_attn.k_proj.weight",
                    "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight",
                    "mlp.gate_proj.weight",
                    "mlp.up_proj.weight",
                    "mlp.down_proj.weight",
                    "input_layernorm.weight",
                    "post_attention_layernorm.weight",
                )
            ),
        }
    if method != "draft-model":
        vocab = tensors["draft_vocab"]
        assert vocab.dtype == torch.int64 and 2 in vocab.tolist() and int(vocab.max()) < V
    recipe = json.loads((folder / heads_format.RECIPE_FILE).read_text())
    assert recipe["command"].startswith("specpipe train-draft --target smollm2-135m")
    assert recipe["seed"] == 0 and recipe["steps"] > 0 and recipe["train_seconds"] > 0
    assert recipe["data"]["answer_positions"] > 10_000
    assert recipe["heldout_metrics"]["positions"] > 0


def _build(tmp_path, *args):
    engines = tmp_path / "engines"
    result = CliRunner().invoke(main, ["build", "--target", "smollm2-135m", "--engines-dir", str(engines), *args])
    return result, engines


@pytest.mark.model
@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_build_heads_for_the_cpu_runtime(tmp_path, method):
    from specpipe.generation.api import SamplingParams
    from specpipe.runtime.cpu.loader import load_engine

    result, engines = _build(tmp_path, "--draft", method)
    assert result.exit_code == 0, result.output
    engine_dir = engines / f"smollm2-135m-{method}"
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    spec = manifest["speculative"]
    assert spec["method"] == method and spec["choices"] and spec["max_draft_len"] >= len(spec["choices"])
    assert manifest["draft"]["heads"]["hidden_size"] == H and manifest["draft"]["heads"]["draft_vocab_size"] > 0
    layout = engine_dir / "draft" / "trtllm"
    if method == "eagle":
        saved = torch.load(layout / "pytorch_model.bin", weights_only=True)
        assert {k: tuple(v.shape) for k, v in saved.items()} == heads_format.expected_eagle_tensors(
            H, INTER, HEADS, KV, HEAD_DIM, V
        )
        assert json.loads((layout / "config.json").read_text())["num_hidden_layers"] == 1
    else:
        n = spec["num_medusa_heads"]
        tensors, _ = _tensors(layout / "medusa_lm_head.safetensors")
        assert {k: tuple(v.shape) for k, v in tensors.items()} == heads_format.expected_medusa_tensors(H, V, n, 1)
        config = json.loads((layout / "config.json").read_text())
        assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (n, 1)
    engine, _ = load_engine(engine_dir)
    prompt = chat_ids(engine_dir, "What is the capital of France?")
    tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=24))
    plain = Deployment(engine.target.model, NoDrafter(), max_draft_len=0)
    assert tokens == generate_all(solo_scheduler(plain), prompt, SamplingParams(max_tokens=24))[0]
    assert stats.target_forwards <= 24


@pytest.mark.model
def test_heads_for_another_target_or_corrupt_are_refused_before_writing(tmp_path):
    other = tmp_path / "other"
    heads_format.save_compact(
        other,
        "medusa",
        {"0.0.linear.weight": torch.zeros(48, 48), "0.0.linear.bias": torch.zeros(48)},
        {"hidden_size": 48, "vocab_size": 1000, "num_heads": 1, "num_layers": 1},
    )
    result, engines = _build(tmp_path, "--draft", "medusa", "--draft-model", str(other))
    assert result.exit_code == 1 and "trained for a target with hidden size 48 and vocabulary 1000" in result.output
    assert not any(p.name.startswith("smollm2") for p in engines.iterdir())
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "eagle_heads.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    result, engines = _build(tmp_path, "--draft", "eagle", "--draft-model", str(corrupt))
    assert result.exit_code == 1 and "corrupt or truncated" in result.output
    assert not any(p.name.startswith("smollm2") for p in engines.iterdir())


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(
            ["--draft", "medusa", "--choices", "[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0],[0,0,0,0,0,0]]"],
            "6 deep, the draft has 3 Medusa heads",
            marks=pytest.mark.model,
        ),
        (["--draft", "eagle", "--choices", "[[0],[1],[2]]", "--max-draft-len", "2"], "3 nodes, max_draft_len is 2"),
        (["--draft", "eagle", "--choices", "[[0],[1,0]]"], "path [1, 0] has no parent [1]"),
    ],
)
def test_bad_trees_are_refused(tmp_path, args, message):
    result, engines = _build(tmp_path, *args)
    assert result.exit_code == 1, result.output
    assert message in result.output.replace("\n", " ")
    assert "Traceback" not in result.output
    leftovers = [p for p in engines.iterdir() if p.name.startswith("smollm2")] if engines.exists() else []
    assert leftovers == []
