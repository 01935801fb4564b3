"""The machine a benchmark ran on, for ``bench.json`` (``"machine"``): figures without it are not comparable.

Recorded: CPU model (``/proc/cpuinfo`` ``model name``, else :func:`platform.processor`), logical and
physical cores (``psutil``), memory in bytes (``psutil.virtual_memory().total``), GPUs from
``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits`` when that
tool is on ``PATH`` (memory in MiB, as nvidia-smi reports it), the OS (:func:`platform.platform`),
Python, the installed versions of ``torch``, ``tritonclient``, ``transformers`` and ``specpipe``, and
the git commit of the source tree specpipe runs from (with ``"dirty": true`` when it has uncommitted
changes), when it runs from a git checkout. A fact that cannot be read is ``None``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

#: Packages whose installed version is recorded.
PACKAGES = ("torch", "tritonclient", "transformers", "specpipe")


def cpu_model() -> str | None:
    """The CPU's marketing name, e.g. ``AMD EPYC 7B13``; ``None`` when unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    """``command``'s stdout, stripped, or ``None`` when it is missing, fails or takes over 10 s."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpus() -> list[dict[str, Any]]:
    """One ``{"name", "memory_mib", "driver"}`` per GPU nvidia-smi lists; empty without nvidia-smi or GPUs."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    found = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            memory = float(parts[1]) if parts[1].replace(".", "", 1).isdigit() else None
            found.append({"name": parts[0], "memory_mib": memory, "driver": parts[2]})
    return found


def git_commit(where: Path | None = None) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``where`` (default: this package), or ``None``."""
    folder = where or Path(__file__).resolve().parent
    if shutil.which("git") is None:
        return None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=folder)
    if not commit:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder)
    return {"commit": commit, "dirty": bool(status)}


def versions() -> dict[str, str | None]:
    """Installed version of each of :data:`PACKAGES` (``None`` when not installed)."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@lru_cache(maxsize=1)
def _facts() -> tuple:
    memory = psutil.virtual_memory().total
    return (
        ("cpu_model", cpu_model()),
        ("cpu_logical_cores", psutil.cpu_count(logical=True)),
        ("cpu_physical_cores", psutil.cpu_count(logical=False)),
        ("memory_bytes", int(memory)),
        ("gpus", tuple(tuple(g.items()) for g in gpus())),
        ("os", platform.platform()),
        ("python", sys.version.split()[0]),
        ("packages", tuple(versions().items())),
        ("git", None if (g := git_commit()) is None else tuple(g.items())),
    )


def machine_facts() -> dict[str, Any]:
    """The facts of the module doc as a JSON-ready dict (read once per process)."""
    facts = dict(_facts())
    facts["gpus"] = [dict(g) for g in facts["gpus"]]
    facts["packages"] = dict(facts["packages"])
    facts["git"] = None if facts["git"] is None else dict(facts["git"])
    return facts
