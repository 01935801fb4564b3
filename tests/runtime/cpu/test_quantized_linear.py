"""Weight-only int8 / int4 linear layers (runtime/cpu/model/quantized_linear.py): the kernels against a
dequantized float64 matmul, the quantization error against fp32, batch invariance, and the fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specpipe.runtime.cpu.model.quantized_linear import (
    INT4_GROUP_SIZE,
    QuantizedLinear,
    int4_group_size,
    linear_reference,
    quantize_linear_layers,
    quantized_bytes,
)

pytestmark = pytest.mark.usefixtures("single_thread")

#: SmolLM2-135M's decoder layer shapes [out, in] (fused qkv, o_proj, fused gate_up, down_proj) and a
#: 4096-row slice of the lm_head's shape.
SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 576)]
SCHEMES = ("int8-wo", "int4-wo")


def random_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """A weight drawn like a trained layer's (N(0, 0.02^2)) with a few outlier columns."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.02
    weight[:, :: max(1, in_features // 8)] *= 4
    return weight


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", SMOLLM2_SHAPES[:4])
def test_kernel_computes_the_dequantized_matmul(scheme, shape):
    layer = QuantizedLinear(random_weight(*shape), None, scheme)
    assert layer.scheme == scheme
    x = torch.randn(7, shape[1], generator=torch.Generator().manual_seed(1))
    got = layer(x).double()
    want = linear_reference(layer, x)
    # the kernel rounds its outputs to bf16 (relative 2**-9) after accumulating in float32
    assert (got - want).abs().max() <= 2.0**-8 * want.abs().max()
    assert (got - want).abs().max() > 0  # really computed in bf16: not the float64 reference


def test_int8_error_is_at_most_half_a_step_per_output_channel():
    weight = random_weight(576, 1536)
    layer = QuantizedLinear(weight, None, "int8-wo")
    step = layer.scales.float()  # bf16, at least the exact step amax / 127 and within 2 % of it
    exact = weight.abs().amax(dim=1) / 127
    assert torch.all(step >= exact) and torch.all(step <= exact * 1.02)
    error = (layer.dequantized_weight() - weight).abs()
    assert torch.all(error <= step[:, None] * (0.5 + 1e-5))
    assert error.max() > 0.4 * step.min()  # the bound is reached: the weights were really rounded
    assert layer.weight.dtype == torch.int8 and layer.weight.shape == (576, 1536)


def test_int4_error_is_at_most_half_a_step_per_group():
    weight = random_weight(576, 1536)
    layer = QuantizedLinear(weight, None, "int4-wo")
    assert layer.group == INT4_GROUP_SIZE
    step, zero = layer.scales.float().transpose(0, 1).unbind(-1)  # [576, groups] each
    error = (layer.dequantized_weight() - weight).abs().reshape(576, -1, layer.group)
    # half a step, plus the bf16 rounding of the group's zero (which shifts the whole grid)
    assert torch.all(error <= (0.5 * step + 2.0**-8 * zero.abs())[..., None] * (1 + 1e-4))
    assert error.max() > 0.4 * step.min()
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (576, 768)  # two weights a byte


@pytest.mark.parametrize("scheme, bound", [("int8-wo", 0.02), ("int4-wo", 0.11)])
def test_output_error_against_fp32(scheme, bound):
    """Relative error of the layer's outputs against the fp32 layer's, Frobenius norm over 64 random rows:
    measured 0.0158 (int8: the outlier columns set each channel's step) and 0.088 (int4, group 32)."""
    weight = random_weight(3072, 576)
    layer = QuantizedLinear(weight, None, scheme)
    x = torch.randn(64, 576, generator=torch.Generator().manual_seed(2))
    exact = F.linear(x, weight)
    relative = float((layer(x) - exact).norm() / exact.norm())
    assert 0 < relative < bound


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", SMOLLM2_SHAPES)
def test_a_row_comes_out_bitwise_alike_whatever_batch_it_shares(scheme, shape):
    layer = QuantizedLinear(random_weight(*shape), None, scheme)
    x = torch.randn(16, shape[1], generator=torch.Generator().manual_seed(3))
    alone = [layer.rows(x[i : i + 1].clone()) for i in range(16)]
    for rows in range(2, 17):
        together = layer.rows(x[:rows].contiguous())
        for i in range(rows):
            assert torch.equal(together[i : i + 1], alone[i]), (rows, i)


def test_int4_takes_a_smaller_group_or_falls_back_to_int8():
    assert int4_group_size(64, 96) == 32
    assert int4_group_size(64, 576) == INT4_GROUP_SIZE == 32
    assert int4_group_size(40, 64) is None  # the packing needs out_features divisible by 16
    assert int4_group_size(64, 40) is None
    layer = QuantizedLinear(random_weight(40, 64), None, "int4-wo")
    assert (layer.scheme, layer.group) == ("int8-wo", 0)
    x = torch.randn(3, 64)
    assert torch.allclose(layer(x), linear_reference(layer, x).float(), rtol=2.0**-8, atol=1e-4)  # bf16 outputs


def test_bias_shapes_and_replacement():
    module = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 48, bias=False))
    reference = [module[0].weight.detach().clone(), module[0].bias.detach().clone()]
    assert quantize_linear_layers(module, "int4-wo") == 2
    first, last = module[0], module[2]
    assert isinstance(first, QuantizedLinear) and first.scheme == "int4-wo" and first.group == 32
    assert (last.scheme, last.group) == ("int4-wo", 32)
    x = torch.randn(2, 5, 64)
    out = first(x)
    assert out.shape == (2, 5, 32) and out.dtype == torch.float32
    want = F.linear(x.bfloat16().float(), first.dequantized_weight(), reference[1])
    assert torch.allclose(out, want, rtol=2.0**-8, atol=1e-2)  # bf16 outputs, then the fp32 bias
    assert module(x.to(torch.bfloat16)).dtype == torch.float32  # inputs are cast to fp32
    assert first(torch.zeros(0, 64)).shape == (0, 32)
    # 32 x 64 int4 (1024 B) + 2 groups x 32 outputs x (scale, zero) bf16 (256 B) + fp32 bias (128 B); 48 x 32
    # int4 (768 B) + 1 group x 48 x 2 bf16 (192 B)
    assert quantized_bytes(module) == 1024 + 256 + 128 + 768 + 192


def test_bad_scheme_and_prepacked_layers_are_refused():
    with pytest.raises(ValueError, match="int8-wo, int4-wo"):
        QuantizedLinear(torch.zeros(16, 32), None, "fp8")
    from specpipe.runtime.cpu.model.prepack import PrepackedLinear

    with pytest.raises(TypeError, match="before prepacking"):
        QuantizedLinear.from_linear(PrepackedLinear(torch.nn.Linear(32, 16)), "int8-wo")
