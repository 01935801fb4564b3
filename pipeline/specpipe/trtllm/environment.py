"""What this machine offers the TensorRT-LLM flows: a GPU (``nvidia-smi``), docker, an importable
``tensorrt_llm``; and which runtime ``--runtime auto`` means for a target. Library functions for the CLI
(``build --runtime auto``, ``--gpu`` detection, ``specpipe doctor``); nothing here downloads anything.
"""

from __future__ import annotations

import shutil
import subprocess

from specpipe.presets import load_target
from specpipe.speculative import Runtime
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


def resolve_runtime(target_preset: str, requested: str = "auto") -> Runtime:
    """``--runtime``: an explicit runtime as given; ``auto`` -> the CPU runtime for targets it serves
    (those with a CPU source, e.g. ``smollm2-135m``), otherwise the TensorRT-LLM engine flow.

    Raises:
        PresetError: unknown target (from :func:`specpipe.presets.load_target`).
    """
    if requested != "auto":
        return Runtime(requested)
    source = load_target(target_preset).source
    kind = source.get("kind") if isinstance(source, dict) else getattr(source, "kind", None)
    return Runtime.CPU if kind not in (None, "hf") else Runtime.TRTLLM
