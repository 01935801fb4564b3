"""Memory plan per GPU: real figures for the Llama presets, and refusals with suggestions."""

import pytest

from specpipe.build_request import BuildRequest
from specpipe.presets import load_target
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.draft_settings import lookahead_max_draft_len
from specpipe.trtllm.gpus import GIB, UnknownGpuError, lookup_gpu
from specpipe.trtllm.memory import layer_weights, plan_memory
from specpipe.trtllm.preflight import MemoryPlanError, raise_if_unfit
from specpipe.trtllm.quant import SCHEMES

L8 = load_target("llama3-8b").architecture
L70 = load_target("llama3-70b").architecture


def test_llama3_8b_bf16_tp1_figures():
    assert layer_weights(L8) == 218_103_808  # 4096*4096*2 + 2*4096*1024 + 3*4096*14336
    m = plan_memory(
        target=L8, scheme=SCHEMES["bf16"], tp=1, pp=1, batch=8, max_seq_len=8192, method="none", max_draft_len=0
    )
    # 32 layers x 218103808 x 2 B + norms + embedding and lm_head (128256 x 4096 x 2 B each)
    assert m.target_weights == 32 * (218_103_808 * 2 + 2 * 4096 * 2) + 2 * 128256 * 4096 * 2 == 16_060_514_304
    # K and V: 2 x 32 layers x 8 KV heads x 128 x 2 B = 131072 B per token, x 8 sequences x 8192 tokens
    assert m.target_kv_cache == 131072 * 8 * 8192 == 8 * GIB
    assert m.draft_weights == 0 and m.fits is None


def test_tp_splits_layers_and_kv_but_not_the_embedding():
    one = plan_memory(
        target=L70, scheme=SCHEMES["bf16"], tp=1, pp=1, batch=8, max_seq_len=8192, method="none", max_draft_len=0
    )
    four = plan_memory(
        target=L70, scheme=SCHEMES["bf16"], tp=4, pp=1, batch=8, max_seq_len=8192, method="none", max_draft_len=0
    )
    embed = 128256 * 8192 * 2
    assert four.target_weights - embed == pytest.approx((one.target_weights - embed) / 4, rel=1e-9)
    assert four.target_kv_cache * 4 == one.target_kv_cache
    eight = plan_memory(
        target=L70, scheme=SCHEMES["bf16"], tp=16, pp=1, batch=1, max_seq_len=1, method="none", max_draft_len=0
    )
    assert eight.target_kv_cache == 2 * 80 * 1 * 128 * 2  # 8 KV heads over TP 16: one (replicated) head per rank


def test_speculation_lengthens_the_engine_and_adds_draft_kv():
    base = dict(target=L8, scheme=SCHEMES["fp8"], tp=1, pp=1, batch=4, max_seq_len=4096)
    la = plan_memory(**base, method="lookahead", max_draft_len=83)
    assert la.target_kv_cache == 2 * 32 * 8 * 128 * 1 * 4 * (4096 + 83)  # fp8 KV: 1 byte
    draft = load_target("llama3-8b").architecture  # any arch works; 1B below
    from specpipe.presets import load_draft

    d1b = load_draft("llama3.2-1b").architecture
    dt = plan_memory(**base, method="draft-model", max_draft_len=4, draft_arch=d1b)
    assert dt.draft_kv_cache == 2 * 16 * 8 * 64 * 1 * 4 * 4096
    assert dt.draft_weights > 0 and draft.num_layers == 32


def test_seventy_b_sixteen_bit_tp1_on_80gb_is_refused_with_a_suggestion(tmp_path):
    req = BuildRequest(
        target="llama3-70b",
        draft="none",
        runtime="trtllm",
        gpu="h100-80gb",
        tp=1,
        quantization="bf16",
        dry_run=True,
        engines_dir=tmp_path,
    )
    plan, _, _ = plan_build(req, importable=lambda: False)
    assert plan.preflight.memory.fits is False
    with pytest.raises(MemoryPlanError) as info:
        raise_if_unfit(plan.preflight)
    message = str(info.value)
    assert "h100-80gb has 79.6 GiB" in message and "--tp 4" in message and "int4-awq" in message
    assert info.value.plan.target_weights > 130 * GIB


def test_eagle_70b_fits_on_four_h100(tmp_path):
    req = BuildRequest(
        target="llama3-70b", draft="eagle", runtime="trtllm", gpu="h100-80gb", tp=4, dry_run=True, engines_dir=tmp_path
    )
    plan, _, _ = plan_build(req, importable=lambda: False)
    assert plan.preflight.memory.fits is True and plan.preflight.memory_error is None


def test_gpu_table_and_unknown_gpu():
    h100 = lookup_gpu("H100")
    assert (h100.name, h100.memory_bytes, h100.sm) == ("h100-80gb", 81559 << 20, 90)
    assert lookup_gpu("a100-40gb").compute_capability == (8, 0)
    with pytest.raises(UnknownGpuError, match="did you mean 'h200-141gb'"):
        lookup_gpu("h200-140gb")


@pytest.mark.parametrize("wng, expected", [((7, 7, 7), 83), ((4, 4, 4), 23), ((1, 1, 0), 0), ((2, 2, 1), 2)])
def test_lookahead_formula(wng, expected):
    assert lookahead_max_draft_len(*wng) == expected
