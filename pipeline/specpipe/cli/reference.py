"""The command reference in docs/cli.md, generated from the CLI itself (cogapp; ``tests/test_docs.py``
fails when it is stale: regenerate it with ``cog -r docs/cli.md``)."""

from __future__ import annotations

from collections.abc import Iterator

import click
from click.testing import CliRunner

WIDTH = 110


def iter_commands(
    group: click.Group | None = None, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command below ``group`` (default: ``specpipe``), groups first, as (``("deploy", "k8s")``, command)."""
    if group is None:
        from specpipe.cli import main as group
    for name in sorted(group.commands):
        command = group.commands[name]
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from iter_commands(command, (*path, name))


def help_text(path: tuple[str, ...]) -> str:
    """``specpipe PATH --help`` as printed at a fixed width."""
    from specpipe.cli import main

    result = CliRunner().invoke(main, [*path, "--help"], prog_name="specpipe", terminal_width=WIDTH)
    if result.exit_code != 0:
        raise RuntimeError(f"specpipe {' '.join(path)} --help failed: {result.output}")
    return result.output


def command_reference() -> str:
    """Markdown: one heading and one ``--help`` block per command."""
    parts = ["```\n" + help_text(()) + "```\n"]
    for path, _ in iter_commands():
        parts.append(f"\n### `specpipe {' '.join(path)}`\n\n```\n{help_text(path)}```\n")
    return "".join(parts)
