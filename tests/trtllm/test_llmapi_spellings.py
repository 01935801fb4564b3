"""LLM API ``speculative_config`` spellings by TensorRT-LLM release: one builder, one sourced table."""

import dataclasses

import pytest
from trtllm_deployments import LLMAPI_MODES, engine_dir, make_plan

from specpipe.errors import SpecpipeError
from specpipe.speculative import METHODS, Method, Runtime, SpeculativeSettings
from specpipe.triton.deployment import from_manifest
from specpipe.triton.llmapi import speculative_config
from specpipe.trtllm import llmapi_schema as schema
from specpipe.trtllm.release import TRTLLM_VERSION


def test_the_pinned_release_row_is_the_registry_spelling():
    row = schema.spelling_for(TRTLLM_VERSION)
    for method, spec in METHODS.items():
        if method is not Method.NONE and spec.runs_on(Runtime.TRTLLM_LLMAPI):
            assert row.decoding_types[method] == spec.decoding_type
    assert all(r.source for r in schema.SPELLINGS.values())


@pytest.mark.parametrize(
    "version, eagle, draft_target, key",
    [
        ("1.0.0", "Eagle", "DraftTarget", "speculative_model_dir"),
        ("1.1.0", "Eagle", "DraftTarget", "speculative_model_dir"),
        ("1.2.1", "Eagle3", "Draft_Target", "speculative_model"),
        ("1.3.0rc2", "Eagle3", "Draft_Target", "speculative_model"),  # newer container: newest row
    ],
)
def test_spellings_follow_the_release(version, eagle, draft_target, key):
    e = schema.build_speculative_config(SpeculativeSettings(Method.EAGLE, max_draft_len=3), "/d", version)
    d = schema.build_speculative_config(SpeculativeSettings(Method.DRAFT_MODEL, max_draft_len=4), "/d", version)
    assert (e["decoding_type"], d["decoding_type"], d[key]) == (eagle, draft_target, "/d")
    assert schema.build_speculative_config(SpeculativeSettings(Method.NONE), None, version) is None


def test_too_old_release_is_refused():
    with pytest.raises(SpecpipeError, match="TensorRT-LLM 0.20.0 predates the LLM API spellings"):
        schema.spelling_for("0.20.0")


def test_plan_and_repository_build_the_same_config(tmp_path):
    for name in ("eagle", "ngram", "draft-model"):
        plan = make_plan(tmp_path / name, runtime="trtllm-llmapi", **LLMAPI_MODES[name])
        deployment = from_manifest(engine_dir(tmp_path / (name + "-e"), runtime="trtllm-llmapi", **LLMAPI_MODES[name]))
        planned = plan.as_dict()["llmapi"]["speculative_config"]
        written = speculative_config(deployment)
        assert {k: v for k, v in planned.items() if k != "speculative_model"} == {
            k: v for k, v in written.items() if k != "speculative_model"
        }
        older = speculative_config(dataclasses.replace(deployment, trtllm_version="1.1.0"))
        assert older["decoding_type"] == schema.SPELLINGS["1.1"].decoding_types[Method(name)]
