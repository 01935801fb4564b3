"""``manifest.json`` of an engine directory: what was built, from what, by which specpipe.

The schema is :class:`Manifest` (``format_version`` 2); :func:`read_manifest` is its one reader and
:func:`write_manifest` its one writer. Paths inside the manifest are relative to the engine directory.
Both runtimes write the same ``speculative`` block (:class:`~specpipe.speculative.SpeculativeSettings`);
TensorRT-LLM engines add ``quantization``, ``parallel``, ``limits`` and ``trtllm`` (release, executor,
the plan's steps, the memory plan, the LLM-API settings).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.errors import ManifestError
from specpipe.speculative import Runtime, SpeculativeSettings

FORMAT_VERSION = 2
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


@dataclass(frozen=True)
class Part:
    """The target or the draft of an engine.

    Attributes:
        preset: the preset name.
        source: where the weights came from (``{"kind": "hf", "repo_id", "revision"}``, ``{"kind": "local",
            "path"}``, ``{"kind": "shipped", ...}`` ...).
        path: directory inside the engine directory (``target``, ``draft``), an absolute path for the LLM
            API flow, or ``None`` where the runtime fetches it itself.
        files: sha256 per file below ``path`` (CPU engines).
        method: the draft's method (drafts only).
        flavour: the draft checkpoint's flavour (``eagle1``, ``eagle3``, ``medusa``, ``causal-lm``), if known.
        heads: facts of EAGLE/Medusa heads (``num_heads``, ``num_layers``, ``hidden_size`` ...).
    """

    preset: str
    source: dict[str, Any] | None = None
    path: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    method: str | None = None
    flavour: str | None = None
    heads: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and not (k == "files" and not v)}


@dataclass(frozen=True)
class Manifest:
    """An engine directory's manifest.

    Attributes:
        name: the engine name (the directory's name).
        runtime: the runtime it was built for.
        inputs_hash: sha256 of the canonical build inputs; unchanged inputs skip the rebuild.
        target, draft: what was built from (``draft`` is ``None`` without draft weights).
        speculative: the resolved speculative settings.
        created: ISO 8601 time of the build.
        specpipe_version, format_version: who wrote it, in which schema.
        quantization, parallel, limits, trtllm: TensorRT-LLM engines only (scheme name; ``{"tp", "pp"}``;
            ``{"max_batch_size", "max_input_len", "max_seq_len"}`` in requests and tokens; release, executor,
            steps, memory plan, LLM-API settings), except ``limits``, which CPU engines also carry:
            ``{"max_batch_size"}``, the requests the CPU batch scheduler decodes together.
        vllm: vLLM deployments only: release, image, the ``vllm serve`` argv and its speculative config.
    """

    name: str
    runtime: Runtime
    inputs_hash: str
    target: Part
    speculative: SpeculativeSettings
    draft: Part | None = None
    created: str = ""
    specpipe_version: str = __version__
    format_version: int = FORMAT_VERSION
    quantization: str | None = None
    parallel: dict[str, int] | None = None
    limits: dict[str, int] | None = None
    trtllm: dict[str, Any] | None = None
    vllm: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format_version": self.format_version,
            "specpipe_version": self.specpipe_version,
            "name": self.name,
            "runtime": self.runtime.value,
            "created": self.created,
            "inputs_hash": self.inputs_hash,
            "target": self.target.to_json(),
            "draft": self.draft.to_json() if self.draft else None,
            "speculative": self.speculative.to_json(),
        }
        for key in ("quantization", "parallel", "limits", "trtllm", "vllm"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> "Manifest":
        """Parse a manifest read from ``where``.

        Raises:
            ManifestError: a missing or malformed field, naming it, with the fix (rebuild).
        """
        try:
            draft = data.get("draft")
            return cls(
                name=str(data["name"]),
                runtime=Runtime(data["runtime"]),
                inputs_hash=str(data["inputs_hash"]),
                target=Part(**data["target"]),
                draft=Part(**draft) if draft else None,
                speculative=SpeculativeSettings.from_json(data["speculative"], where),
                created=str(data.get("created", "")),
                specpipe_version=str(data["specpipe_version"]),
                format_version=int(data["format_version"]),
                quantization=data.get("quantization"),
                parallel=data.get("parallel"),
                limits=data.get("limits"),
                trtllm=data.get("trtllm"),
                vllm=data.get("vllm"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(
                f"{where} lacks a valid field ({exc!r}): rebuild the engine with 'specpipe build --force'"
            ) from exc


def _read_manifest_json(engine_dir: Path, *, check_version: bool = True) -> dict[str, Any]:
    """Read and check ``engine_dir/manifest.json`` as raw JSON.

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
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path} is not a JSON object: rebuild with 'specpipe build'")
    if check_version:
        found = (manifest.get("format_version"), manifest.get("specpipe_version"))
        if found != (FORMAT_VERSION, __version__):
            raise ManifestError(
                f"{engine_dir} was built by specpipe {found[1]} (manifest format {found[0]}), this is "
                f"specpipe {__version__} (format {FORMAT_VERSION}): rebuild it with this version's "
                f"'specpipe build'"
            )
    return manifest


def read_manifest(engine_dir: Path) -> Manifest:
    """Read, check and parse ``engine_dir/manifest.json``.

    Raises:
        ManifestError: the directory or manifest is missing, unreadable or malformed, or written by
            another specpipe version or manifest format; the message says to rebuild.
    """
    return Manifest.from_json(_read_manifest_json(engine_dir), f"{Path(engine_dir) / MANIFEST_NAME}")


def write_manifest(engine_dir: Path, manifest: "Manifest | dict[str, Any]") -> Path:
    """Write ``manifest.json`` atomically (temporary file, then rename)."""
    data = manifest.to_json() if isinstance(manifest, Manifest) else manifest
    path = Path(engine_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def changed_files(engine_dir: Path, manifest: Manifest) -> list[Path]:
    """The files the manifest lists (``target``/``draft`` ``files``, CPU engines) that are missing or
    whose sha256 differs from the build's: a copy cut short, a file edited or deleted since."""
    changed = []
    for part in (manifest.target, manifest.draft):
        if part is None or part.path is None:
            continue
        for rel, digest in part.files.items():
            path = Path(engine_dir) / part.path / rel
            if not path.is_file() or sha256_file(path) != digest:
                changed.append(path)
    return changed
