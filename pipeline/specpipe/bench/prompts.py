"""Prompt sets for ``specpipe bench``: the built-in ``chat``, ``code`` and ``summarize`` sets, or a JSONL file.

The built-in sets ship inside the package (``specpipe/bench/prompts/*.jsonl``); their texts were
written for specpipe (see ``prompts/SOURCES.md``). A user file has one JSON object per line with a
non-empty string ``prompt`` and optionally an ``id``; blank lines are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.jsonl import json_objects, nonempty_string

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
BUILTIN_SETS = ("chat", "code", "summarize")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: ``id`` (unique in its set) and the ``text`` sent to the model."""

    id: str
    text: str


def builtin_path(name: str) -> Path:
    """The JSONL file of built-in set ``name``."""
    return PROMPTS_DIR / f"{name}.jsonl"


def parse_prompts(lines: list[str], where: str) -> list[Prompt]:
    """Prompts from JSONL ``lines``; ``where`` names the source in error messages.

    Raises:
        SpecpipeError: a line that is not a JSON object with a non-empty string ``prompt``, or no
            prompt at all.
    """
    prompts: list[Prompt] = []
    for number, item in json_objects(lines, where):
        text = nonempty_string(item, "prompt")
        if text is None:
            raise SpecpipeError(
                f'{where} line {number} has no non-empty string "prompt": write {{"prompt": "..."}} on each line'
            )
        prompts.append(Prompt(id=str(item.get("id", f"{number}")), text=text))
    if not prompts:
        raise SpecpipeError(
            f'{where} holds no prompt: add lines like {{"prompt": "..."}} or use a built-in set ({", ".join(BUILTIN_SETS)})'
        )
    return prompts


def load_prompts(spec: str) -> tuple[list[Prompt], str]:
    """The prompts named by ``spec`` (a built-in set name or a ``.jsonl`` path) and a label for reports.

    Raises:
        SpecpipeError: an unknown set name, a missing or unreadable file, or a malformed/empty file.
    """
    if spec in BUILTIN_SETS:
        path = builtin_path(spec)
        return parse_prompts(path.read_text(encoding="utf-8").splitlines(), f"built-in prompt set {spec}"), spec
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SpecpipeError(
            f"--prompts {spec!r} is neither a built-in set ({', '.join(BUILTIN_SETS)}) nor a file: check the path"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecpipeError(f"cannot read prompts file {path} ({exc}): give a UTF-8 JSONL file") from exc
    return parse_prompts(text.splitlines(), f"prompts file {path}"), str(path)
