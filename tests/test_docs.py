"""The README cannot drift from the code: its command reference and measurement tables (and those of
``docs/``) are generated (cog), every command is documented, every ``specpipe`` line in its shell blocks
parses, and the Python it claims is the one needed."""

import re
import shlex
import sys
import tomllib
from pathlib import Path

import click
import pytest

from specpipe.cli import main
from specpipe.cli.reference import iter_commands

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def bash_blocks(text: str) -> list[list[str]]:
    """The README's ```bash blocks, continuation lines joined, comments dropped."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = body.replace("\\\n", " ")
        blocks.append([line.split(" #")[0].strip().rstrip("&").strip() for line in joined.splitlines() if line.strip()])
    return blocks


def specpipe_lines() -> list[str]:
    return [line for block in bash_blocks(README.read_text()) for line in block if line.startswith("specpipe ")]


GENERATED_DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", [d for d in GENERATED_DOCS if "[[[cog" in d.read_text()], ids=lambda d: d.name)
def test_generated_sections_are_current(doc):
    """The command reference and the measurement tables are generated from the code and the results JSON."""
    cogapp = pytest.importorskip("cogapp")
    status = cogapp.Cog().main(["cog", "--check", str(doc)])
    assert status == 0, f"{doc.relative_to(ROOT)} is stale: run 'cog -r {doc.relative_to(ROOT)}'"


def test_every_registered_command_is_in_the_readme():
    text = README.read_text()
    for path, _ in iter_commands():
        assert f"### `specpipe {' '.join(path)}`" in text, path
    prose = text.split("## Command reference")[0]
    for path, command in iter_commands():
        if not isinstance(command, click.Group):
            assert f"specpipe {' '.join(path)}" in prose, f"'specpipe {' '.join(path)}' is never shown in use"


@pytest.mark.parametrize("line", specpipe_lines())
def test_every_specpipe_line_in_the_readme_parses(line):
    args = shlex.split(line)[1:]
    group, ctx = main, main.make_context("specpipe", list(args))
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    while True:
        name, command, rest = group.resolve_command(ctx, list(rest))
        ctx = command.make_context(name, list(rest), parent=ctx)
        if not isinstance(command, click.Group):
            break
        group, rest = command, [*getattr(ctx, "_protected_args", []), *ctx.args]


def test_the_step_by_step_block_starts_every_server_it_talks_to():
    text = README.read_text()
    block = bash_blocks(text.split("## The CPU reference runtime, step by step")[1])[0]
    served = {int(m) for line in block if line.startswith("specpipe serve") for m in re.findall(r"--grpc-port (\d+)", line)}
    used = {int(m) for line in block if line.startswith(("specpipe generate", "specpipe validate"))
            for m in re.findall(r"localhost:(\d+)", line)}
    assert used and used <= served, f"talks to {sorted(used)}, starts {sorted(served)}"
    packaged = {line.split()[2] for line in block if line.startswith("specpipe package")}
    assert {line.split()[2] for line in block if line.startswith("specpipe serve")} <= packaged


def test_the_python_version_claimed_is_the_one_the_code_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"  # presets.py imports tomllib (3.11+)
    assert "Python 3.11+" in README.read_text() and "3.10" not in README.read_text()
    assert sys.version_info >= (3, 11)
