"""JSON Lines input (one JSON object per line), shared by every command that reads prompts."""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from specpipe.errors import SpecpipeError


def json_objects(lines: Iterable[str], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line (numbers start at 1).

    Args:
        lines: the file's lines.
        where: the source, for error messages (``"prompts file p.jsonl"``).

    Raises:
        SpecpipeError: a line that is not valid JSON or not a JSON object.
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecpipeError(
                f'{where} line {number} is not valid JSON ({exc.msg}): write one JSON object per line, e.g. {{"prompt": "..."}}'
            ) from exc
        if not isinstance(item, dict):
            raise SpecpipeError(f'{where} line {number} is not a JSON object: write {{"prompt": "..."}} on each line')
        yield number, item


def nonempty_string(item: dict[str, Any], key: str) -> str | None:
    """``item[key]`` when it is a string with non-blank text, else ``None``."""
    value = item.get(key)
    return value if isinstance(value, str) and value.strip() else None
