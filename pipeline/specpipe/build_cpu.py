"""``specpipe build --runtime cpu``: an engine directory for the CPU reference runtime.

Layout of ``engines/NAME/``::

    manifest.json   what was built, from what (sha256 of every file), by which specpipe
    target/         the target as a Hugging Face checkpoint (weights hard-linked from the cache)
    draft/          the draft model checkpoint (draft-model method only)

The directory is assembled under a temporary name beside the destination and renamed into place,
so an interrupted build leaves no half-written engine. Unchanged inputs skip the build.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, ManifestError, PresetError, SpecpipeError
from specpipe.manifest import FORMAT_VERSION, canonical_hash, read_manifest, sha256_file, write_manifest
from specpipe.presets import DraftPreset, TargetPreset, load_draft, load_target
from specpipe.progress import console

CPU_METHODS = ("none", "ngram", "draft-model")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_speculative(draft: DraftPreset, max_draft_len: int | None) -> dict[str, Any]:
    """The ``speculative`` block of the manifest: the preset's settings with overrides applied.

    Raises:
        PresetError: ``max_draft_len`` given for ``none``, or not a positive integer.
    """
    settings = dict(draft.speculative)
    if draft.kind == "none":
        if max_draft_len is not None:
            raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
        settings["max_draft_len"] = 0
    else:
        value = max_draft_len if max_draft_len is not None else settings.get("max_draft_len", 4)
        if not isinstance(value, int) or value <= 0:
            raise PresetError(f"max_draft_len must be a positive integer, got {value!r}")
        settings["max_draft_len"] = value
    settings["method"] = draft.kind
    return settings


def check_cpu_pairing(target: TargetPreset, draft: DraftPreset) -> None:
    """Refuse drafts the CPU runtime cannot run, or that were made for another target.

    Raises:
        PresetError: the method is not available on the CPU runtime.
        CompatibilityError: the draft was made for other targets.
    """
    if draft.kind not in CPU_METHODS:
        raise PresetError(
            f"draft '{draft.name}' ({draft.kind}) is not available on the CPU runtime yet: use one of "
            f"{', '.join(CPU_METHODS)} methods (e.g. --draft ngram), or --runtime trtllm"
        )
    if draft.for_targets and target.name not in draft.for_targets:
        raise CompatibilityError(
            f"draft '{draft.name}' was made for {', '.join(draft.for_targets)}, not for target "
            f"'{target.name}': pick a draft made for {target.name} (or --draft ngram)"
        )


def build_inputs(target: TargetPreset, draft: DraftPreset, speculative: dict[str, Any], draft_model: str | None) -> dict[str, Any]:
    """Everything that determines the engine's content; its hash decides whether to rebuild."""
    return {
        "runtime": "cpu",
        "specpipe_version": __version__,
        "target": {"preset": target.name, "source": target.source},
        "draft": {"preset": draft.name, "kind": draft.kind, "source": draft.source, "draft_model": draft_model},
        "speculative": speculative,
    }


def build_cpu(request: BuildRequest) -> Path:
    """Build (or reuse) ``engines/NAME`` for the CPU runtime and return its path.

    Raises:
        PresetError, CompatibilityError: bad presets or pairing (before anything is fetched).
        SpecpipeError: unwritable output root, failed download/conversion, corrupt cache.
    """
    target = load_target(request.target)
    draft = load_draft(request.draft)
    check_cpu_pairing(target, draft)
    if request.draft_model and draft.kind != "draft-model":
        raise PresetError(f"--draft-model only applies to draft-model drafts, not '{draft.name}' ({draft.kind})")
    speculative = resolve_speculative(draft, request.max_draft_len)
    name = request.engine_name(target.name, draft.name)
    if not _NAME.match(name):
        raise SpecpipeError(f"engine name {name!r} must be letters, digits, '.', '_' or '-' (no paths)")
    engines_dir = Path(request.engines_dir)
    _check_writable(engines_dir)
    dest = engines_dir / name

    inputs = build_inputs(target, draft, speculative, request.draft_model)
    inputs_hash = canonical_hash(inputs)
    if not request.force and _up_to_date(dest, inputs_hash):
        console.print(f"[green]✓[/green] engine {dest} is up to date (inputs unchanged): nothing rebuilt")
        return dest

    from specpipe.models.fetch import ensure_target_checkpoint, hash_tree

    target_ckpt = ensure_target_checkpoint(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=engines_dir))
    tmp.chmod(0o755)
    try:
        _link_tree(target_ckpt, tmp / "target")
        draft_entry = None
        if draft.kind == "draft-model":
            draft_entry = _make_draft(draft, request.draft_model, tmp / "target", tmp / "draft")
        manifest = {
            "format_version": FORMAT_VERSION,
            "specpipe_version": __version__,
            "name": name,
            "runtime": "cpu",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "inputs_hash": inputs_hash,
            "target": {
                "preset": target.name,
                "source": target.source,
                "path": "target",
                "files": hash_tree(tmp / "target"),
            },
            "draft": draft_entry and {**draft_entry, "files": hash_tree(tmp / "draft")},
            "speculative": speculative,
        }
        write_manifest(tmp, manifest)
        _replace_dir(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"[green]✓[/green] built engine {dest} ({draft.kind}, max_draft_len={speculative['max_draft_len']})")
    return dest


def _make_draft(draft: DraftPreset, draft_model: str | None, target_dir: Path, out: Path) -> dict[str, Any]:
    from specpipe.models.draft import check_same_vocabulary, truncate_target
    from specpipe.models.fetch import check_checkpoint_dir

    if draft_model:
        source_dir = Path(draft_model).expanduser()
        check_checkpoint_dir(source_dir)
        check_same_vocabulary(target_dir, source_dir)
        shutil.copytree(source_dir, out)
        source = {"kind": "local", "path": str(source_dir.resolve())}
    elif draft.source.get("kind") == "truncate-target":
        truncate_target(target_dir, out, int(draft.source["num_layers"]))
        check_same_vocabulary(target_dir, out)
        source = draft.source
    else:
        raise PresetError(
            f"draft preset '{draft.name}': source kind {draft.source.get('kind')!r} is not supported on "
            f"the CPU runtime (use truncate-target, or pass --draft-model DIR)"
        )
    return {"preset": draft.name, "kind": draft.kind, "source": source, "path": "draft"}


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecpipeError(f"cannot create engines directory {directory} ({exc.strerror}): choose another with --engines-dir") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecpipeError(f"engines directory {directory} is not writable: choose another with --engines-dir")


def _up_to_date(dest: Path, inputs_hash: str) -> bool:
    try:
        manifest = read_manifest(dest)
    except ManifestError:
        return False
    if manifest.get("inputs_hash") != inputs_hash:
        return False
    for part in ("target", "draft"):
        entry = manifest.get(part)
        if not entry:
            continue
        for rel, digest in entry.get("files", {}).items():
            path = dest / entry["path"] / rel
            if not path.is_file() or sha256_file(path) != digest:
                console.print(f"[yellow]![/yellow] {path} is missing or changed since the build: rebuilding")
                return False
    return True


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a checkpoint directory, hard-linking files where the filesystem allows it."""

    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy, ignore=shutil.ignore_patterns(".*"))


def _replace_dir(new: Path, dest: Path) -> None:
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        dest.rename(old)
        new.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        new.rename(dest)
