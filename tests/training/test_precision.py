"""Training's mixed precision follows the CPU (:mod:`specpipe.training.precision`): bf16 autocast only
where oneDNN runs bf16 natively, fp32 elsewhere, and the recipe says which."""

import pytest
import torch

from specpipe.training import precision, train


@pytest.fixture
def cpu_with(monkeypatch):
    def set_native(native: bool):
        precision.native_bf16.cache_clear()
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native, raising=False)
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)

    yield set_native
    precision.native_bf16.cache_clear()


@pytest.mark.parametrize("native, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_a_training_step_runs_in_bf16_only_where_the_cpu_has_it(cpu_with, native, dtype):
    cpu_with(native)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with precision.mixed_precision():
        product = a @ b
    assert product.dtype == dtype
    assert precision.training_dtype() == str(dtype).removeprefix("torch.")
    assert train.environment()["training_dtype"] == str(dtype).removeprefix("torch.")


def test_a_cpu_whose_check_fails_trains_in_fp32(monkeypatch):
    precision.native_bf16.cache_clear()

    def failing():
        raise RuntimeError("no oneDNN")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", failing, raising=False)
    try:
        assert precision.native_bf16() is False and precision.training_dtype() == "float32"
    finally:
        precision.native_bf16.cache_clear()
