"""The layer contracts hold (import-linter), no two specpipe modules import each other in a cycle, and
no module grows past the size where it stops having one job."""

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from repo_root import ROOT

PACKAGE = ROOT / "pipeline" / "specpipe"
MAX_LINES = 400


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is missing: install the test extras (pip install -e '.[test]')")
    return found


def test_import_contracts_are_kept():
    run = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(set(graph.find_modules_directly_imported_by(m)) & set(modules)) for m in modules}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(modules)))
    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_between_modules():
    """Function-local imports count too: grimp reads every import statement."""
    assert _cycles(grimp.build_graph("specpipe")) == []


def test_the_cycle_finder_finds_a_cycle():
    class Graph:
        modules = {"a", "b", "c"}

        def find_modules_directly_imported_by(self, m):
            return {"a": {"b"}, "b": {"a"}, "c": set()}[m]

    assert _cycles(Graph()) == [["a", "b"]]


def test_no_module_over_the_size_limit():
    too_big = {
        str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert too_big == {}, f"split these modules by concern (over {MAX_LINES} lines): {too_big}"
