"""What this machine offers the TensorRT-LLM flows: a GPU (``nvidia-smi``), docker, an importable
``tensorrt_llm``; and which runtime ``--runtime auto`` means for a target. Library functions for the CLI
(``build --runtime auto``, ``--gpu`` detection, ``specpipe doctor``); nothing here downloads anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from specpipe.presets import load_target
from specpipe.speculative import Runtime
from specpipe.trtllm import release
from specpipe.trtllm.executor import trtllm_importable
from specpipe.trtllm.gpus import GPUS, MIB

#: ``nvidia-smi`` query: board name and total memory in MiB, one GPU per line.
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]


def detect_gpu(run=subprocess.run) -> str | None:
    """The :data:`~specpipe.trtllm.gpus.GPUS` name of GPU 0 from ``nvidia-smi``, or ``None`` (no
    ``nvidia-smi``, no GPU, or a board the table lacks). Matched by total memory within 2% among
    boards whose table description contains the reported model (e.g. ``H100``)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    line = (proc.stdout or "").strip().splitlines()[:1]
    if proc.returncode != 0 or not line or "," not in line[0]:
        return None
    board, memory = (part.strip() for part in line[0].rsplit(",", 1))
    try:
        mib = float(memory)
    except ValueError:
        return None
    model = next((word for word in board.replace("NVIDIA", "").split() if any(c.isdigit() for c in word)), "")
    for gpu in GPUS.values():
        if model and model.lower() in gpu.description.lower() and abs(gpu.memory_bytes / MIB - mib) <= 0.02 * mib:
            return gpu.name
    return None


def what_is_missing(run=subprocess.run) -> list[str]:
    """What this machine lacks to run the TensorRT-LLM flows: ``GPU``, ``docker``, ``importable tensorrt_llm``
    (an executor needs docker or tensorrt_llm; building needs a GPU either way)."""
    missing = []
    if detect_gpu(run) is None and shutil.which("nvidia-smi") is None:
        missing.append("GPU")
    if shutil.which("docker") is None:
        missing.append("docker")
    if not trtllm_importable():
        missing.append("importable tensorrt_llm")
    return missing


def cannot_run_here(missing: list[str]) -> str | None:
    """Why a TensorRT-LLM build cannot run on a machine lacking ``missing`` (from :func:`what_is_missing`),
    as the end of a one-line error naming the fix; ``None`` when it can (a GPU, and docker or
    ``tensorrt_llm``)."""
    if "GPU" not in missing and not {"docker", "importable tensorrt_llm"} <= set(missing):
        return None
    words = {"GPU": "a GPU (no nvidia-smi)", "docker": "docker", "importable tensorrt_llm": "an importable tensorrt_llm"}
    return (f"but this machine lacks {' and '.join(words.get(m, m) for m in missing)}: build on a machine with an NVIDIA GPU and docker "
            f"(the steps run in {release.CONTAINER_IMAGE}) or inside that container; the plan above lists every step, "
            f"nothing was downloaded")


def resolve_runtime(target_preset: str, requested: str = "auto") -> Runtime:
    """``--runtime``: an explicit runtime as given; ``auto`` -> the CPU runtime for targets it serves
    (those with a CPU source, e.g. ``smollm2-135m``), otherwise (Hugging Face sources, checkpoint
    directories) the TensorRT-LLM engine flow.

    Raises:
        PresetError: unknown target (from :func:`specpipe.presets.load_target`).
    """
    if requested != "auto":
        return Runtime(requested)
    if not target_preset.endswith(".toml") and Path(target_preset).is_dir():
        return Runtime.TRTLLM  # a Hugging Face checkpoint directory: only the TensorRT-LLM flows read those
    source = load_target(target_preset).source
    kind = source.get("kind") if isinstance(source, dict) else getattr(source, "kind", None)
    return Runtime.CPU if kind not in (None, "hf") else Runtime.TRTLLM
