"""The code's style is ruff's: ``ruff format`` leaves every file as it is and ``ruff check`` finds nothing
(settings in ``pyproject.toml`` ``[tool.ruff]``: one line length, 120)."""

from __future__ import annotations

import re
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


def test_tests_import_helpers_not_other_test_modules():
    """Test modules import as files (``--import-mode=importlib``): what two tests share lives in
    ``tests/helpers/``, and a test module never imports another."""
    tests = ROOT / "tests"
    imports = re.compile(r"^\s*(?:from|import)\s+(?:tests\b|test_\w+|conftest\b)", re.MULTILINE)
    offenders = [str(p.relative_to(ROOT)) for p in sorted(tests.rglob("*.py")) if imports.search(p.read_text())]
    assert offenders == []
    assert not any(p.name.startswith("test_") for p in (tests / "helpers").iterdir())
