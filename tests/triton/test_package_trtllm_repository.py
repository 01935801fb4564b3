"""Engine-flow repositories for every speculative mode: strict configs, wiring, backend parameters,
settings that agree with the engine manifest, packaging from a plan, and bad input."""

import json
import shutil

import pytest
from backend_oracle import parse_like_backend
from click.testing import CliRunner
from tritonclient.grpc import model_config_pb2 as mc
from trtllm_deployments import ENGINE_MODES, engine_dir, plan_json

from specpipe.cli import main
from specpipe.errors import SpecpipeError
from specpipe.tree import MC_SIM_7B_63, Tree, TreeError
from specpipe.triton.backend_parameters import DECODING_MODES, PARAMETERS, REQUIRED, value_problems
from specpipe.triton.config import ensemble_problems, find_placeholders, read_config
from specpipe.triton.repository import package_engine, package_plan
from specpipe.trtllm.kv_fraction import kv_cache_fractions

EXPECTED_MODE = {
    "none": "top_k_top_p",
    "eagle": "eagle",
    "medusa": "medusa",
    "lookahead": "lookahead",
    "draft-model": "top_k_top_p",
}


def params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def configs(repo):
    return {p.parent.name: read_config(p) for p in repo.glob("*/config.pbtxt")}


@pytest.fixture(scope="module", params=sorted(ENGINE_MODES))
def packaged(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    engine = engine_dir(tmp, **ENGINE_MODES[request.param])
    repo = package_engine(engine, tmp / "triton_repo" / "x")
    manifest = json.loads((engine / "manifest.json").read_text())
    return request.param, engine, repo, manifest


def test_configs_parse_strictly_and_the_ensemble_resolves(packaged):
    mode, _, repo, _ = packaged
    found = configs(repo)
    expected = {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"}
    if mode == "draft-model":
        expected |= {"tensorrt_llm_draft", "tensorrt_llm_bls"}
    assert set(found) == expected
    steps = {name: cfg for name, cfg in found.items() if name != "ensemble"}
    assert ensemble_problems(found["ensemble"], steps) == []
    assert [s.model_name for s in found["ensemble"].ensemble_scheduling.step] == [
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
    ]
    assert find_placeholders(repo) == []
    assert (
        (repo / "preprocessing" / "1" / "model.py")
        .read_text()
        .endswith("from specpipe.triton.models.preprocessing import TritonPythonModel  # noqa: F401\n")
    )


def test_engine_models_use_the_tensorrtllm_backend_with_explicit_known_parameters(packaged):
    mode, engine, repo, manifest = packaged
    found = configs(repo)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        if name not in found:
            continue
        cfg = found[name]
        assert cfg.backend == "tensorrtllm" and cfg.model_transaction_policy.decoupled
        assert cfg.max_batch_size == manifest["limits"]["max_batch_size"] == 8
        assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
        p = params(cfg)
        assert set(p) <= set(PARAMETERS) and set(REQUIRED) <= set(p)
        assert value_problems(p) == []
        assert p["gpt_model_type"] == "inflight_fused_batching" and p["max_beam_width"] == "1"
        assert p["tokenizer_dir"] == f"/engines/{engine.name}/tokenizer"
        assert p["exclude_input_in_output"] == "false"
        sub = "draft" if name == "tensorrt_llm_draft" else "target"
        assert p["gpt_model_path"] == f"/engines/{engine.name}/{sub}"
        assert p["decoding_mode"] in DECODING_MODES
    ragged = {i.name for i in found["tensorrt_llm"].input if i.allow_ragged_batch}
    assert {"input_ids", "draft_input_ids", "stop_words_list", "bad_words_list"} <= ragged


def test_decoding_mode_and_choices_agree_with_the_manifest(packaged):
    mode, _, repo, manifest = packaged
    spec = manifest["speculative"]
    p = params(read_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert p["decoding_mode"] == EXPECTED_MODE[mode]
    tree_key = {"eagle": "eagle_choices", "medusa": "medusa_choices"}.get(mode)
    for key in ("eagle_choices", "medusa_choices"):
        if key == tree_key:
            assert parse_like_backend(p[key]) == spec["choices"]
            assert (
                max(len(path) for path in spec["choices"])
                <= spec[{"eagle": "num_eagle_layers"}.get(mode, "num_medusa_heads")]
            )
        else:
            assert key not in p
    lookahead = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
    assert [p.get(key) for key in lookahead] == (
        [str(v) for v in spec["lookahead"]] if mode == "lookahead" else [None] * 3
    )
    if mode == "lookahead":
        assert (p["lookahead_window_size"], p["lookahead_ngram_size"], p["lookahead_verification_set_size"]) == (
            "7",
            "7",
            "7",
        )


def test_kv_cache_fraction_comes_from_the_memory_plan(packaged):
    mode, _, repo, manifest = packaged
    memory = manifest["trtllm"]["memory"]
    target, draft = kv_cache_fractions(memory, mode == "draft-model")
    found = configs(repo)
    assert params(found["tensorrt_llm"])["kv_cache_free_gpu_mem_fraction"] == f"{target:.2f}"
    fixed = sum(memory[k] for k in ("target_weights", "draft_weights", "activations", "runtime_overhead"))
    free, usable = memory["gpu_memory"] - fixed, memory["usable"] - fixed
    if mode == "draft-model":
        assert params(found["tensorrt_llm_draft"])["kv_cache_free_gpu_mem_fraction"] == f"{draft:.2f}"
        assert (target + draft) * free <= usable  # the two pools never exceed the plan, in any load order
        assert target * free >= memory["target_kv_cache"] and draft * free >= memory["draft_kv_cache"] * 0.99
    else:
        assert draft is None and 0.5 < target <= usable / free


def test_draft_target_has_a_draft_engine_and_the_bls(packaged):
    mode, _, repo, manifest = packaged
    if mode != "draft-model":
        assert not (repo / "tensorrt_llm_bls").exists()
        return
    bls = read_config(repo / "tensorrt_llm_bls" / "config.pbtxt")
    assert bls.backend == "python" and bls.model_transaction_policy.decoupled
    p = params(bls)
    assert p["num_draft_tokens"] == p["max_draft_len"] == str(manifest["speculative"]["max_draft_len"]) == "4"
    assert p["tensorrt_llm_model_name"] == "tensorrt_llm" and p["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft"
    inputs = {i.name: i for i in bls.input}
    assert inputs["num_draft_tokens"].data_type == mc.TYPE_INT32 and inputs["num_draft_tokens"].optional
    assert inputs["use_draft_logits"].data_type == mc.TYPE_BOOL
    assert (
        params(read_config(repo / "tensorrt_llm_draft" / "config.pbtxt"))["speculative_decoding_fast_logits"] == "false"
    )
    meta = json.loads((repo / "specpipe.json").read_text())
    assert meta["rank_models"] == ["tensorrt_llm", "tensorrt_llm_draft"] and meta["world_size"] == 1


def test_a_plan_packages_to_the_same_repository_before_the_build(tmp_path):
    plan = plan_json(tmp_path, **ENGINE_MODES["eagle"])
    result = CliRunner().invoke(
        main, ["package", "--from-plan", str(plan), "--name", "review", "--repo-dir", str(tmp_path / "repos")]
    )
    assert result.exit_code == 0, result.output
    from_plan = tmp_path / "repos" / "review"
    built = package_engine(engine_dir(tmp_path / "b", **ENGINE_MODES["eagle"]), tmp_path / "built")
    a, b = configs(from_plan), configs(built)
    assert set(a) == set(b)
    for name in a:
        if name == "ensemble":
            assert a[name] == b[name]
            continue
        pa, pb = params(a[name]), params(b[name])
        # Same settings; only the engines root differs (the build used another folder).
        assert {k: v for k, v in pa.items() if not v.startswith("/engines")} == {
            k: v for k, v in pb.items() if not v.startswith("/engines")
        }
    assert json.loads((from_plan / "specpipe.json").read_text())["origin"] == "plan"


def test_backend_text_round_trips_through_the_backend_parser():
    text = Tree(MC_SIM_7B_63).to_backend_text()
    assert text.startswith("{0}, {0, 0}, {1}, {0, 1}") and "{{" not in text
    assert parse_like_backend(text) == [list(p) for p in MC_SIM_7B_63]
    assert Tree.parse(text) == Tree(MC_SIM_7B_63)  # and specpipe reads the backend's text back
    with pytest.raises(ValueError, match="stoi"):
        parse_like_backend("{" + text + "}")  # outer braces break the backend's parser
    with pytest.raises(TreeError, match="non-empty list of paths"):
        Tree.parse([])


def test_value_problems_name_what_the_backend_would_reject():
    problems = value_problems(
        {
            "gpt_model_path": "/x",
            "max_beam_width": "one",
            "decoding_mode": "draft_tokens_external",
            "enable_kv_cache_reuse": "yes",
            "worker_path": "/w",
            "tokenizer_dir": "",
        }
    )
    assert "'worker_path' is not a parameter the tensorrtllm backend reads" in problems
    assert "required parameter 'guided_decoding_backend' is missing" in problems
    assert "'max_beam_width' = 'one' is not a non-negative integer" in problems
    assert "'enable_kv_cache_reuse' = 'yes' is not a boolean the backend accepts" in problems
    assert any("'decoding_mode' = 'draft_tokens_external'" in p for p in problems)
    assert value_problems(
        {
            "decoding_mode": "lookahead",
            "tokenizer_dir": "",
            "xgrammar_tokenizer_info_path": "",
            "guided_decoding_backend": "",
        }
    ) == [
        f"decoding_mode lookahead needs '{k}'"
        for k in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
    ]


# --- bad input: a clear error and nothing written -------------------------------------------------


def _edit_manifest(engine, change):
    manifest = json.loads((engine / "manifest.json").read_text())
    change(manifest)
    (engine / "manifest.json").write_text(json.dumps(manifest))


def test_directory_without_manifest(tmp_path):
    (tmp_path / "engines" / "bare").mkdir(parents=True)
    with pytest.raises(SpecpipeError, match="has no manifest.json: it is not a specpipe engine directory"):
        package_engine(tmp_path / "engines" / "bare", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_manifest_from_another_release_leaves_the_old_repository(tmp_path):
    engine = engine_dir(tmp_path, **ENGINE_MODES["eagle"])
    repo = package_engine(engine, tmp_path / "repo")
    before = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    _edit_manifest(engine, lambda m: m["trtllm"].update(version="1.1.0"))
    with pytest.raises(SpecpipeError, match="is for TensorRT-LLM 1.1.0, this specpipe packages TensorRT-LLM 1.2.1"):
        package_engine(engine, repo)
    assert (repo / "tensorrt_llm" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines", "repo"]


def test_choices_deeper_than_the_eagle_layers(tmp_path):
    engine = engine_dir(tmp_path, **ENGINE_MODES["eagle"])
    _edit_manifest(
        engine, lambda m: m["speculative"].update(choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]])
    )
    with pytest.raises(
        SpecpipeError, match="the eagle_choices tree is 5 deep, the draft has 4 EAGLE layers .*rebuild with more"
    ):
        package_engine(engine, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_plan_without_a_gpu(tmp_path):
    plan = plan_json(tmp_path, gpu=None, **ENGINE_MODES["none"])
    with pytest.raises(SpecpipeError, match="memory plan names no GPU.*--gpu"):
        package_plan(plan, "x", tmp_path / "repos")
    assert not (
        tmp_path / "repos"
    ).exists()  # refused before anything is written: no repository, no temporary directory


def test_draft_target_engine_without_its_draft(tmp_path):
    engine = engine_dir(tmp_path, **ENGINE_MODES["draft-model"])
    shutil.rmtree(engine / "draft")
    with pytest.raises(SpecpipeError, match="draft-target engine without its draft/ engine"):
        package_engine(engine, tmp_path / "repo")
