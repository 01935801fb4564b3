"""The README and ``docs/`` cannot drift from the code: the command reference (``docs/cli.md``) and the
measurement tables are generated (cog), every command is documented and shown in use, every ``specpipe``
line in their shell blocks parses, every relative link points to a file (and heading) that exists, and the
Python the README claims is the one needed."""

import re
import shlex
import sys
import tomllib
from pathlib import Path

import click
import pytest
from repo_root import ROOT

from specpipe.cli import main
from specpipe.cli.reference import iter_commands

README = ROOT / "README.md"
CLI_REFERENCE = ROOT / "docs" / "cli.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CPU_SECTION = "## Without a GPU: the CPU reference runtime"


def doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def bash_blocks(text: str) -> list[list[str]]:
    """A document's ```bash blocks, continuation lines joined, comments dropped."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = body.replace("\\\n", " ")
        blocks.append([line.split(" #")[0].strip().rstrip("&").strip() for line in joined.splitlines() if line.strip()])
    return blocks


def specpipe_lines() -> list:
    return [
        pytest.param(line, id=f"{doc_id(doc)}: {line[:70]}")
        for doc in DOCS
        for block in bash_blocks(doc.read_text())
        for line in block
        if line.startswith("specpipe ")
    ]


@pytest.mark.parametrize("doc", [d for d in DOCS if "[[[cog" in d.read_text()], ids=doc_id)
def test_generated_sections_are_current(doc):
    """The command reference and the measurement tables are generated from the code and the results JSON."""
    cogapp = pytest.importorskip("cogapp")
    status = cogapp.Cog().main(["cog", "--check", str(doc)])
    assert status == 0, f"{doc.relative_to(ROOT)} is stale: run 'cog -r {doc.relative_to(ROOT)}'"


def test_every_registered_command_is_documented():
    """Each command has its section in the reference, and each is shown in use outside it."""
    reference = CLI_REFERENCE.read_text()
    for path, _ in iter_commands():
        assert f"### `specpipe {' '.join(path)}`" in reference, path
    prose = "\n".join(doc.read_text() for doc in DOCS if doc != CLI_REFERENCE)
    for path, command in iter_commands():
        if not isinstance(command, click.Group):
            assert f"specpipe {' '.join(path)}" in prose, f"'specpipe {' '.join(path)}' is never shown in use"


@pytest.mark.parametrize("line", specpipe_lines())
def test_every_specpipe_line_in_the_docs_parses(line):
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
    block = bash_blocks(text.split(CPU_SECTION)[1])[0]
    served = {
        int(m) for line in block if line.startswith("specpipe serve") for m in re.findall(r"--grpc-port (\d+)", line)
    }
    used = {
        int(m)
        for line in block
        if line.startswith(("specpipe generate", "specpipe validate", "specpipe bench"))
        for m in re.findall(r"localhost:(\d+)", line)
    }
    assert used and used <= served, f"talks to {sorted(used)}, starts {sorted(served)}"
    built = {
        f"{line.split('--target ')[1].split()[0]}-{line.split('--draft ')[1].split()[0]}"
        for line in block
        if line.startswith("specpipe build")
    }
    packaged = {line.split()[2] for line in block if line.startswith("specpipe package")}
    assert packaged <= built, f"packages {sorted(packaged)}, builds {sorted(built)}"
    assert {line.split()[2] for line in block if line.startswith("specpipe serve")} <= packaged


def _prose(text: str) -> str:
    """The text without fenced code, inline code and HTML comments (where brackets are not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a document (lower case, punctuation dropped, spaces to hyphens,
    ``-1``, ``-2`` ... after a repeated heading)."""
    found, counts = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
        counts[slug] = counts.get(slug, 0) + 1
    return found


def relative_links() -> list:
    links = []
    for doc in DOCS:
        for target in dict.fromkeys(re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _prose(doc.read_text()))):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not checked
                links.append(pytest.param(doc, target, id=f"{doc_id(doc)} -> {target}"))
    return links


@pytest.mark.parametrize(("doc", "target"), relative_links())
def test_every_relative_link_points_to_a_file(doc, target):
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    assert file.exists(), f"{doc_id(doc)} links to {target}: no such file"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file.read_text()), f"{doc_id(doc)} links to {target}: no such heading"


def test_the_readme_links_every_document():
    text = README.read_text()
    for doc in DOCS[1:]:
        assert f"](docs/{doc.name})" in text, f"README.md never links docs/{doc.name}"


def test_the_python_version_claimed_is_the_one_the_code_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"  # presets.py imports tomllib (3.11+)
    assert "Python 3.11+" in README.read_text() and "3.10" not in README.read_text()
    assert sys.version_info >= (3, 11)
