"""The one place the library reports through: progress on stderr, results on stdout.

Progress, notes and warnings go to :data:`console` (stderr), so stdout stays clean for ``--json``;
results (a JSON document, a table, generated text) go through :func:`result` / :data:`out` (stdout).
Library modules print nothing themselves and import no click.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

console = Console(stderr=True)
out = Console()


@contextmanager
def status(message: str) -> Iterator[None]:
    """Show a spinner with ``message`` while the block runs, then a check mark line."""
    with console.status(message):
        yield
    console.print(f"[green]✓[/green] {message}")


def is_terminal() -> bool:
    """Whether progress (stderr) goes to a terminal, where a live line can be rewritten in place."""
    return console.is_terminal


#: huggingface_hub's switch for its tqdm bars, which transformers' bars (weights loading) follow too.
LIBRARY_BARS_OFF = "HF_HUB_DISABLE_PROGRESS_BARS"


def quiet_library_bars() -> None:
    """Turn off third-party progress bars when stderr is not a terminal.

    A tqdm bar redraws itself with carriage returns, so in a log file its redraws join into one line of
    thousands of characters. Sets :data:`LIBRARY_BARS_OFF` (unless the user set it), before huggingface_hub
    or transformers are imported, so it reaches them and every child process (Triton's model stubs)."""
    if not is_terminal():
        os.environ.setdefault(LIBRARY_BARS_OFF, "1")


@contextmanager
def live_line(message: str) -> Iterator[Callable[[str], None]]:
    """One status line (a spinner and ``message``) rewritten in place while the block runs; the block gets
    a function that replaces the text. Texts are shown as given (no markup: log lines have brackets)."""
    with console.status(Text(message), refresh_per_second=4) as shown:
        yield lambda text: shown.update(Text(text))


def done(message: str) -> None:
    """A finished step (stderr): ``✓ message``."""
    console.print(f"[green]✓[/green] {message}", highlight=False)


def warn(message: str) -> None:
    """Something the user should know that does not stop the command (stderr): ``! message``."""
    console.print(f"[yellow]![/yellow] {message}", highlight=False)


def note(message: str) -> None:
    """A plain progress line (stderr), printed as given (no markup)."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def result(text: str) -> None:
    """A result on stdout, written as given (a JSON document, a plan, generated text)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def result_renderable(renderable: Any, width: int | None = None) -> None:
    """A rich table (or other renderable) on stdout; ``width`` when stdout is not a terminal."""
    Console(width=None if sys.stdout.isatty() else width).print(renderable)


def count_bars(show: bool = True) -> Progress:
    """Progress bars on :data:`console` that count completed items (``description  bar  done/total  elapsed``);
    ``show`` False: nothing is drawn. Call ``stop()`` when done."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
    )
