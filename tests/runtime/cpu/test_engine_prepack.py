"""Prepacked (MKL or oneDNN) linear layers: same results as nn.Linear, applied by the engine loader after the
drafters took their dense copies, and greedy decoding unchanged."""

from __future__ import annotations

import pytest
import torch
from reference_decoding import greedy_reference
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import NoDrafter
from specpipe.runtime.cpu.model.prepack import PrepackedLinear, prepack_available, prepack_linear_layers
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(not prepack_available(), reason="this PyTorch build has no oneDNN backend"),
]


KERNELS = {
    "mkl": lambda prepack: prepack.mkl_packed_gemm_available(),
    "onednn": lambda prepack: prepack._fused_linear_available(),
    "mkldnn-tensor": lambda prepack: True,
}


def _force_kernel(monkeypatch, kernel: str) -> None:
    from specpipe.runtime.cpu.model import prepack

    if not KERNELS[kernel](prepack):
        pytest.skip(f"this PyTorch build lacks the {kernel} kernel")
    monkeypatch.setattr(prepack, "mkl_packed_gemm_available", lambda: kernel == "mkl")
    monkeypatch.setattr(prepack, "_fused_linear_available", lambda: kernel == "onednn")


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (1, 5, 64), (2, 3, 64), (0, 64)])
def test_prepacked_linear_matches_nn_linear(shape, bias, kernel, monkeypatch):
    _force_kernel(monkeypatch, kernel)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    packed = PrepackedLinear(linear)
    assert packed.kernel == kernel
    x = torch.randn(*shape)
    with torch.inference_mode():
        expected, got = linear(x), packed(x)
    assert got.shape == (*shape[:-1], 48) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not x.numel() or not torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("dense_rows", [0, 4, 1 << 62])
def test_rows_fast_path_gives_forwards_values_bitwise(kernel, dense_rows, monkeypatch):
    """``rows`` (2-D input, no reshapes) is what the batched forward calls; it must compute what
    ``forward`` computes, with the packed kernel, the dense copy up to ``dense_rows`` rows, or both."""
    from specpipe.runtime.cpu.model.prepack import drop_packed_weights, set_dense_rows

    _force_kernel(monkeypatch, kernel)
    torch.manual_seed(2)
    packed = PrepackedLinear(torch.nn.Linear(64, 48, bias=True), dense_copy=True)
    if dense_rows >= 1 << 62:
        drop_packed_weights(packed)
    else:
        set_dense_rows(packed, dense_rows)
    with torch.inference_mode():
        for rows in (1, 3, 4, 9):
            x = torch.randn(rows, 64)
            assert torch.equal(packed.rows(x), packed(x)), rows
            torch.testing.assert_close(
                packed.rows(x), torch.nn.functional.linear(x, packed.dense, packed.dense_bias), rtol=1e-5, atol=1e-5
            )


@pytest.mark.parametrize("kernel", ["mkl", "onednn"])
@pytest.mark.parametrize("out_features, in_features", [(200, 64), (200, 576), (576, 576), (200, 1536), (576, 1536)])
def test_packed_rows_do_not_depend_on_the_other_rows(kernel, out_features, in_features, monkeypatch):
    """One packing serves every row count, and a row's output is bitwise the same alone or among 1-130
    others (what keeps a request's greedy tokens independent of its batch), padded to ``min_rows`` where
    the kernel computes few rows differently."""
    _force_kernel(monkeypatch, kernel)
    torch.manual_seed(1)
    packed = PrepackedLinear(torch.nn.Linear(in_features, out_features, bias=False))
    x = torch.randn(131, in_features)
    with torch.inference_mode():
        alone = torch.cat([packed(row[None]) for row in x])
        for rows in (2, 3, 4, 8, 13, 131):
            assert torch.equal(packed(x[:rows]), alone[:rows]), rows
            assert torch.equal(packed.rows(x[:rows].contiguous()), alone[:rows]), rows


def _skewed_kernel(layer: PrepackedLinear, skewed_rows: set[int]):
    """The layer's kernel, off by 1e-3 on every row count in ``skewed_rows``."""
    exact = layer._kernel_rows

    def kernel(x):
        out = exact(x)
        return out + 1e-3 if len(x) in skewed_rows else out

    return kernel


@pytest.mark.parametrize("skewed, expected", [(set(), 1), ({1}, 2), ({1, 2, 3}, 4), ({1, 2, 3, 4, 5, 8}, 1)])
def test_min_rows_is_the_fewest_rows_from_which_every_row_count_agrees(skewed, expected, monkeypatch):
    """One row computed unlike two or more: inputs are padded to 2 rows; a kernel that agrees only from
    more than MAX_PAD_ROWS rows is not padded (1)."""
    layer = PrepackedLinear(torch.nn.Linear(16, 8, bias=False))
    monkeypatch.setattr(layer, "_kernel_rows", _skewed_kernel(layer, skewed))
    assert layer.batch_invariant_min_rows() == expected


def test_inputs_below_min_rows_are_padded_with_zero_rows(monkeypatch):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 8, bias=True)
    layer = PrepackedLinear(linear)
    seen = []
    exact = layer._kernel_rows
    monkeypatch.setattr(layer, "_kernel_rows", lambda x: seen.append(x.clone()) or exact(x))
    layer.min_rows = 3
    x = torch.randn(1, 16)
    with torch.inference_mode():
        out = layer(x)
    assert [len(rows) for rows in seen] == [3]
    assert torch.equal(seen[0][:1], x) and not seen[0][1:].any()
    assert out.shape == (1, 8) and torch.allclose(out, linear(x), atol=1e-5)


def test_prepack_replaces_every_fp32_linear_and_keeps_the_rest():
    model = tiny_llama(seed=0)
    layers = model.config.num_hidden_layers
    n = prepack_linear_layers(model)
    assert n == layers * 7 + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert isinstance(model.lm_head, PrepackedLinear)
    assert isinstance(model.model.embed_tokens, torch.nn.Embedding) and not model.model.embed_tokens.weight.is_mkldnn
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    half = torch.nn.Sequential(torch.nn.Linear(4, 4).half())
    assert prepack_linear_layers(half) == 0 and type(half[0]) is torch.nn.Linear


def test_prepacked_engine_decodes_exactly_like_the_reference():
    reference = tiny_llama(seed=3)
    packed = tiny_llama(seed=3)
    prepack_linear_layers(packed)
    prompt = [5, 9, 2, 7, 7, 1]
    expected = greedy_reference(reference, prompt, 24)
    engine = Deployment(packed, NoDrafter(), max_draft_len=0)
    tokens, _ = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=24))
    assert tokens == expected[: len(tokens)] and len(tokens) > 0


def test_loaded_engines_run_prepacked(tmp_path):
    from tiny_engine import make_tiny_engine

    from specpipe.runtime.cpu.loader import load_engine

    engine, _ = load_engine(make_tiny_engine(tmp_path, method="ngram"))
    assert isinstance(engine.target.model.lm_head, PrepackedLinear)
    tokens, stats = generate_all(solo_scheduler(engine), [5, 6, 7, 5, 6, 7, 5], SamplingParams(max_tokens=12))
    assert len(tokens) == 12 and stats.target_forwards >= 1
