"""LLM API repositories: model.yaml and the trtllm-serve options follow the pinned release's option
names (decoding_type spellings, keys), the config leaves batching to model.yaml, bad methods refused."""

import dataclasses

import pytest
import yaml
from trtllm_deployments import LLMAPI_MODES, engine_dir, plan_json

from specpipe.errors import SpecpipeError
from specpipe.speculative import METHODS, Method, Runtime
from specpipe.triton.config import find_placeholders, read_config
from specpipe.triton.deployment import from_manifest
from specpipe.triton.llmapi import llm_arguments, speculative_config
from specpipe.triton.models import llmapi_shim
from specpipe.triton.repository import package_engine, package_plan
from specpipe.triton.writer import model_py
from specpipe.trtllm import llmapi_schema as schema
from specpipe.trtllm import release

EXPECTED_TYPE = {"none": None, "eagle": "Eagle3", "ngram": "NGram", "draft-model": "Draft_Target"}


@pytest.fixture(scope="module", params=sorted(LLMAPI_MODES))
def packaged(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    engine = engine_dir(tmp, runtime="trtllm-llmapi", **LLMAPI_MODES[request.param])
    return request.param, engine, package_engine(engine, tmp / "triton_repo" / "x")


def test_layout_and_config(packaged):
    _, _, repo = packaged
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()) == [
        "specpipe.json",
        "tensorrt_llm/1/model.py",
        "tensorrt_llm/1/model.yaml",
        "tensorrt_llm/config.pbtxt",
        "trtllm-serve.yaml",
    ]
    config = read_config(repo / "tensorrt_llm" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 0
    assert config.parameters[llmapi_shim.MODEL_DIR_PARAMETER].string_value == release.CONTAINER_LLMAPI_MODEL_DIR
    assert not config.HasField("model_transaction_policy")  # set by the model from model.yaml's triton_config
    names = {i.name for i in config.input}
    assert {"text_input", "streaming", "sampling_param_max_tokens", "sampling_param_return_perf_metrics"} <= names
    assert {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= {o.name for o in config.output}
    assert find_placeholders(repo) == []


def test_model_yaml_uses_the_release_spelling_and_keys(packaged):
    mode, engine, repo = packaged
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert set(doc) - {"triton_config"} <= schema.TOP_LEVEL_KEYS
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert doc["backend"] == "pytorch" and doc["tensor_parallel_size"] == 1 and doc["pipeline_parallel_size"] == 1
    assert doc["model"].startswith("/engines/.trtllm-work/download-target-meta-llama--llama-3.1-8b-instruct-")
    assert (
        set(doc["kv_cache_config"]) <= schema.KV_CACHE_KEYS
        and 0 < doc["kv_cache_config"]["free_gpu_memory_fraction"] < 1
    )
    spec = doc.get("speculative_config")
    assert (spec or {}).get("decoding_type") == EXPECTED_TYPE[mode]
    if spec is None:
        return
    assert set(spec) <= schema.ACCEPTED_KEYS[spec["decoding_type"]]
    if spec["decoding_type"] in schema.NEEDS_MODEL:
        assert spec["speculative_model"].startswith("/engines/.trtllm-work/download-draft-")
    assert spec["max_draft_len"] == {"eagle": 3, "ngram": 5, "draft-model": 4}[mode]
    assert doc.get("disable_overlap_scheduler") is (True if mode == "draft-model" else None)
    if mode == "ngram":
        assert spec["max_matching_ngram_size"] == 3


def test_trtllm_serve_options_are_the_same_llm_arguments(packaged):
    _, _, repo = packaged
    model = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    options_text = (repo / "trtllm-serve.yaml").read_text()
    options = yaml.safe_load(options_text)
    assert options == {k: v for k, v in model.items() if k not in ("model", "backend", "triton_config")}
    first = options_text.splitlines()[0]
    assert first.startswith(
        f"# trtllm-serve {model['model']} --backend pytorch --tp_size 1 --pp_size 1 --extra_llm_api_options /models/trtllm-serve.yaml"
    )


def test_model_py_is_the_shipped_shim(packaged, tmp_path, monkeypatch):
    _, _, repo = packaged
    text = (repo / "tensorrt_llm" / "1" / "model.py").read_text()
    assert text == model_py("specpipe.triton.models.llmapi_shim")
    # The shim hands every call to the model.py in the directory the config names.
    fake = tmp_path / "container"
    fake.mkdir()
    (fake / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args): self.args = args\n"
        "    def execute(self, requests): return [r * 2 for r in requests]\n"
    )
    config = {"parameters": {llmapi_shim.MODEL_DIR_PARAMETER: {"string_value": str(fake)}}}
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    model = llmapi_shim.TritonPythonModel()
    model.initialize({"model_config": __import__("json").dumps(config)})
    assert model.execute([1, 2]) == [2, 4] and model._model.args["model_config"]
    config["parameters"][llmapi_shim.MODEL_DIR_PARAMETER]["string_value"] = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="serve this repository in the TensorRT-LLM container"):
        model.initialize({"model_config": __import__("json").dumps(config)})


def test_every_llmapi_method_writes_keys_its_config_class_accepts():
    """The registry's decoding types are release literals, and the keys specpipe writes for each exist."""
    for method, spec in METHODS.items():
        if method is Method.NONE or not spec.runs_on(Runtime.TRTLLM_LLMAPI):
            continue
        assert spec.decoding_type in schema.ACCEPTED_KEYS, method
        assert (spec.decoding_type in schema.NEEDS_MODEL) == (spec.weights is not None), method
    for keys in schema.ACCEPTED_KEYS.values():
        assert {"decoding_type", "max_draft_len", "speculative_model"} <= keys
    assert "DraftTarget" not in schema.ACCEPTED_KEYS and "Eagle" not in schema.ACCEPTED_KEYS


def test_refused_methods(tmp_path):
    deployment = from_manifest(engine_dir(tmp_path, runtime="trtllm-llmapi", **LLMAPI_MODES["eagle"]))
    for method in ("medusa", "lookahead"):
        spec = dataclasses.replace(deployment.speculative, method=Method(method), max_draft_len=4)
        with pytest.raises(SpecpipeError, match=f"{method} does not run on TensorRT-LLM's LLM API .* --runtime trtllm"):
            speculative_config(dataclasses.replace(deployment, speculative=spec))
    with pytest.raises(SpecpipeError, match="--pp 2 with eagle on --runtime trtllm-llmapi: EAGLE-3 does not support"):
        speculative_config(dataclasses.replace(deployment, pp=2))
    for method in ("ngram", "draft-model"):  # any drafter meets PyExecutor's PP loop refusal
        spec = dataclasses.replace(deployment.speculative, method=Method(method), tree=None)
        with pytest.raises(SpecpipeError, match="NotImplementedError .* use --pp 1 and raise --tp instead"):
            speculative_config(dataclasses.replace(deployment, speculative=spec, pp=2))


def test_checkpoint_outside_the_engines_root_is_refused(tmp_path):
    deployment = from_manifest(engine_dir(tmp_path, runtime="trtllm-llmapi", **LLMAPI_MODES["none"]))
    moved = dataclasses.replace(deployment, target_path=tmp_path / "elsewhere")
    with pytest.raises(SpecpipeError, match="is outside the engines root .* copy it under"):
        llm_arguments(moved)


def test_llmapi_plan_packages(tmp_path):
    plan = plan_json(tmp_path, runtime="trtllm-llmapi", **LLMAPI_MODES["eagle"])
    repo = package_plan(plan, "preview", tmp_path / "repos")
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert (
        doc["speculative_config"]["decoding_type"] == "Eagle3" and doc["speculative_config"]["eagle3_one_model"] is True
    )
