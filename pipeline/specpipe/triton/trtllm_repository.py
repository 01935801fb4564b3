"""The Triton model repository of a TensorRT-LLM engine-flow deployment (``--runtime trtllm``).

Layout (model names and ensemble wiring of TensorRT-LLM's ``inflight_batcher_llm`` repository)::

    triton_repo/NAME/
      specpipe.json                  runtime, release, container, world size (read by the launcher)
      ensemble/                      preprocessing -> tensorrt_llm -> postprocessing
      preprocessing/                 Python: specpipe.triton.models.preprocessing (as the CPU runtime)
      postprocessing/                Python: specpipe.triton.models.postprocessing (as the CPU runtime)
      tensorrt_llm/                  backend "tensorrtllm": the target engine, decoupled, in-flight batching
      tensorrt_llm_draft/            draft-target only: the draft engine
      tensorrt_llm_bls/              draft-target only: specpipe.triton.models.bls (draft, verify, stream)

Every ``tensorrt_llm*`` parameter is set explicitly, and only keys the backend reads are written
(:mod:`specpipe.triton.backend_parameters`); paths are the container's (:mod:`specpipe.triton.deployment`);
``decoding_mode``, choices and lookahead sizes come from the engine's manifest (or plan), the KV-cache
fraction from its memory plan (:mod:`specpipe.triton.kv_fraction`). The repository is written to a
temporary directory, checked (configs parsed back strictly, ensemble wiring, backend parameter
values, no ``${``) and renamed into place.
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from specpipe.errors import SpecpipeError
from specpipe.fsutil import write_dir_atomically
from specpipe.triton.backend_parameters import value_problems
from specpipe.triton.choices_param import choices_text
from specpipe.triton.config import (
    check_ensemble,
    check_no_placeholders,
    ensemble_model_config,
    model_input,
    model_output,
    python_model_config,
    read_config,
    write_config,
)
from specpipe.triton.deployment import Deployment
from specpipe.triton.interface import (
    ENGINE_ENSEMBLE_STEPS,
    ENSEMBLE,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM_BLS,
    TENSORRT_LLM_ENGINE,
)
from specpipe.triton.kv_fraction import kv_cache_fractions
from specpipe.triton.repo_meta import deployment_meta, write_meta

BACKEND = "tensorrtllm"
TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
BLS_MODEL = TENSORRT_LLM_BLS.name
VERSION_DIR = "1"

#: specpipe speculative method -> the backend's ``decoding_mode`` (draft-target and none have no mode of
#: their own: ``top_k_top_p``, the backend's default for beam width 1).
DECODING_MODE = {"eagle": "eagle", "medusa": "medusa", "lookahead": "lookahead", "draft-model": "top_k_top_p",
                 "none": "top_k_top_p"}

PYTHON_MODULES = {
    PREPROCESSING.name: "specpipe.triton.models.preprocessing",
    POSTPROCESSING.name: "specpipe.triton.models.postprocessing",
    BLS_MODEL: "specpipe.triton.models.bls",
}


def engine_parameters(deployment: Deployment, engine_path: str, kv_fraction: float, *, draft: bool) -> dict[str, str]:
    """Parameters of a ``tensorrt_llm``/``tensorrt_llm_draft`` model (all text, as Triton stores them)."""
    method = deployment.method
    spec = deployment.speculative
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_path,
        "max_beam_width": "1",
        "kv_cache_free_gpu_mem_fraction": f"{kv_fraction:.2f}",
        "enable_kv_cache_reuse": "true",
        "batch_scheduler_policy": "guaranteed_no_evict",
        "enable_chunked_context": "false",
        "exclude_input_in_output": "false",
        "normalize_log_probs": "true",
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "tokenizer_dir": deployment.container_path(deployment.tokenizer_path),
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
        "decoding_mode": "top_k_top_p" if draft else DECODING_MODE[method],
    }
    if draft or method == "draft-model":
        params["speculative_decoding_fast_logits"] = "false"
    if not draft and method == "eagle":
        params["eagle_choices"] = choices_text(spec["eagle_choices"])
    if not draft and method == "medusa":
        params["medusa_choices"] = choices_text(spec["medusa_choices"])
    if not draft and method == "lookahead":
        for key in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"):
            params[key] = str(int(spec[key]))
    return params


def engine_model_config(name: str, parameters: dict[str, str], max_batch_size: int) -> mc.ModelConfig:
    """Config of a model served by the tensorrtllm backend: decoupled, one ``KIND_CPU`` instance (the
    backend places the engine on the GPUs itself), dynamic batching feeding in-flight batching.

    Raises:
        SpecpipeError: a parameter the backend would not read, a missing required one, or a value it
            would not parse.
    """
    problems = value_problems(parameters)
    if problems:
        raise SpecpipeError(f"model '{name}' would get parameters the tensorrtllm backend rejects: {'; '.join(problems)}")
    config = mc.ModelConfig(name=name, backend=BACKEND, max_batch_size=max_batch_size)
    config.input.extend(model_input(s) for s in TENSORRT_LLM_ENGINE.inputs)
    config.output.extend(model_output(s) for s in TENSORRT_LLM_ENGINE.outputs)
    config.model_transaction_policy.decoupled = True
    config.dynamic_batching.preferred_batch_size.append(max_batch_size)
    config.dynamic_batching.max_queue_delay_microseconds = 0
    config.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


def bls_parameters(deployment: Deployment) -> dict[str, str]:
    """Parameters of ``tensorrt_llm_bls`` (draft-target)."""
    return {
        "tensorrt_llm_model_name": TARGET_MODEL,
        "tensorrt_llm_draft_model_name": DRAFT_MODEL,
        "preprocessing_model_name": PREPROCESSING.name,
        "postprocessing_model_name": POSTPROCESSING.name,
        "num_draft_tokens": str(deployment.max_draft_len),
        "max_draft_len": str(deployment.max_draft_len),
        "draft_logits_available": "false",
        "max_concurrent_requests": str(deployment.limits.get("max_batch_size", 1)),
    }


def model_py(module: str) -> str:
    """Text of a repository ``model.py`` that loads ``TritonPythonModel`` from ``module``."""
    from specpipe.triton.repository import model_py as text

    return text(module)


def repository_configs(deployment: Deployment) -> dict[str, mc.ModelConfig]:
    """Every model config of the repository, keyed by model name (ensemble last)."""
    if deployment.runtime != "trtllm":
        raise SpecpipeError(f"engine {deployment.name} is for '{deployment.runtime}': use the LLM API repository writer")
    two = deployment.method == "draft-model"
    target_fraction, draft_fraction = kv_cache_fractions(deployment.memory, two)
    tokenizer = {"tokenizer_dir": deployment.container_path(deployment.tokenizer_path)}
    max_batch = int(deployment.limits.get("max_batch_size", 1))
    configs = {
        PREPROCESSING.name: python_model_config(PREPROCESSING, {**tokenizer, "add_special_tokens": "true"}),
        TARGET_MODEL: engine_model_config(
            TARGET_MODEL, engine_parameters(deployment, deployment.container_path(deployment.target_path),
                                            target_fraction, draft=False), max_batch),
        POSTPROCESSING.name: python_model_config(POSTPROCESSING, {**tokenizer, "skip_special_tokens": "true"}),
    }
    if two:
        configs[DRAFT_MODEL] = engine_model_config(
            DRAFT_MODEL, engine_parameters(deployment, deployment.container_path(deployment.draft_path),
                                           draft_fraction, draft=True), max_batch)
        configs[BLS_MODEL] = python_model_config(TENSORRT_LLM_BLS, bls_parameters(deployment), decoupled=True)
    ensemble = ensemble_model_config(steps=ENGINE_ENSEMBLE_STEPS)
    check_ensemble(ensemble, configs)
    configs[ENSEMBLE.name] = ensemble
    return configs


def _fill(root: Path, deployment: Deployment) -> None:
    configs = repository_configs(deployment)
    for name, config in configs.items():
        (root / name / VERSION_DIR).mkdir(parents=True)
        write_config(config, root / name)
        if name in PYTHON_MODULES:
            (root / name / VERSION_DIR / "model.py").write_text(model_py(PYTHON_MODULES[name]))
    rank_models = [TARGET_MODEL] + ([DRAFT_MODEL] if DRAFT_MODEL in configs else [])
    write_meta(root, deployment_meta(deployment, rank_models))
    on_disk = {name: read_config(root / name / "config.pbtxt") for name in configs if name != ENSEMBLE.name}
    check_ensemble(read_config(root / ENSEMBLE.name / "config.pbtxt"), on_disk)
    check_no_placeholders(root)


def write_engine_repository(deployment: Deployment, out_dir: Path) -> Path:
    """Write the engine-flow repository of ``deployment`` to ``out_dir`` (replaced as a whole).

    Raises:
        SpecpipeError: the deployment cannot be served as configured (see the checks above); nothing
            is written then.
    """
    return write_dir_atomically(out_dir, lambda root: _fill(root, deployment))
