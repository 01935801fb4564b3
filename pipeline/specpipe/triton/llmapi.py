"""The Triton model repository of an LLM API (PyTorch backend) deployment (``--runtime trtllm-llmapi``).

Layout (TensorRT-LLM's ``triton_backend/all_models/llmapi``; in the container ``/app/all_models/llmapi``)::

    triton_repo/NAME/
      specpipe.json                  runtime, release, container, GPUs (read by the launcher)
      tensorrt_llm/config.pbtxt      backend "python", one KIND_CPU instance; no max_batch_size and no
                                     decoupled (the model sets them from model.yaml's triton_config);
                                     parameter llmapi_model_dir: the container's LLM-API model directory
      tensorrt_llm/1/model.yaml      the LLM(...) arguments + triton_config
      tensorrt_llm/1/model.py        imports specpipe.triton.models.llmapi_shim, which delegates to the
                                     container's own LLM-API Python model (one implementation)
      trtllm-serve.yaml              the same LLM arguments for ``trtllm-serve --extra_llm_api_options``

model.yaml's content comes from THE builder :func:`specpipe.trtllm.llmapi_args.model_yaml` (the same
function the first-contact check validates before anything is downloaded); ``speculative_config`` is built by
:func:`specpipe.trtllm.llmapi_schema.build_speculative_config`, spelled for the deployment's TensorRT-LLM release: every key except ``triton_config`` is passed to ``LLM(...)``
(the container's model.py reads ``model.yaml`` from its model version directory and merges it with
``update_llm_args_with_extra_dict``; tensorrtllm_backend ``all_models/llmapi/tensorrt_llm/1/model.py``
@ c2e65b8). ``triton_config.max_batch_size`` must be 0 (that model does not batch);
``decoupled: true`` enables streaming.

Tensor interface of ``config.pbtxt``: TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt``
(index copy @ 0a71057313ec0626527e164a8fc0205c5822e2f5; the 1.2 subset listed in :data:`LLMAPI`).
"""

from __future__ import annotations

from typing import Any

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from specpipe import __version__
from specpipe.errors import SpecpipeError
from specpipe.speculative import Runtime
from specpipe.triton.config import model_input, model_output
from specpipe.triton.deployment import Deployment
from specpipe.triton.models.llmapi_shim import MODEL_DIR_PARAMETER
from specpipe.triton.repo_meta import META_NAME, deployment_meta, meta_text
from specpipe.triton.tensor_spec import ModelInterface, tensor
from specpipe.triton.writer import MODULES, VERSION_DIR, Repository
from specpipe.trtllm import llmapi_args, release

MODEL = "tensorrt_llm"
MODEL_YAML = "model.yaml"
SERVE_OPTIONS = "trtllm-serve.yaml"

LLMAPI = ModelInterface(
    name=MODEL,
    inputs=(
        tensor("text_input", "STRING", [-1], doc="prompt text"),
        tensor("streaming", "BOOL", [1], True),
        tensor("sampling_param_temperature", "FP32", [1], True),
        tensor("sampling_param_top_k", "INT32", [1], True),
        tensor("sampling_param_top_p", "FP32", [1], True),
        tensor("sampling_param_frequency_penalty", "FP32", [1], True),
        tensor("sampling_param_presence_penalty", "FP32", [1], True),
        tensor("sampling_param_max_tokens", "INT32", [1], True),
        tensor("sampling_param_stop", "STRING", [-1], True),
        tensor("sampling_param_seed", "UINT64", [1], True),
        tensor("sampling_param_exclude_input_from_output", "BOOL", [1], True),
        tensor("sampling_param_return_perf_metrics", "BOOL", [1], True),
        tensor("return_finish_reason", "BOOL", [1], True),
        tensor("return_stop_reason", "BOOL", [1], True),
        tensor("return_cumulative_logprob", "BOOL", [1], True),
    ),
    outputs=(
        tensor("text_output", "STRING", [-1]),
        tensor("finish_reason", "STRING", [-1]),
        tensor("stop_reason", "STRING", [-1]),
        tensor("cumulative_logprob", "FP32", [-1]),
        tensor("kv_cache_reused_block", "INT32", [-1]),
        tensor("kv_cache_missed_block", "INT32", [-1]),
        tensor("kv_cache_alloc_new_blocks", "INT32", [-1]),
        tensor("kv_cache_alloc_total_blocks", "INT32", [-1]),
        tensor("kv_cache_hit_rate", "FP32", [-1]),
        tensor("arrival_time_ns", "INT64", [1]),
        tensor("first_scheduled_time_ns", "INT64", [1]),
        tensor("first_token_time_ns", "INT64", [1]),
        tensor("last_token_time_ns", "INT64", [1]),
        tensor("acceptance_rate", "FP32", [1]),
        tensor("total_accepted_draft_tokens", "INT32", [1]),
        tensor("total_draft_tokens", "INT32", [1]),
    ),
)


def _facts(deployment: Deployment) -> dict[str, Any]:
    return {
        "name": deployment.name,
        "engines_root": deployment.engines_root,
        "target_path": deployment.target_path,
        "draft_path": deployment.draft_path,
        "tp": deployment.tp,
        "pp": deployment.pp,
        "limits": deployment.limits,
        "memory": deployment.memory,
        "speculative": deployment.speculative,
        "version": deployment.trtllm_version,
    }


def speculative_config(deployment: Deployment) -> dict[str, Any] | None:
    """The ``speculative_config`` mapping for the deployment's method (``None`` without speculation).

    Raises:
        CompatibilityError: see :func:`specpipe.trtllm.llmapi_args.speculative_config`.
    """
    draft = deployment.container_path(deployment.draft_path) if deployment.draft_path is not None else None
    return llmapi_args.speculative_config(
        deployment.speculative, draft=draft, pp=deployment.pp, version=deployment.trtllm_version, name=deployment.name
    )


def llm_arguments(deployment: Deployment) -> dict[str, Any]:
    """The ``LLM(...)`` arguments (model.yaml without ``triton_config``): :func:`specpipe.trtllm.llmapi_args.llm_arguments`."""
    return llmapi_args.llm_arguments(**_facts(deployment))


def model_yaml(deployment: Deployment) -> dict[str, Any]:
    """model.yaml: THE builder :func:`specpipe.trtllm.llmapi_args.model_yaml`, the one the first-contact check validates."""
    return llmapi_args.model_yaml(**_facts(deployment))


def serve_options(deployment: Deployment) -> dict[str, Any]:
    """The ``trtllm-serve --extra_llm_api_options`` file: the LLM arguments without ``model`` (given
    on the command line) and ``backend`` (``--backend pytorch``)."""
    return {k: v for k, v in llm_arguments(deployment).items() if k not in ("model", "backend")}


def serve_command(deployment: Deployment, options_path: str) -> list[str]:
    """The equivalent ``trtllm-serve`` command (container paths)."""
    return [
        "trtllm-serve",
        deployment.container_path(deployment.target_path),
        "--backend",
        "pytorch",
        "--tp_size",
        str(deployment.tp),
        "--pp_size",
        str(deployment.pp),
        "--extra_llm_api_options",
        options_path,
    ]


def model_config() -> mc.ModelConfig:
    """config.pbtxt: Python backend, one CPU instance, the :data:`LLMAPI` tensors, and the container's
    LLM-API model directory (:data:`release.CONTAINER_LLMAPI_MODEL_DIR`) for the shim."""
    config = mc.ModelConfig(name=MODEL, backend="python")
    config.input.extend(model_input(s) for s in LLMAPI.inputs)
    config.output.extend(model_output(s) for s in LLMAPI.outputs)
    config.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    config.parameters[MODEL_DIR_PARAMETER].string_value = release.CONTAINER_LLMAPI_MODEL_DIR
    return config


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def llmapi_repository(deployment: Deployment) -> Repository:
    """The LLM API repository of ``deployment``: config, model.yaml, the shim, trtllm-serve options, metadata.

    Raises:
        SpecpipeError: not an LLM API deployment; see :func:`speculative_config` and
            :func:`~specpipe.trtllm.kv_fraction.kv_cache_fractions`.
    """
    if deployment.runtime != Runtime.TRTLLM_LLMAPI:
        raise SpecpipeError(
            f"engine {deployment.name} is for '{deployment.runtime}': use the engine-flow repository writer"
        )
    options = f"/models/{SERVE_OPTIONS}"
    files = {
        f"{MODEL}/{VERSION_DIR}/{MODEL_YAML}": (
            f"# LLM API arguments for {deployment.name}, written by specpipe {__version__} for TensorRT-LLM "
            f"{deployment.trtllm_version}\n" + _dump(model_yaml(deployment))
        ),
        SERVE_OPTIONS: f"# {' '.join(serve_command(deployment, options))}\n" + _dump(serve_options(deployment)),
        META_NAME: meta_text(deployment_meta(deployment, [MODEL])),
    }
    return Repository({MODEL: model_config()}, {MODEL: MODULES["llmapi"]}, files)
