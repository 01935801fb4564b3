"""``specpipe.json`` at the top of a TensorRT-LLM model repository: what the launcher needs to know.

Triton reads only the model sub-directories of a repository, so this file is invisible to it. It
records the runtime, the TensorRT-LLM release and container the repository was written for, the MPI
world size (engine flow: one rank per GPU, TP x PP; LLM API flow: one server process, which starts
its own workers; orchestrator mode: one server process, the backend spawns the workers), the launch
mode (:func:`launch_mode`), the models every rank loads, and the host engines root the container mounts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.errors import SpecpipeError
from specpipe.speculative import Runtime

META_NAME = "specpipe.json"
META_FORMAT = "specpipe-triton-repo/1"

#: How Triton is started (the ``launch`` key; :func:`launch_mode`).
LAUNCH_SINGLE = "single"  # one tritonserver (engine flow on one GPU, or the LLM API flow)
LAUNCH_LEADER = "leader"  # mpirun, one tritonserver rank per GPU (one engine, TP x PP > 1)
LAUNCH_ORCHESTRATOR = "orchestrator"  # one tritonserver; the backend spawns each engine's TP x PP workers


def launch_mode(runtime: Runtime | str, engine_models: int, gpus: int) -> str:
    """How a repository with ``engine_models`` tensorrtllm-backend models on ``gpus`` GPUs is launched.

    Two engines (draft-target) over more than one GPU need orchestrator mode: in leader mode every rank
    above 0 exits inside the first engine model's setup (tensorrtllm_backend
    ``inflight_batcher_llm/src/model_instance_state.cc`` @ c2e65b8: ``canEnqueueRequests()`` false ->
    ``shutdown()``; ``exit(0)``), and TensorRT-LLM's draft-target guide says ``--multi-model`` "is
    necessary if TP mode is used" (``examples/draft_target_model/README.md`` @ 11925f6).
    """
    if Runtime(runtime) is not Runtime.TRTLLM or gpus == 1:
        return LAUNCH_SINGLE
    return LAUNCH_ORCHESTRATOR if engine_models > 1 else LAUNCH_LEADER


def deployment_meta(deployment, rank_models: list[str]) -> dict[str, Any]:
    """The metadata of a repository written for ``deployment`` (a :class:`~specpipe.triton.deployment.Deployment`)."""
    launch = launch_mode(deployment.runtime, len(rank_models), deployment.tp * deployment.pp)
    return {
        "format": META_FORMAT,
        "specpipe_version": __version__,
        "runtime": deployment.runtime,
        "engine": deployment.name,
        "origin": deployment.origin,
        "tensorrt_llm": deployment.trtllm_version,
        "container_image": deployment.container_image,
        "tp": deployment.tp,
        "pp": deployment.pp,
        "gpus": deployment.tp * deployment.pp,
        "launch": launch,
        "world_size": deployment.world_size if launch == LAUNCH_LEADER else 1,
        "rank_models": rank_models,
        "engines_root": str(deployment.engines_root),
        "speculative": deployment.method.value,
    }


def meta_text(meta: dict[str, Any]) -> str:
    """The text of ``specpipe.json`` (sorted keys)."""
    return json.dumps(meta, indent=2, sort_keys=True) + "\n"


def read_meta(repo_dir: Path) -> dict[str, Any] | None:
    """The repository's metadata, or ``None`` when it has none (a CPU-runtime repository).

    Raises:
        SpecpipeError: the file exists but is unreadable or of another format.
    """
    path = Path(repo_dir) / META_NAME
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecpipeError(f"{path} is unreadable ({exc}): regenerate the repository with 'specpipe package'") from exc
    if meta.get("format") != META_FORMAT:
        raise SpecpipeError(
            f"{path} has format {meta.get('format')!r}, expected {META_FORMAT!r}: regenerate it with 'specpipe package'"
        )
    return meta
