"""``specpipe build -q int8-wo|int4-wo`` on the CPU runtime: accepted, recorded in the manifest and the
inputs hash, engines named apart; every other -q refused with what the CPU runtime takes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tiny_presets import write_tiny_presets

from specpipe.build_cpu import build_cpu, plan_cpu
from specpipe.build_request import BuildRequest
from specpipe.cli import main
from specpipe.errors import FlagError, ManifestError
from specpipe.runtime.cpu.model.quant_scheme import cpu_quantization, manifest_quantization


@pytest.fixture
def presets(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_PRESETS", str(write_tiny_presets(tmp_path / "presets")))
    return tmp_path / "engines"


@pytest.mark.parametrize("value", ["fp8", "int4-awq", "bf16", "fp16"])
def test_schemes_the_cpu_runtime_does_not_run_are_refused(value, presets):
    with pytest.raises(
        FlagError,
        match=f"-q/--quantization {value} is not taken by the CPU runtime.*give -q auto "
        r"\(fp32\), int8-wo or int4-wo",
    ):
        plan_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=presets, quantization=value))
    assert not presets.exists()


def test_cli_refusal_is_one_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(
        main,
        [*"build --target smollm2-135m --draft ngram -q fp8 --engines-dir".split(), str(tmp_path / "engines")],
    )
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line] == [
        (
            "error: -q/--quantization fp8 is not taken by the CPU runtime (it applies to --runtime trtllm or "
            "trtllm-llmapi): give -q auto (fp32), int8-wo or int4-wo"
        )
    ]
    assert not (tmp_path / "engines").exists()


def test_plans_differ_by_scheme_and_auto_keeps_the_fp32_plan(presets):
    plans = {
        q: plan_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=presets, quantization=q))
        for q in ("auto", "int8-wo", "int4-wo")
    }
    assert [p.quantization for p in plans.values()] == [None, "int8-wo", "int4-wo"]
    assert [p.name for p in plans.values()] == ["tiny-ngram", "tiny-ngram-int8-wo", "tiny-ngram-int4-wo"]
    assert len({p.inputs_hash for p in plans.values()}) == 3
    assert "quantization" not in plans["auto"].inputs  # fp32 engines built before keep their hash
    assert plans["int4-wo"].inputs["quantization"] == "int4-wo"
    assert plans["int8-wo"].as_dict()["quantization"] == "int8-wo"
    assert any(
        line.startswith("  weights      int4-wo: target weights ")
        for line in plans["int4-wo"].render_text().splitlines()
    )
    named = plan_cpu(
        BuildRequest(target="tiny", draft="ngram", engines_dir=presets, quantization="int8-wo", name="mine")
    )
    assert named.name == "mine"


def test_built_engine_records_the_scheme_and_loads_quantized(presets):
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear

    engine_dir = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=presets, quantization="int4-wo"))
    assert engine_dir.name == "tiny-ngram-int4-wo"
    assert json.loads((engine_dir / "manifest.json").read_text())["quantization"] == "int4-wo"
    engine, manifest = load_engine(engine_dir)
    assert manifest.quantization == "int4-wo"
    assert isinstance(engine.target.model.lm_head, QuantizedLinear)
    fp32_dir = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=presets))
    assert "quantization" not in json.loads((fp32_dir / "manifest.json").read_text())
    assert sorted(p.name for p in presets.iterdir()) == ["tiny-ngram", "tiny-ngram-int4-wo"]


def test_scheme_names():
    assert cpu_quantization("auto") is None and cpu_quantization(None) is None
    assert cpu_quantization("int8-wo") == "int8-wo"
    assert manifest_quantization(None, "m") is None and manifest_quantization("int4-wo", "m") == "int4-wo"
    with pytest.raises(ManifestError, match="m: quantization 'int4-awq'"):
        manifest_quantization("int4-awq", "m")


@pytest.mark.parametrize("scheme", [None, "int8-wo", "int4-wo"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_plans_weight_memory_is_what_the_loaded_layers_hold(scheme, tied):
    """``target_weight_bytes`` (the plan's ``memory``) against the bytes of a model quantized as the loader does."""

    from tiny_models import tiny_llama

    from specpipe.presets import Architecture
    from specpipe.runtime.cpu.model.quant_scheme import target_weight_bytes
    from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear
    from specpipe.runtime.cpu.quantized_models import quantize_model

    model = tiny_llama(vocab_size=96, hidden_size=64, num_heads=4, num_kv_heads=2, tie_word_embeddings=tied)
    config = model.config
    arch = Architecture(
        num_layers=config.num_hidden_layers,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=config.intermediate_size,
        vocab_size=96,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
    )
    fp32 = sum(p.numel() * 4 for p in model.parameters())  # a tied lm_head is listed once
    assert target_weight_bytes(arch, None) == fp32
    if scheme is None:
        return
    quantize_model(model, scheme)
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert {m.scheme for m in layers} == {scheme} and len(
        layers
    ) == 1 + 4 * config.num_hidden_layers  # qkv, o, gate_up, down
    dense = sum(p.numel() * 4 for p in model.parameters())  # embedding and norms (quantized weights are buffers)
    assert target_weight_bytes(arch, scheme) == dense + sum(m.weight_bytes() for m in layers)
    assert target_weight_bytes(arch, scheme) < fp32 * (0.5 if scheme == "int8-wo" else 0.4)


def test_the_cpu_plan_states_the_weights_and_cache_memory(presets):
    plan = plan_cpu(BuildRequest(target="smollm2-135m", draft="ngram", engines_dir=presets, quantization="int8-wo"))
    memory = plan.as_dict()["memory"]
    assert memory["kv_cache_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert 0.45 < memory["target_weights_bytes"] / memory["target_weights_fp32_bytes"] < 0.47
    assert (
        "weights      int8-wo: target weights 237 MiB loaded (fp32: 513 MiB), KV cache 45 KiB per token"
        in plan.render_text()
    )
