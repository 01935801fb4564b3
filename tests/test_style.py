"""The code's style is ruff's: ``ruff format`` leaves every file as it is and ``ruff check`` finds nothing
(settings in ``pyproject.toml`` ``[tool.ruff]``: one line length, 120)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from repo_root import ROOT

PATHS = ["pipeline", "tests", "benchmarks"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    executable = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert executable, "ruff is missing: install the test extras (pip install -e '.[test]')"
    return subprocess.run([executable, *args, *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_format_leaves_every_file_as_it_is():
    result = ruff("format", "--check")
    assert result.returncode == 0, f"run 'ruff format {' '.join(PATHS)}':\n{result.stdout}{result.stderr}"


def test_ruff_check_finds_nothing():
    result = ruff("check", "--no-cache")
    assert result.returncode == 0, f"{result.stdout}{result.stderr}"
