"""--draft-model local directories: flavour from config keys and tensor names, and the mismatch errors."""

import json

import pytest
from trtllm_fakes import causal_lm, eagle1_head, eagle3_head, medusa_heads

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, PresetError
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.checkpoint_flavour import CheckpointFlavourError, inspect_checkpoint
from specpipe.trtllm.preflight import ParallelismError


def test_eagle1_head_recognised(tmp_path):
    info = inspect_checkpoint(eagle1_head(tmp_path / "e", hidden=64, vocab=256, bias=True))
    assert (info.flavour, info.hidden_size, info.vocab_size, info.num_layers) == ("eagle1", 64, 256, 1)
    assert info.tensors["fc.weight"] == (64, 128)


def test_eagle3_head_recognised(tmp_path):
    info = inspect_checkpoint(eagle3_head(tmp_path / "e", hidden=64, vocab=256, draft_vocab=32))
    assert (info.flavour, info.hidden_size, info.vocab_size, info.draft_vocab_size) == ("eagle3", 64, 256, 32)


def test_medusa_heads_recognised(tmp_path):
    info = inspect_checkpoint(medusa_heads(tmp_path / "m", hidden=64, vocab=256, heads=3, layers=2))
    assert (info.flavour, info.num_heads, info.num_layers, info.hidden_size, info.vocab_size) == (
        "medusa",
        3,
        2,
        64,
        256,
    )


def test_causal_lm_recognised(tmp_path):
    info = inspect_checkpoint(causal_lm(tmp_path / "d", hidden=64, vocab=256))
    assert (info.flavour, info.hidden_size, info.vocab_size) == ("causal-lm", 64, 256)


def test_medusa_without_head_count(tmp_path):
    with pytest.raises(CheckpointFlavourError, match='Medusa config without head count.*add "medusa_num_heads": 4'):
        inspect_checkpoint(medusa_heads(tmp_path / "m", heads=4, config_heads=None))


def test_medusa_head_count_contradicts_weights(tmp_path):
    with pytest.raises(CheckpointFlavourError, match="medusa_num_heads=2 but the weights hold 4 heads"):
        inspect_checkpoint(medusa_heads(tmp_path / "m", heads=4, config_heads=2))


def test_eagle_bias_flag_contradicts_weights(tmp_path):
    with pytest.raises(CheckpointFlavourError, match="bias=true but fc.bias is absent"):
        inspect_checkpoint(eagle1_head(tmp_path / "e", bias=False, config_bias=True))


def test_training_state_folder_refused(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 4}))
    (d / "optimizer.pt").write_bytes(b"x")
    with pytest.raises(CheckpointFlavourError, match="training-state folder"):
        inspect_checkpoint(d)


def test_unrecognised_and_missing_config(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    with pytest.raises(CheckpointFlavourError, match="no config.json"):
        inspect_checkpoint(d)
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    from trtllm_fakes import header_only_safetensors

    header_only_safetensors(d / "model.safetensors", {"encoder.layer.0.weight": (4, 4)})
    with pytest.raises(CheckpointFlavourError, match="unrecognised checkpoint"):
        inspect_checkpoint(d)


# --- the same directories through the build stage, against a small local target -----------------


def request(tmp_path, target, **kw):
    kw.setdefault("runtime", "trtllm")
    return BuildRequest(target=str(target), dry_run=True, engines_dir=tmp_path / "engines", **kw)


@pytest.fixture
def target(tmp_path):
    return causal_lm(tmp_path / "tiny-target", hidden=64, layers=2, heads=4, kv=2, vocab=256, positions=16384)


def test_local_eagle1_head_plans(tmp_path, target):
    head = eagle1_head(tmp_path / "head", hidden=64, vocab=256)
    plan, _, _ = plan_build(
        request(tmp_path, target, draft="eagle", draft_model=str(head), choices="[[0], [0, 0], [1]]"),
        importable=lambda: False,
    )
    assert plan.draft.flavour == "eagle1"
    # local: no downloads; the head is prepared for the converter into the work directory
    assert [s.name for s in plan.steps] == ["first-contact", "prepare-eagle-head", "convert-target", "build-target"]
    prepare = plan.step("prepare-eagle-head")
    assert prepare.argv[1:] == [
        "-m",
        "specpipe.trtllm.prepare_eagle",
        str(head.resolve()),
        prepare.output,
        "--max-position-embeddings",
        "16384",
    ]
    assert (
        prepare.runs_in == "host" and "add a zero fc.bias, max_position_embeddings 2048 -> 16384" in prepare.description
    )
    argv = plan.step("convert-target").argv
    assert argv[argv.index("--eagle_model_dir") + 1] == prepare.output
    assert argv[argv.index("--num_eagle_layers") + 1] == "2" and argv[argv.index("--max_draft_len") + 1] == "63"


def test_draft_model_with_draft_none_picks_method_from_flavour(tmp_path, target):
    heads = medusa_heads(tmp_path / "heads", hidden=64, vocab=256, heads=4)
    plan, _, _ = plan_build(request(tmp_path, target, draft="none", draft_model=str(heads)), importable=lambda: False)
    assert plan.draft.method == "medusa" and plan.preflight.speculative.num_medusa_heads == 4


@pytest.mark.parametrize(
    "make, draft, message",
    [
        (
            lambda p: eagle1_head(p, hidden=96, heads=4, vocab=256),
            "eagle",
            "EAGLE head .* has hidden size 96, target tiny-target has 64",
        ),
        (lambda p: eagle1_head(p, hidden=64, vocab=512), "eagle", "has vocabulary 512, target tiny-target has 256"),
        (
            lambda p: eagle1_head(p, hidden=64, vocab=256, inter=96),
            "eagle",
            "intermediate_size 96, target tiny-target has 128",
        ),
        (lambda p: medusa_heads(p, hidden=64, vocab=300), "medusa", "Medusa heads .* has vocabulary 300"),
        (
            lambda p: causal_lm(p, hidden=32, heads=4, kv=2, vocab=300),
            "none",
            "draft model .* has vocabulary 300 .* target tiny-target has 256",
        ),
        (
            lambda p: medusa_heads(p, hidden=64, vocab=256),
            "eagle",
            "is a Medusa heads, but --draft eagle needs EAGLE heads",
        ),
        (
            lambda p: eagle3_head(p, hidden=64, vocab=256),
            "eagle",
            "EAGLE-3 head .* runs only on TensorRT-LLM's LLM API flow",
        ),
    ],
)
def test_heads_made_for_another_model_are_refused(tmp_path, target, make, draft, message):
    head = make(tmp_path / "head")
    with pytest.raises(CompatibilityError, match=message):
        plan_build(request(tmp_path, target, draft=draft, draft_model=str(head)), importable=lambda: False)
    assert not (tmp_path / "engines").exists()


def test_eagle3_head_plans_on_the_llm_api(tmp_path, target):
    head = eagle3_head(tmp_path / "head", hidden=64, vocab=256)
    plan, _, _ = plan_build(
        request(tmp_path, target, draft="eagle", draft_model=str(head), runtime="trtllm-llmapi"),
        importable=lambda: False,
    )
    doc = plan.as_dict()
    assert [s["name"] for s in doc["steps"]] == ["first-contact"] and doc["llmapi"]["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model": str(head.resolve()),
        "eagle3_one_model": True,
    }


def test_medusa_tree_deeper_than_heads(tmp_path, target):
    heads = medusa_heads(tmp_path / "heads", hidden=64, vocab=256, heads=2)
    with pytest.raises(
        CompatibilityError, match="medusa_choices tree is 4 deep, the draft has 2 Medusa heads .*heads with more levels"
    ):
        plan_build(request(tmp_path, target, draft="medusa", draft_model=str(heads)), importable=lambda: False)
    plan, _, _ = plan_build(
        request(
            tmp_path, target, draft="medusa", draft_model=str(heads), choices="[[0], [0, 0], [1]]", max_draft_len=3
        ),
        importable=lambda: False,
    )
    assert plan.preflight.speculative.max_draft_len == 3


def test_draft_model_on_method_without_weights(tmp_path, target):
    with pytest.raises(PresetError, match="--draft-model has no meaning with --draft lookahead"):
        plan_build(
            request(tmp_path, target, draft="lookahead", draft_model=str(causal_lm(tmp_path / "d"))),
            importable=lambda: False,
        )


def test_draft_tp_must_divide_draft_heads(tmp_path, target):
    draft = causal_lm(tmp_path / "d", hidden=48, heads=3, kv=1, vocab=256)
    with pytest.raises(ParallelismError, match="--tp 2 does not divide the 3 attention heads of draft"):
        plan_build(request(tmp_path, target, draft="none", draft_model=str(draft), tp=2), importable=lambda: False)
