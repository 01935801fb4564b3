"""Shared rich console and progress helpers (stderr, so stdout stays clean for --json)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console

console = Console(stderr=True)


@contextmanager
def status(message: str) -> Iterator[None]:
    """Show a spinner with ``message`` while the block runs, then a check mark line."""
    with console.status(message):
        yield
    console.print(f"[green]✓[/green] {message}")
