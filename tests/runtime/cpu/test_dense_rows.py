"""Dense weight copies (``PrepackedLinear.dense``) for few rows or for all, and their load-time choice
(:mod:`specpipe.runtime.cpu.dense_rows`)."""

from __future__ import annotations

import pytest
import torch
from tiny_engine import make_tiny_engine
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.dense_rows import apply_dense_rows, choose_dense_rows, parse_dense_rows, rows_from_timings
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.model.prepack import (
    ALL_ROWS,
    PrepackedLinear,
    drop_dense_copies,
    drop_packed_weights,
    prepack_available,
    prepack_linear_layers,
    set_dense_rows,
)
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(not prepack_available(), reason="this PyTorch build has no oneDNN backend"),
]


@pytest.mark.parametrize("bias", [False, True])
def test_rows_up_to_the_threshold_use_the_dense_copy_and_the_rest_the_packed_kernel(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    packed_only, layer = PrepackedLinear(linear), PrepackedLinear(linear, dense_copy=True)
    assert packed_only.dense is None and layer.dense.shape == (48, 64) and layer.dense.is_contiguous()
    set_dense_rows(layer, 2)
    few, many = [(1, 64), (1, 1, 64), (2, 64), (1, 2, 64)], [(3, 64), (1, 5, 64)]
    with torch.inference_mode():
        for shape in few + many:
            x = torch.randn(*shape)
            got = layer(x)
            assert got.shape == (*shape[:-1], 48)
            torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)
        # which kernel ran: scale the dense copy, and only inputs of at most 2 rows change with it
        layer.dense.mul_(2.0)
        for shape in few:
            x = torch.randn(*shape)
            expected = 2.0 * (x @ linear.weight.detach().t()) + (linear.bias.detach() if bias else 0.0)
            torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        for shape in many:
            x = torch.randn(*shape)
            assert torch.equal(layer(x), packed_only(x))
    assert drop_dense_copies(layer) == 64 * 48 * 4
    assert layer.dense is None and layer.dense_rows == 0
    x = torch.randn(1, 64)
    with torch.inference_mode():
        assert torch.equal(layer(x), packed_only(x))


@pytest.mark.parametrize("bias", [False, True])
def test_dropping_the_packed_weights_runs_every_input_on_the_dense_copy(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    layer = PrepackedLinear(linear, dense_copy=True)
    assert drop_packed_weights(layer) == 64 * 48 * 4
    assert layer.weight is None and layer.dense_rows == ALL_ROWS
    assert (
        set_dense_rows(layer, 2) == 0 and layer.dense_rows == ALL_ROWS
    )  # a threshold cannot bring the packed kernel back
    assert drop_dense_copies(layer) == 0 and layer.dense is not None  # nor can dropping the copies leave no weight
    with torch.inference_mode():
        for shape in [(1, 64), (3, 64), (1, 130, 64)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)
        layer.dense.mul_(2.0)  # and it is the copy that runs
        x = torch.randn(40, 64)
        torch.testing.assert_close(
            layer(x),
            2.0 * (x @ linear.weight.detach().t()) + (linear.bias.detach() if bias else 0.0),
            rtol=1e-5,
            atol=1e-5,
        )
    assert drop_packed_weights(layer) == 0  # nothing left to drop


@pytest.mark.parametrize(
    "dense, packed, rows",
    [
        ((10, 20, 30, 40, 50), (20, 25, 35, 45, 30), 8),  # faster up to 8 rows, 1.67x slower at 12: both copies
        ((10, 20, 30, 40, 80), (20, 20, 60, 60, 20), 1),  # a tie at 2 rows ends the range, though 4 wins
        ((30, 30, 30, 30, 30), (30, 30, 30, 30, 30), ALL_ROWS),  # a tie: one copy, the dense one
        ((10, 20, 30, 40, 55), (20, 25, 35, 45, 45), ALL_ROWS),  # 22 % slower at 12 rows, faster on average
        ((40, 40, 40, 40, 40), (36, 36, 36, 36, 36), 0),  # 11 % slower everywhere: packed only
        ((1, 1, 1, 1, 1), (5, 5, 5, 5, 5), ALL_ROWS),
        ((30, 30, 30, 30, 30), (25, 25, 25, 25, 25), 0),  # packed always faster: packed only
    ],
)
def test_rows_from_timings(dense, packed, rows):
    assert rows_from_timings((1, 2, 4, 8, 12), dense, packed) == rows


def _dense_layers(engine):
    return [m for m in engine.target.model.modules() if isinstance(m, PrepackedLinear) and m.dense is not None]


@pytest.mark.parametrize(
    "text, rows",
    [
        ("auto", None),
        ("", None),
        (None, None),
        (" AUTO ", None),
        ("0", 0),
        ("12", 12),
        ("all", ALL_ROWS),
        (" All ", ALL_ROWS),
    ],
)
def test_parse_dense_rows(text, rows):
    assert parse_dense_rows(text) == rows


@pytest.mark.parametrize("text", ["fast", "-1", "1.5", "²", "٣"])
def test_parse_dense_rows_refuses_anything_else(text):
    with pytest.raises(ValueError, match="dense_rows must be 'auto', 'all' .* or a row count"):
        parse_dense_rows(text)


@pytest.mark.parametrize("text", ["4097", "99999999999999999999"])
def test_parse_dense_rows_refuses_counts_no_forward_has(text):
    assert parse_dense_rows("4096") == 4096
    with pytest.raises(ValueError, match="more rows than a forward has .* give 'all'"):
        parse_dense_rows(text)


def test_loading_with_dense_copies_covers_the_decoder_but_not_lm_head(tmp_path):
    engine_dir = make_tiny_engine(tmp_path)
    plain, _ = load_engine(engine_dir)
    engine, _ = load_engine(engine_dir, dense_copy=True)
    layers = engine.target.model.config.num_hidden_layers
    assert not _dense_layers(plain)
    assert (
        len(_dense_layers(engine)) == 4 * layers and engine.target.model.lm_head.dense is None
    )  # qkv, o, gate_up, down
    assert all(m.dense_rows == 0 for m in _dense_layers(engine))  # off until chosen


def test_apply_dense_rows_settings(tmp_path):
    engine_dir = make_tiny_engine(tmp_path)
    engine, _ = load_engine(engine_dir, dense_copy=True)
    assert "up to 3 rows" in apply_dense_rows(engine, parse_dense_rows(" 3 "))
    assert {m.dense_rows for m in _dense_layers(engine)} == {3}
    prompt, params = [5, 6, 7, 5, 6, 7, 5], SamplingParams(max_tokens=12)
    expected, _ = generate_all(solo_scheduler(engine), prompt, params)
    assert len(expected) == 12
    assert "dense weights only" in apply_dense_rows(engine, parse_dense_rows("all"))
    assert {m.dense_rows for m in _dense_layers(engine)} == {ALL_ROWS} and all(
        m.weight is None for m in _dense_layers(engine)
    )
    assert generate_all(solo_scheduler(engine), prompt, params)[0] == expected
    engine, _ = load_engine(engine_dir, dense_copy=True)
    assert "off" in apply_dense_rows(engine, parse_dense_rows("0")) and not _dense_layers(engine)
    assert generate_all(solo_scheduler(engine), prompt, params)[0] == expected


def test_without_dense_copies_there_is_nothing_to_choose(tmp_path):
    engine, _ = load_engine(make_tiny_engine(tmp_path))
    choice = choose_dense_rows(engine)
    assert choice.rows == 0 and choice.copy_bytes == 0 and "packed kernels only" in choice.describe()


def test_the_measured_choice_is_consistent(tmp_path):
    engine_dir = make_tiny_engine(tmp_path, method="ngram")
    engine, _ = load_engine(engine_dir, dense_copy=True)
    choice = choose_dense_rows(engine, measured_rows=(1, 2, 4), repeats=1)
    assert choice.rows in (0, 1, 2, 4, ALL_ROWS) and choice.measured_rows == (1, 2, 4, 32, 128)
    assert len(choice.dense_ms) == len(choice.packed_ms) == 5 and all(
        ms > 0 for ms in choice.dense_ms + choice.packed_ms
    )
    assert choice.rows == rows_from_timings(choice.measured_rows, choice.dense_ms, choice.packed_ms)
    layers = _dense_layers(engine)
    if choice.rows == ALL_ROWS:
        assert layers and all(m.weight is None for m in layers) and "dense weights only" in choice.describe()
    elif choice.rows:
        assert {m.dense_rows for m in layers} == {choice.rows} and choice.copy_bytes > 0
    else:
        assert not layers and choice.copy_bytes > 0
    assert str(choice.rows) in choice.describe() or "dropped" in choice.describe()


def _engine_with_draft_model():
    """A tiny draft-model engine whose target and draft decoders were loaded with dense copies."""
    target, draft = tiny_llama(seed=1), tiny_llama(seed=2)
    for model in (target, draft):
        prepack_linear_layers(model.model, dense_copy=True)
        prepack_linear_layers(model)
    return Deployment(target, DraftModelDrafter(draft), max_draft_len=3), draft


def test_a_draft_model_gets_the_same_threshold():
    engine, draft = _engine_with_draft_model()
    apply_dense_rows(engine, 2)
    draft_layers = [m for m in draft.modules() if isinstance(m, PrepackedLinear) and m.dense is not None]
    assert draft_layers and {m.dense_rows for m in draft_layers} == {2}
    apply_dense_rows(engine, ALL_ROWS)
    assert all(m.weight is None and m.dense_rows == ALL_ROWS for m in draft_layers)
    engine, draft = _engine_with_draft_model()
    apply_dense_rows(engine, 0)
    assert not any(isinstance(m, PrepackedLinear) and m.dense is not None for m in draft.modules())


@pytest.mark.parametrize("method, rows", [("none", 4), ("eagle", 4), ("none", ALL_ROWS), ("eagle", ALL_ROWS)])
def test_greedy_output_is_the_same_alone_and_in_a_batch_with_both_kernels_in_use(method, rows):
    from batch_helpers import make_engine, prompts, run_alone, run_batch

    engine = make_engine(method)
    model = engine.target.model
    prepack_linear_layers(model.model, dense_copy=True)
    prepack_linear_layers(model)
    if rows == ALL_ROWS:
        drop_packed_weights(model)  # F.linear on the dense weights at every row count
    else:
        set_dense_rows(model, rows)  # alone: dense kernel at 1 row; in a batch of 8: the packed kernel
    params = SamplingParams(max_tokens=16)
    ps = prompts(8, seed=11)
    outs = run_batch(engine, [(p, params) for p in ps])
    assert [o.tokens for o in outs] == [run_alone(engine, p, params) for p in ps]
