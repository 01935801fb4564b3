"""``specpipe.json`` at the top of a TensorRT-LLM model repository: what the launcher needs to know.

Triton reads only the model sub-directories of a repository, so this file is invisible to it. It
records the runtime, the TensorRT-LLM release and container the repository was written for, the MPI
world size (engine flow: one rank per GPU, TP x PP; LLM API flow: one server process, which starts
its own workers), the models every rank loads, and the host engines root the container mounts.
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


def deployment_meta(deployment, rank_models: list[str]) -> dict[str, Any]:
    """The metadata of a repository written for ``deployment`` (a :class:`~specpipe.triton.deployment.Deployment`)."""
    engine_flow = deployment.runtime == Runtime.TRTLLM
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
        "world_size": deployment.world_size if engine_flow else 1,
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
        raise SpecpipeError(f"{path} has format {meta.get('format')!r}, expected {META_FORMAT!r}: regenerate it with 'specpipe package'")
    return meta
