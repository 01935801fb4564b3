"""The first-contact check validates the very model.yaml ``specpipe package`` writes: one builder
(specpipe.trtllm.llmapi_args.model_yaml) for both, compared here on every LLM API mode, from a plan
object (build's first step), a plan file (``doctor --plan``) and a packaged engine or plan."""

import pytest
import yaml
from trtllm_deployments import LLMAPI_MODES, engine_dir, make_plan, plan_json

from specpipe.triton.repository import package_engine, package_plan
from specpipe.trtllm import doctor


def packaged_yaml(repo):
    return yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())


@pytest.mark.parametrize("mode", sorted(LLMAPI_MODES))
def test_the_checked_model_yaml_is_the_packaged_one(tmp_path, mode):
    options = LLMAPI_MODES[mode]
    checked = yaml.safe_load(doctor.check_input(make_plan(tmp_path, "trtllm-llmapi", **options))["model_yaml"])
    packaged = packaged_yaml(package_engine(engine_dir(tmp_path, "trtllm-llmapi", **options), tmp_path / "repo" / "e"))
    assert checked == packaged
    assert {"kv_cache_config", "triton_config", "max_seq_len"} <= set(checked)
    assert checked["model"].startswith("/engines/.trtllm-work/download-target-")
    if mode == "draft-model":
        assert checked["disable_overlap_scheduler"] is True


@pytest.mark.parametrize("mode", ["eagle", "draft-model"])
def test_a_plan_file_checks_the_model_yaml_packaged_from_that_plan(tmp_path, mode):
    path = plan_json(tmp_path, runtime="trtllm-llmapi", **LLMAPI_MODES[mode])
    checked = yaml.safe_load(doctor.read_plan_file(path)["model_yaml"])
    assert checked == packaged_yaml(package_plan(path, None, tmp_path / "repo"))


def test_without_a_gpu_the_model_yaml_is_not_checked_and_says_why(tmp_path):
    doc = doctor.check_input(make_plan(tmp_path, "trtllm-llmapi", gpu=None, **LLMAPI_MODES["eagle"]))
    assert "model_yaml" not in doc
    assert doc["not_checked"][0]["what"] == "model.yaml (LLM API arguments)"
    assert "the memory plan names no GPU" in doc["not_checked"][0]["why"] and "--gpu" in doc["not_checked"][0]["why"]
