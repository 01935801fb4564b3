"""``manifest.json`` of an engine directory: what was built, from what, by which specpipe.

Schema (``format_version`` 1)::

    {
      "format_version": 1,
      "specpipe_version": "0.1.0",
      "name": "smollm2-135m-ngram",
      "runtime": "cpu" | "trtllm" | "trtllm-llmapi",
      "created": "2026-11-29T16:42:00+00:00",
      "inputs_hash": "<sha256 of the canonical build inputs>",
      "target": {"preset": ..., "source": {...}, "path": "target", "files": {"model.safetensors": "<sha256>", ...}},
      "draft": null | {"preset": ..., "kind": ..., "source": {...}, "path": "draft", "files": {...}},
      "speculative": {"method": "none" | "ngram" | "draft-model" | ..., "max_draft_len": 5, ...}
    }

Paths inside the manifest are relative to the engine directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.errors import ManifestError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def canonical_hash(obj: Any) -> str:
    """Hex sha256 of ``obj`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(engine_dir: Path, *, check_version: bool = True) -> dict[str, Any]:
    """Read and check ``engine_dir/manifest.json``.

    Raises:
        ManifestError: the directory or manifest is missing or unreadable, or (with
            ``check_version``) it was written by another specpipe version or format.
    """
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not engine_dir.is_dir():
        raise ManifestError(f"engine directory {engine_dir} does not exist: run 'specpipe build' first")
    if not path.is_file():
        raise ManifestError(
            f"{engine_dir} has no {MANIFEST_NAME}: it is not a specpipe engine directory "
            f"(rebuild it with 'specpipe build')"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is unreadable ({exc}): rebuild with 'specpipe build'") from exc
    if check_version:
        found = (manifest.get("format_version"), manifest.get("specpipe_version"))
        if found != (FORMAT_VERSION, __version__):
            raise ManifestError(
                f"{engine_dir} was built by specpipe {found[1]} (manifest format {found[0]}), this is "
                f"specpipe {__version__} (format {FORMAT_VERSION}): rebuild it with this version's "
                f"'specpipe build'"
            )
    return manifest


def write_manifest(engine_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` atomically (temporary file, then rename)."""
    path = Path(engine_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
