"""What the CPU and TensorRT-LLM build stages share: the engine-name rule, the writability probe, the
up-to-date check, and the flags each runtime takes."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from specpipe.errors import ManifestError, SpecpipeError
from specpipe.manifest import read_manifest, sha256_file
from specpipe.progress import warn

ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class OutputRootError(SpecpipeError):
    """The engines root cannot be written."""


def is_engine_name(name: str) -> bool:
    """``name`` is a plain directory name: letters, digits, ``.``, ``_``, ``-``, no paths."""
    return bool(ENGINE_NAME.match(name))


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a file can be made in it (a ``mkdtemp`` probe, removed).

    Raises:
        OutputRootError: it cannot be created or written, naming the fix (``--engines-dir``).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".specpipe-probe-", dir=directory)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputRootError(
            f"cannot write to engines directory {directory} ({exc.strerror or exc}): choose another with --engines-dir"
        ) from exc


def up_to_date(dest: Path, inputs_hash: str, *, verify_files: bool = False) -> bool:
    """``dest`` holds an engine built from ``inputs_hash`` by this specpipe (version and manifest format).

    With ``verify_files`` every file the manifest lists (``target``/``draft`` ``files``) is rehashed;
    a missing or changed one is reported (stderr) and makes the engine out of date.
    """
    try:
        manifest = read_manifest(dest)
    except ManifestError:
        return False
    if manifest.inputs_hash != inputs_hash:
        return False
    if not verify_files:
        return True
    for part in (manifest.target, manifest.draft):
        if part is None or part.path is None:
            continue
        for rel, digest in part.files.items():
            path = Path(dest) / part.path / rel
            if not path.is_file() or sha256_file(path) != digest:
                warn(f"{path} is missing or changed since the build: rebuilding")
                return False
    return True

