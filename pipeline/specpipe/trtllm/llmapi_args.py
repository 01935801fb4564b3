"""THE builder of an LLM API deployment's ``model.yaml`` (``--runtime trtllm-llmapi``): the ``LLM(...)``
arguments and ``triton_config``.

One function, :func:`model_yaml`, for both readers of that file: the repository writer
(:func:`specpipe.triton.llmapi.llmapi_repository` writes ``tensorrt_llm/1/model.yaml`` from it) and the
first-contact check (:func:`specpipe.trtllm.doctor.check_input` validates it with the container's own
``TorchLlmArgs`` before anything is downloaded). Both pass the same plain facts (paths on the host,
parallel sizes, limits, the memory plan, the speculative settings), so the checked file is the
packaged one.

Paths are written as the serving container sees them: the engines root is mounted at
:data:`CONTAINER_ENGINES` (``/engines``; :mod:`specpipe.triton.deployment` describes the layout).

Keys (all ``TorchLlmArgs`` fields of the pinned release, :mod:`specpipe.trtllm.llmapi_schema`):
``model``, ``backend: pytorch``, ``tensor_parallel_size``, ``pipeline_parallel_size``, ``max_batch_size``,
``max_seq_len``, ``kv_cache_config`` (``free_gpu_memory_fraction`` from the memory plan,
:func:`specpipe.trtllm.kv_fraction.kv_cache_fractions`; ``enable_block_reuse: true``),
``speculative_config`` (:func:`specpipe.trtllm.llmapi_schema.build_speculative_config`) and, for
two-model speculation, ``disable_overlap_scheduler: true`` (TensorRT-LLM
``docs/source/features/speculative-decoding.md``, draft/target example). ``triton_config`` is read by
the Triton model only: ``max_batch_size`` 0 (that model does not batch), ``decoupled: true`` (streaming).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from specpipe.errors import CompatibilityError, SpecpipeError
from specpipe.speculative import Method, Runtime, SpeculativeSettings
from specpipe.trtllm import release
from specpipe.trtllm.kv_fraction import kv_cache_fractions
from specpipe.trtllm.llmapi_schema import build_speculative_config
from specpipe.trtllm.preflight import check_pipeline_parallel

CONTAINER_ENGINES = "/engines"
#: ``triton_config`` of model.yaml (TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``).
TRITON_CONFIG = {"max_batch_size": 0, "decoupled": True}


def container_path(engines_root: Path | str, host_path: Path | str) -> str:
    """``host_path`` (under ``engines_root``) as the serving container sees it (under ``/engines``).

    Raises:
        SpecpipeError: the path is outside the engines root (it would not be mounted).
    """
    root, path = Path(engines_root).absolute(), Path(host_path).absolute()
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise SpecpipeError(
            f"{path} is outside the engines root {root}, which is all the container mounts: copy it under {root} "
            f"(or build with --engines-dir pointing above it)"
        ) from None
    return str(PurePosixPath(CONTAINER_ENGINES) / rel.as_posix()) if str(rel) != "." else CONTAINER_ENGINES


def speculative_config(
    spec: SpeculativeSettings, *, draft: str | None, pp: int, version: str, name: str
) -> dict[str, Any] | None:
    """The ``speculative_config`` mapping (``None`` without speculation); ``draft``: the container path
    of the draft checkpoint, ``name``: the engine (for messages).

    Raises:
        CompatibilityError: a method the LLM API does not run (Medusa, lookahead), drafting with PP > 1
            (:data:`~specpipe.trtllm.preflight.PP_REFUSED`), or a method that needs a draft checkpoint without one.
    """
    method = spec.spec
    if spec.method is Method.NONE:
        return None
    if not method.runs_on(Runtime.TRTLLM_LLMAPI) or method.decoding_type is None:
        raise CompatibilityError(
            f"{spec.method.value} does not run on TensorRT-LLM's LLM API (PyTorch backend) in {release.TRTLLM_VERSION}: "
            f"build with --runtime trtllm for the engine flow"
        )
    check_pipeline_parallel(Runtime.TRTLLM_LLMAPI, spec.method, pp)
    if method.weights is not None and draft is None:
        raise CompatibilityError(
            f"{spec.method.value} needs a draft checkpoint, engine {name} has none: rebuild with --draft-model"
        )
    return build_speculative_config(spec, draft if method.weights is not None else None, version)


def llm_arguments(
    *,
    name: str,
    engines_root: Path | str,
    target_path: Path | str,
    draft_path: Path | str | None,
    tp: int,
    pp: int,
    limits: dict[str, int],
    memory: dict[str, Any],
    speculative: SpeculativeSettings,
    version: str,
) -> dict[str, Any]:
    """The ``LLM(...)`` arguments (model.yaml without ``triton_config``). ``limits``: ``max_batch_size``
    (requests) and ``max_seq_len`` (tokens); ``memory``: the memory plan (``MemoryPlan.as_dict()``, bytes per GPU).

    Raises:
        SpecpipeError: the memory plan names no GPU or leaves no room for the KV cache
            (:func:`~specpipe.trtllm.kv_fraction.kv_cache_fractions`); a path outside the engines root;
            see :func:`speculative_config`.
    """
    fraction, _ = kv_cache_fractions(memory, False)
    needs_draft = speculative.method is not Method.NONE and speculative.spec.weights is not None
    draft = container_path(engines_root, draft_path) if needs_draft and draft_path is not None else None
    args: dict[str, Any] = {
        "model": container_path(engines_root, target_path),
        "backend": "pytorch",
        "tensor_parallel_size": int(tp),
        "pipeline_parallel_size": int(pp),
        "max_batch_size": int(limits["max_batch_size"]),
        "max_seq_len": int(limits["max_seq_len"]),
        "kv_cache_config": {"free_gpu_memory_fraction": fraction, "enable_block_reuse": True},
    }
    spec = speculative_config(speculative, draft=draft, pp=int(pp), version=version, name=name)
    if spec is not None:
        args["speculative_config"] = spec
        if speculative.method is Method.DRAFT_MODEL:
            args["disable_overlap_scheduler"] = True
    return args


def model_yaml(**facts: Any) -> dict[str, Any]:
    """model.yaml's content: :func:`llm_arguments` (same keyword arguments) + ``triton_config``.

    Raises:
        SpecpipeError: see :func:`llm_arguments`.
    """
    return {**llm_arguments(**facts), "triton_config": dict(TRITON_CONFIG)}


def plan_facts(doc: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`model_yaml` from a plan document (``Plan.as_dict()``, the JSON of
    ``specpipe build ... --dry-run --json``): the same facts the repository writer reads back from it.

    Raises:
        SpecpipeError: the document lacks a key a plan has (regenerate it).
    """
    try:
        engine_dir = Path(doc["engine_dir"]).absolute()
        return {
            "name": str(doc.get("engine_name", engine_dir.name)),
            "engines_root": engine_dir.parent,
            "target_path": doc["target"]["path"],
            "draft_path": doc["draft"]["path"],
            "tp": int(doc["parallel"]["tp"]),
            "pp": int(doc["parallel"]["pp"]),
            "limits": doc["limits"],
            "memory": doc["memory"],
            "speculative": SpeculativeSettings.from_json(doc["speculative"], "the plan"),
            "version": str(doc["release"]["tensorrt_llm"]),
        }
    except (KeyError, TypeError) as exc:
        raise SpecpipeError(f"the plan lacks {exc}: regenerate it with 'specpipe build ... --dry-run --json'") from exc
