"""Fused query/key/value and gate/up projections: the same model outputs, one GEMM per group in
transformers' forward too, and nothing held between forwards."""

from __future__ import annotations

import torch
from tiny_models import tiny_llama

from specpipe.runtime.cpu.model.fused_projections import FusedSlice, fuse_projections
from specpipe.runtime.cpu.model.prepack import PrepackedLinear, prepack_linear_layers


def _logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


def test_fused_model_computes_what_the_separate_projections_did():
    model, ids = tiny_llama(seed=0), [3, 1, 4, 1, 5, 9, 2, 6]
    expected = _logits(model, ids)
    layers = model.config.num_hidden_layers
    assert fuse_projections(model.model) == 2 * layers
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert all(isinstance(getattr(attn, name), FusedSlice) for name in ("q_proj", "k_proj", "v_proj"))
    assert all(isinstance(getattr(mlp, name), FusedSlice) for name in ("gate_proj", "up_proj"))
    assert attn.qkv_proj.out_features == attn.q_proj.out_features + 2 * attn.k_proj.out_features
    torch.testing.assert_close(_logits(model, ids), expected, rtol=1e-5, atol=1e-5)
    assert fuse_projections(model.model) == 0  # already fused


def test_transformers_forward_runs_each_fused_layer_once_per_layer_call(monkeypatch):
    model = tiny_llama(seed=1)
    fuse_projections(model.model)
    prepack_linear_layers(model.model)
    fused = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(fused, PrepackedLinear)
    calls = []
    original = fused.forward
    monkeypatch.setattr(fused, "forward", lambda x: calls.append(len(x)) or original(x))
    _logits(model, [7, 8, 9])
    assert len(calls) == 1
    shared = model.model.layers[0].self_attn.q_proj._shared
    assert shared._input is None and shared._output is None  # released once q, k and v took their columns


def test_a_slice_called_twice_on_one_input_recomputes():
    model = tiny_llama(seed=2)
    fuse_projections(model.model)
    attn = model.model.layers[0].self_attn
    x = torch.randn(2, model.config.hidden_size)
    with torch.inference_mode():
        first, again = attn.q_proj(x), attn.q_proj(x)
        k = attn.k_proj(x)
    torch.testing.assert_close(first, again)
    torch.testing.assert_close(k, x @ attn.qkv_proj.weight[attn.k_proj.start : attn.k_proj.stop].T)


def test_layers_that_cannot_be_fused_stay_as_they_are():
    model = tiny_llama(seed=3)
    attn = model.model.layers[0].self_attn
    attn.k_proj = torch.nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=True)
    fuse_projections(model.model)
    assert not hasattr(attn, "qkv_proj") and type(attn.q_proj) is torch.nn.Linear
    assert hasattr(model.model.layers[0].mlp, "gate_up_proj")
