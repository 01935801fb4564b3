"""Reading a local ``tritonserver``'s log: its tail for error messages, and the lines that matter."""

from __future__ import annotations

from pathlib import Path

#: What Triton logs when it gave up waiting for its models and requests to finish at exit (status 1).
EXIT_TIMEOUT_LINE = "Exit timeout expired"


def log_tail(path: Path | None, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    if path is None or not Path(path).is_file():
        return ""
    text = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def model_load_failures(log_text: str) -> list[str]:
    """Lines of a Triton log that report a model failing to load."""
    return [line for line in log_text.splitlines() if "failed to load" in line]
