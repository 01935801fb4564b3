"""The record ``specpipe tune`` leaves for the next build: ``ENGINES_DIR/NAME.tuned.json``.

A build input (the build reads it, :func:`apply_tuned`) that ``specpipe tune`` writes (:func:`write_tuned`).

It sits beside the engine directory ``ENGINES_DIR/NAME`` (not inside it, since a rebuild replaces
that directory) and holds the best setting found (``max_draft_len``, and ``choices`` for tree
methods), the target and draft presets it was measured for, and the measured curve.

``specpipe build --runtime cpu`` for the same engine name, target and draft uses the recorded setting
when neither ``--max-draft-len`` nor ``--choices`` is given (:func:`apply_tuned`); flags given on the
command line always win. Delete the file to go back to the preset's settings.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specpipe.build_request import BuildRequest
from specpipe.errors import SpecpipeError
from specpipe.progress import done, warn
from specpipe.tree import Tree, TreeError

FORMAT = 1
SUFFIX = ".tuned.json"


def tuned_path(engines_dir: Path, name: str) -> Path:
    """``engines_dir/NAME.tuned.json``."""
    return Path(engines_dir) / f"{name}{SUFFIX}"


def write_tuned(
    path: Path,
    *,
    target: str | None,
    draft: str,
    method: str,
    best: dict[str, Any],
    curve: list[dict[str, Any]],
    measured_with: dict[str, Any],
) -> Path:
    """Write the record (through a temporary file, so a reader never sees half of it).

    Args:
        best: the chosen setting: ``{"max_draft_len": K}`` plus ``"choices"`` (a list of paths) for tree methods.
        curve: one entry per candidate measured (setting, tokens/s, acceptance ...).
        measured_with: the benchmark settings (prompts, concurrency, max tokens, requests).
    """
    record = {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "draft": draft,
        "method": method,
        "best": best,
        "measured_with": measured_with,
        "curve": curve,
    }
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_tuned(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or ``None`` when there is none.

    Raises:
        SpecpipeError: the file exists but is not a tuning record of this format.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecpipeError(
            f"cannot read the tuning record {path} ({exc}): delete it or rerun 'specpipe tune'"
        ) from exc
    best = record.get("best") if isinstance(record, dict) else None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or not isinstance(best, dict)
        or not isinstance(best.get("max_draft_len"), int)
        or best["max_draft_len"] <= 0
    ):
        raise SpecpipeError(
            f"{path} is not a specpipe tuning record (format {FORMAT} with best.max_draft_len): delete it or rerun 'specpipe tune'"
        )
    return record


def apply_tuned(request: BuildRequest, target_name: str, draft_name: str) -> BuildRequest:
    """``request`` with the tuned setting of its engine filled in, when a matching record exists.

    Nothing changes when ``--max-draft-len`` or ``--choices`` was given, when there is no record,
    or when the record was made for another target or draft (then a note says it was ignored).
    A recorded tree becomes ``request.choices`` as a :class:`~specpipe.tree.Tree`.

    Raises:
        SpecpipeError: a record file that cannot be read.
    """
    if request.max_draft_len is not None or request.choices is not None or draft_name == "none":
        return request
    path = tuned_path(request.engines_dir, request.engine_name(target_name, draft_name))
    record = read_tuned(path)
    if record is None:
        return request
    if record.get("target") != target_name or record.get("draft") != draft_name:
        warn(
            f"ignoring {path}: it was tuned for target {record.get('target')!r} and draft "
            f"{record.get('draft')!r}, not {target_name!r} and {draft_name!r}"
        )
        return request
    best = record["best"]
    try:
        tree = Tree.parse(best["choices"], what=f"{path} choices") if best.get("choices") else None
    except TreeError as exc:
        raise SpecpipeError(f"{exc}: delete {path} or rerun 'specpipe tune'") from exc
    done(
        f"using the tuned setting from {path}: max_draft_len={best['max_draft_len']}"
        + (f", {tree.nodes}-node tree" if tree else "")
    )
    return dataclasses.replace(request, max_draft_len=best["max_draft_len"], choices=tree)
