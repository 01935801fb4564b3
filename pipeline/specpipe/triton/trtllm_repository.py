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
``decoding_mode`` (the registry's :attr:`~specpipe.speculative.MethodSpec.decoding_mode`), the tree
(:meth:`specpipe.tree.Tree.to_backend_text` under the registry's ``choices_key``) and lookahead sizes
come from the engine's manifest (or plan), the KV-cache fraction from its memory plan
(:mod:`specpipe.trtllm.kv_fraction`). Backend parameter values are checked here; :mod:`specpipe.triton.writer`
writes the repository (configs parsed back strictly, ensemble wiring, no ``${``).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from specpipe.errors import SpecpipeError
from specpipe.speculative import Runtime
from specpipe.triton.backend_parameters import value_problems
from specpipe.triton.config import ensemble_model_config, model_input, model_output, python_model_config
from specpipe.triton.deployment import Deployment
from specpipe.triton.interface import (
    ENGINE_ENSEMBLE_STEPS,
    ENSEMBLE,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM_BLS,
    TENSORRT_LLM_ENGINE,
)
from specpipe.triton.repo_meta import LAUNCH_ORCHESTRATOR, META_NAME, deployment_meta, launch_mode, meta_text
from specpipe.triton.warmup_config import add_engine_warmup
from specpipe.triton.writer import MODULES, STEP_MODULES, Repository
from specpipe.trtllm.kv_fraction import kv_cache_fractions

BACKEND = "tensorrtllm"
TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
BLS_MODEL = TENSORRT_LLM_BLS.name
#: The draft engine's ``decoding_mode``: it drafts plainly (the backend's default for beam width 1).
DRAFT_DECODING_MODE = "top_k_top_p"
LOOKAHEAD_KEYS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")


def engine_parameters(
    deployment: Deployment, engine_path: str, kv_fraction: float, *, draft: bool, orchestrator: bool = False
) -> dict[str, str]:
    """Parameters of a ``tensorrt_llm``/``tensorrt_llm_draft`` model (all text, as Triton stores them).

    In orchestrator mode (``orchestrator``) each engine names its GPUs with ``gpu_device_ids`` (the
    container's ids ``0..TP*PP-1``; both engines share them, as the memory plan assumes): the draft-target
    guide sets ``gpu_device_ids`` per engine (TensorRT-LLM ``examples/draft_target_model/README.md`` @ 11925f6),
    and the backend passes them to the executor's ``ParallelConfig`` (tensorrtllm_backend
    ``inflight_batcher_llm/src/model_state.cc`` @ c2e65b8). ``participant_ids`` is needed only with spawning
    disabled, which specpipe does not use.
    """
    spec = deployment.speculative
    method = spec.spec
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
        "decoding_mode": DRAFT_DECODING_MODE if draft else method.decoding_mode,
    }
    if draft or method.weights == "model":
        params["speculative_decoding_fast_logits"] = "false"
    if orchestrator:
        params["gpu_device_ids"] = ",".join(str(i) for i in range(deployment.tp * deployment.pp))
    if not draft and spec.tree is not None and method.choices_key:
        params[method.choices_key] = spec.tree.to_backend_text()
    if not draft and spec.lookahead is not None:
        params.update(zip(LOOKAHEAD_KEYS, (str(int(v)) for v in spec.lookahead)))
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
        raise SpecpipeError(
            f"model '{name}' would get parameters the tensorrtllm backend rejects: {'; '.join(problems)}"
        )
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


def engine_repository(deployment: Deployment) -> Repository:
    """Every model config of the repository, keyed by model name (ensemble last), its Python models and
    ``specpipe.json``.

    Raises:
        SpecpipeError: not an engine-flow deployment; parameters the backend would reject; see
            :func:`~specpipe.trtllm.kv_fraction.kv_cache_fractions`.
    """
    if deployment.runtime != Runtime.TRTLLM:
        raise SpecpipeError(
            f"engine {deployment.name} is for '{deployment.runtime}': use the LLM API repository writer"
        )
    two = deployment.speculative.spec.weights == "model"  # draft-target: a draft engine and the BLS
    rank_models = [TARGET_MODEL] + ([DRAFT_MODEL] if two else [])
    orchestrator = (
        launch_mode(deployment.runtime, len(rank_models), deployment.tp * deployment.pp) == LAUNCH_ORCHESTRATOR
    )
    target_fraction, draft_fraction = kv_cache_fractions(deployment.memory, two)
    tokenizer = {"tokenizer_dir": deployment.container_path(deployment.tokenizer_path)}
    max_batch = int(deployment.limits.get("max_batch_size", 1))
    configs = {
        PREPROCESSING.name: python_model_config(PREPROCESSING, {**tokenizer, "add_special_tokens": "true"}),
        TARGET_MODEL: engine_model_config(
            TARGET_MODEL,
            engine_parameters(
                deployment,
                deployment.container_path(deployment.target_path),
                target_fraction,
                draft=False,
                orchestrator=orchestrator,
            ),
            max_batch,
        ),
        POSTPROCESSING.name: python_model_config(
            POSTPROCESSING, {**tokenizer, "skip_special_tokens": "true", "engine_model_name": TARGET_MODEL}
        ),
    }
    if two:
        configs[DRAFT_MODEL] = engine_model_config(
            DRAFT_MODEL,
            engine_parameters(
                deployment,
                deployment.container_path(deployment.draft_path),
                draft_fraction,
                draft=True,
                orchestrator=orchestrator,
            ),
            max_batch,
        )
        configs[BLS_MODEL] = python_model_config(TENSORRT_LLM_BLS, bls_parameters(deployment), decoupled=True)
    warmup_files: dict[str, bytes] = {}
    for model in rank_models:  # the engines serve a short request before Triton marks them ready (cold start)
        warmup_files.update(add_engine_warmup(configs[model]))
    configs[ENSEMBLE.name] = ensemble_model_config(steps=ENGINE_ENSEMBLE_STEPS)
    modules = {**STEP_MODULES, **({BLS_MODEL: MODULES[BLS_MODEL]} if two else {})}
    return Repository(
        configs, modules, {META_NAME: meta_text(deployment_meta(deployment, rank_models)), **warmup_files}
    )
