"""Stand-in programs for tests: executables written into a folder that a test puts on ``PATH``
(``nvidia-smi``, ``docker``, ``python3``, ``trtllm-build`` ...)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path


def write_program(bin_dir: Path, name: str, text: str) -> Path:
    """Write ``text`` (a script with its ``#!`` line) as the executable ``bin_dir/name``; returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def printing_program(bin_dir: Path, name: str, output: str) -> Path:
    """An executable ``bin_dir/name`` that prints ``output`` and exits 0 (e.g. an ``nvidia-smi`` query's CSV)."""
    return write_program(bin_dir, name, f"#!{sys.executable}\nprint({output!r})\n")
