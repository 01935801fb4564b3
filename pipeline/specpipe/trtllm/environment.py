"""What this machine offers the TensorRT-LLM flows: a GPU (``nvidia-smi``), docker, an importable
``tensorrt_llm``; and which runtime ``--runtime auto`` means for a target. Library functions for the CLI
(``build --runtime auto``, ``--gpu`` detection, ``specpipe doctor``); nothing here downloads anything.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specpipe.build_request import GpuCount
from specpipe.presets import load_target
from specpipe.speculative import Runtime
from specpipe.trtllm import release
from specpipe.trtllm.executor import trtllm_importable
from specpipe.trtllm.gpus import GPUS, MIB, lookup_gpu

#: ``nvidia-smi`` query: board name and total memory in MiB, one GPU per line.
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
#: Total memory (fraction) by which a board may differ from its table row and still match it.
MEMORY_TOLERANCE = 0.02


@dataclass(frozen=True)
class Board:
    """One GPU as ``nvidia-smi`` reports it: ``name`` (``NVIDIA A100-SXM4-80GB``), ``memory_mib`` (total,
    MiB) and ``gpu``, the :data:`~specpipe.trtllm.gpus.GPUS` row it matches (``None``: no row)."""

    name: str
    memory_mib: float
    gpu: str | None


def match_board(name: str, memory_mib: float) -> str | None:
    """The :data:`~specpipe.trtllm.gpus.GPUS` row of a board ``nvidia-smi`` names ``name`` with ``memory_mib``
    MiB: the row whose ``model`` is one of the name's tokens (split on ``-`` and spaces, case-insensitive)
    and whose memory is within :data:`MEMORY_TOLERANCE`; ``None`` when no row matches."""
    tokens = {token for token in re.split(r"[\s-]+", name.lower()) if token}
    for gpu in GPUS.values():
        if gpu.model.lower() in tokens and abs(gpu.memory_bytes / MIB - memory_mib) <= MEMORY_TOLERANCE * memory_mib:
            return gpu.name
    return None


@dataclass(frozen=True)
class Probe:
    """What ``nvidia-smi`` said: the ``boards`` it listed and, when none can be planned for, ``problem``: why
    (no ``nvidia-smi``, its exit status and error line, output that lists no GPU, boards the table lacks)."""

    boards: list[Board]
    problem: str | None = None


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def probe_boards(run=subprocess.run) -> Probe:
    """Every GPU ``nvidia-smi`` lists, in its order, and why none can be planned for (:class:`Probe`). Lines
    that are not ``name, MiB`` are skipped; a failing or hanging ``nvidia-smi`` lists none."""
    if shutil.which("nvidia-smi") is None:
        return Probe([], "nvidia-smi not found (no NVIDIA driver here)")
    try:
        proc = run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return Probe([], "nvidia-smi did not answer within 20 s")
    except (OSError, subprocess.SubprocessError) as error:
        return Probe([], f"nvidia-smi could not run ({error})")
    if proc.returncode != 0:
        said = _first_line(proc.stderr) or _first_line(proc.stdout)
        return Probe([], f"nvidia-smi failed (exit status {proc.returncode}){': ' + said if said else ''}")
    boards = []
    for line in (proc.stdout or "").splitlines():
        if "," not in line:
            continue
        name, memory = (part.strip() for part in line.rsplit(",", 1))
        try:
            mib = float(memory)
        except ValueError:
            continue
        if name:
            boards.append(Board(name, mib, match_board(name, mib)))
    if not boards:
        said = _first_line(proc.stdout)
        return Probe([], "nvidia-smi listed no GPU" + (f" (it printed: {said[:120]})" if said else ""))
    if all(board.gpu is None for board in boards):
        unknown = ", ".join(
            f"{n} x {name} ({mib / 1024:.1f} GiB)"
            for (name, mib), n in Counter((board.name, board.memory_mib) for board in boards).items()
        )
        return Probe(boards, f"nvidia-smi lists {unknown}, a board the GPU table lacks")
    return Probe(boards)


def query_boards(run=subprocess.run) -> list[Board]:
    """Every GPU ``nvidia-smi`` lists, in its order (:func:`probe_boards`); ``[]`` without ``nvidia-smi``, when
    it fails, or when it reports no GPU."""
    return probe_boards(run).boards


def detect_gpu(run=subprocess.run) -> str | None:
    """The :data:`~specpipe.trtllm.gpus.GPUS` name of GPU 0 from ``nvidia-smi`` (:func:`query_boards`), or
    ``None`` (no ``nvidia-smi``, no GPU, or a board the table lacks)."""
    boards = query_boards(run)
    return boards[0].gpu if boards else None


def planned_board(boards: list[Board]) -> str | None:
    """The :data:`~specpipe.trtllm.gpus.GPUS` row to plan for on a machine with ``boards``: the known board
    most of them are (ties: the one listed first), so that one odd GPU 0 does not decide; ``None`` when no
    board is known."""
    known = Counter(board.gpu for board in boards if board.gpu is not None)
    return (
        max(known, key=lambda gpu: (known[gpu], -next(i for i, b in enumerate(boards) if b.gpu == gpu)))
        if known
        else None
    )


def count_boards(boards: list[Board], planned: str | None) -> GpuCount | None:
    """How many of ``boards`` a deployment planned for the GPU ``planned`` may use, saying where the number
    came from: all of them when they are one model; with mixed boards, those of the planned model (the
    source names the mix). ``None`` when there are no boards."""
    if not boards:
        return None
    names = Counter(board.name for board in boards)
    mix = ", ".join(f"{n} x {name}" for name, n in names.items())
    if len(names) == 1:
        name, n = next(iter(names.items()))
        note = (
            ""
            if planned is None or boards[0].gpu == planned
            else (f" (not the {planned} planned for: give --gpus N for the machine it is meant for)")
        )
        return GpuCount(n, f"nvidia-smi: {n} x {name}{note}")
    same = [board for board in boards if planned is not None and board.gpu == planned]
    if same:
        return GpuCount(
            len(same),
            f"nvidia-smi: {len(same)} x {same[0].name} of {len(boards)} GPUs "
            f"(mixed boards: {mix}; counting the {planned} boards)",
        )
    return GpuCount(
        len(boards),
        f"nvidia-smi: {len(boards)} GPUs of mixed boards ({mix}), none of them "
        f"{planned or 'a known GPU'}: give --gpus N and --gpu",
    )


@dataclass(frozen=True)
class GpuSetup:
    """The GPU a TensorRT-LLM plan is made for: ``gpu`` (a :data:`~specpipe.trtllm.gpus.GPUS` name, ``None``:
    none known), ``gpus`` the GPUs available (``None``: none detected, nor ``--gpus``) and ``unknown``, why
    no GPU is known (``None`` when ``gpu`` is set)."""

    gpu: str | None
    gpus: GpuCount | None
    unknown: str | None = None


def detect_gpu_setup(gpu: str | None, gpus: int | None, run=subprocess.run) -> GpuSetup:
    """``gpu`` (``--gpu``, normalised to its table name) or the board most GPUs ``nvidia-smi`` lists are
    (:func:`planned_board`); ``gpus`` (``--gpus``) or the count :func:`count_boards` makes. Runs
    ``nvidia-smi`` only when one of the two is not given.

    Raises:
        UnknownGpuError: ``gpu`` names no GPU of the table.
    """
    name = lookup_gpu(gpu).name if gpu is not None else None
    if name is not None and gpus is not None:
        return GpuSetup(name, GpuCount(gpus, "--gpus"))
    probe = probe_boards(run)
    planned = name if name is not None else planned_board(probe.boards)
    count = GpuCount(gpus, "--gpus") if gpus is not None else count_boards(probe.boards, planned)
    return GpuSetup(planned, count, None if planned is not None else probe.problem)


def detect_gpus(gpu: str | None, gpus: int | None, run=subprocess.run) -> tuple[str | None, GpuCount | None]:
    """``(gpu, gpus)`` of :func:`detect_gpu_setup`."""
    setup = detect_gpu_setup(gpu, gpus, run)
    return setup.gpu, setup.gpus


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
    words = {
        "GPU": "a GPU (no nvidia-smi)",
        "docker": "docker",
        "importable tensorrt_llm": "an importable tensorrt_llm",
    }
    return (
        f"but this machine lacks {' and '.join(words.get(m, m) for m in missing)}: build on a machine with an NVIDIA GPU and docker "
        f"(the steps run in {release.CONTAINER_IMAGE}) or inside that container; the plan above lists every step, "
        f"nothing was downloaded"
    )


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
