"""The Hugging Face cache before a build's downloads: can this user write it, and (offline) does it hold them?

Two ways a download step fails that are knowable before any step runs, checked by the build together
with the Hub's access and free disk (:mod:`specpipe.models.hub_access`):

* the cache (``HF_HUB_CACHE``, default ``$HF_HOME/hub``) is not writable: huggingface_hub writes
  ``models--ORG--NAME/{blobs,snapshots,refs}`` and ``.locks/models--ORG--NAME`` there
  (``file_download.py`` ``hf_hub_download`` and ``_snapshot_download.py``, huggingface_hub 2.4.0);
  :func:`check_cache_writable` proves each of those folders, or its nearest existing parent, writable;
* offline (``HF_HUB_OFFLINE=1``) a repository missing from the cache, or only partly there:
  :func:`check_cached` asks :func:`huggingface_hub.snapshot_download` with ``local_files_only=True``
  (what the download step runs): it resolves ``refs/REVISION`` to a snapshot folder and raises
  ``LocalEntryNotFoundError`` when there is none, or ``IncompleteSnapshotError`` (a subclass) when the
  tree listing it cached at download time names files the snapshot lacks; the shards a
  ``*.index.json`` of the snapshot names are checked too (a listing is not cached by older downloads).

Each failure is one line naming the repository, the cache folder and the fix. huggingface_hub is
imported inside the functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.models.hub_access import HubSource, cache_root, storage_folder

CACHE_FIX = "set HF_HOME (or HF_HUB_CACHE) to a folder this user can write, or fix its permissions"


class CacheNotWritableError(SpecpipeError):
    """The Hugging Face cache (or a folder in it a download writes) cannot be written by this user."""


class NotCachedError(SpecpipeError):
    """Offline, and a repository to download is not (completely) in the Hugging Face cache."""


def _nearest_existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_cache_writable(repo_ids: list[str]) -> None:
    """Raise unless this user can write every folder of the cache that downloading ``repo_ids`` writes
    (each folder if it exists, else its nearest existing parent, where it would be created); writes nothing.

    Raises:
        CacheNotWritableError: names the folder, the cache and the variables that move it.
    """
    cache = cache_root()
    folders = [cache / ".locks"]
    for repo_id in repo_ids:
        repo = storage_folder(repo_id)
        folders += [repo / "blobs", repo / "snapshots", repo / "refs"]
    for folder in folders:
        probe = _nearest_existing(folder)
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            what = "is not a folder" if not probe.is_dir() else "is not writable by this user"
            raise CacheNotWritableError(
                f"the Hugging Face cache {cache} cannot be written: {probe} {what}: {CACHE_FIX}"
            )


def download_command(source: HubSource) -> str:
    """``hf download REPO [--revision R] [--exclude P ...]``: the command that fills the cache with ``source``."""
    parts = ["hf", "download", source.repo_id]
    if source.revision != "main":
        parts += ["--revision", source.revision]
    for pattern in source.ignore_patterns:
        parts += ["--exclude", f"'{pattern}'"]
    return " ".join(parts)


def _missing_shards(snapshot: Path) -> list[str]:
    missing = []
    for index in sorted(snapshot.glob("*.index.json")):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            missing.append(index.name)
            continue
        missing += sorted({name for name in weight_map.values() if not (snapshot / name).is_file()})
    return missing


def check_cached(source: HubSource) -> Path:
    """Offline: the snapshot folder of ``source`` in the cache, holding every file it needs.

    Raises:
        NotCachedError: no snapshot for the revision, or one missing files (the repository, the cache
            folder and the fix: unset ``HF_HUB_OFFLINE`` or run ``hf download``).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    where = f"{source.repo_id}@{source.revision}"
    fix = f"HF_HUB_OFFLINE=1: unset it or run `{download_command(source)}`"
    try:
        snapshot = Path(
            snapshot_download(
                source.repo_id,
                revision=source.revision,
                local_files_only=True,
                ignore_patterns=list(source.ignore_patterns) or None,
            )
        )
    except IncompleteSnapshotError as exc:
        raise NotCachedError(f"{where} is only partly in the Hugging Face cache {cache_root()} and {fix}") from exc
    except LocalEntryNotFoundError as exc:
        raise NotCachedError(f"{where} is not in the Hugging Face cache {cache_root()} and {fix}") from exc
    if not any(p.is_file() for p in snapshot.rglob("*")):
        raise NotCachedError(f"{where} has an empty snapshot in the Hugging Face cache {cache_root()} and {fix}")
    missing = _missing_shards(snapshot)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise NotCachedError(
            f"{where} is only partly in the Hugging Face cache {cache_root()} (missing {shown}) and {fix}"
        )
    return snapshot
