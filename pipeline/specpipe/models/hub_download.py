"""Download a Hugging Face repository into the Hugging Face cache, resumable across runs, and place its files.

What ``hf download REPO --revision R --exclude P`` does (the cache of ``HF_HUB_CACHE``, default
``$HF_HOME/hub``: ``blobs/``, ``snapshots/COMMIT/``, ``refs/``), with one difference: a file cut off
mid-way is continued by the next run. huggingface_hub 2.4.0 downloads each file into a process-unique
``<etag>.<random>.incomplete`` and deletes it when the download fails (``file_download.py``
``_download_to_tmp_and_move``), so only retries within one run resume (``http_get`` with ``Range``).
:func:`download_snapshot` therefore fetches every missing blob itself first, into the stable
``blobs/<etag>.incomplete`` under huggingface_hub's own lock (``.locks/<repo folder>/<etag>.lock``),
with huggingface_hub's ``http_get`` (``Range: bytes=<have>-``, size check, retries); a finished blob is
renamed to ``blobs/<etag>``. Then :func:`huggingface_hub.snapshot_download` (same repository, revision
and patterns) finds every blob present, writes the snapshot's links and refs, and returns the snapshot.

Files already in the cache (from any earlier ``hf download``, ``transformers`` or build) are never
fetched again. In offline mode (``HF_HUB_OFFLINE=1``) only the cache is used.
:func:`place` then hard-links (across filesystems: copies) the kept files into a step's folder, so that
a container that mounts only the engines directory sees real files, not links into the cache.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlsplit

from specpipe.errors import SpecpipeError
from specpipe.fsutil import make_readable
from specpipe.models.hub_access import HubSource, RemoteFile, cache_root, plan_download, storage_folder

SHA256 = re.compile(r"[0-9a-f]{64}")
#: Files fetched at once (huggingface_hub's ``snapshot_download`` default ``max_workers``).
WORKERS = 8
#: Seconds between two checks for Ctrl-C while the downloads run.
JOIN_S = 0.2


class CorruptDownloadError(SpecpipeError):
    """A resumed file's sha256 is not the one the Hub published for it."""


class DownloadCancelled(Exception):
    """Raised in a download thread when another file failed or the user pressed Ctrl-C."""


class _Cancellable:
    """The partial file as ``http_get`` writes it, stopping at the next chunk once ``cancelled`` is set
    (what was written stays for the next run)."""

    def __init__(self, file, cancelled: threading.Event):
        self._file, self._cancelled = file, cancelled

    def write(self, data: bytes) -> int:
        if self._cancelled.is_set():
            raise DownloadCancelled("download cancelled")
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


def download_snapshot(source: HubSource, *, workers: int = WORKERS) -> Path:
    """Fill the Hugging Face cache with ``source``'s kept files and return its snapshot folder.

    Returns:
        ``<cache>/models--ORG--NAME/snapshots/COMMIT`` (files are links into ``blobs/``).

    Raises:
        HubAccessError / SpecpipeError: from the listing (:func:`specpipe.models.hub_access.plan_download`);
        huggingface_hub's errors (``HfHubHTTPError``, ``LocalEntryNotFoundError``, httpx transport
        errors) or ``OSError`` from a file's download: the first failing file, after the others finished.
    """
    from huggingface_hub import constants, snapshot_download

    if not constants.is_offline_mode():
        todo = plan_download(source)
        blobs = storage_folder(source.repo_id) / "blobs"
        missing = [f for f in todo.files if not (blobs / f.etag).is_file()]
        if missing:
            _fetch_all(source.repo_id, todo.commit, missing, workers)
    return Path(
        snapshot_download(
            source.repo_id, revision=source.revision, ignore_patterns=list(source.ignore_patterns) or None
        )
    )


def _fetch_all(repo_id: str, commit: str, files: list[RemoteFile], workers: int) -> None:
    """Fetch ``files`` ``workers`` at a time, in daemon threads; the first error is raised once every file
    was tried. Ctrl-C (or SIGTERM) is raised at once: the threads stop at their next chunk, and one blocked
    in a stalled read (up to huggingface_hub's read timeout, ``HF_HUB_DOWNLOAD_TIMEOUT``, 10 s) does not
    hold the exit back (what it wrote stays in the partial blob for the next run)."""
    cancelled = threading.Event()
    pending: queue.SimpleQueue[RemoteFile] = queue.SimpleQueue()
    for f in files:
        pending.put(f)
    errors: list[BaseException] = []

    def work() -> None:
        while not cancelled.is_set():
            try:
                file = pending.get_nowait()
            except queue.Empty:
                return
            try:
                fetch_blob(repo_id, commit, file, cancelled)
            except Exception as exc:  # noqa: BLE001 -- raised in the calling thread once all are done
                errors.append(exc)

    threads = [
        threading.Thread(target=work, name=f"download-{i}", daemon=True)
        for i in range(max(1, min(workers, len(files))))
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_S)
    except BaseException:
        cancelled.set()
        raise
    if errors:
        raise errors[0]


def fetch_blob(repo_id: str, commit: str, file: RemoteFile, cancelled: threading.Event | None = None) -> Path:
    """Download one file of ``repo_id`` at ``commit`` into ``blobs/<etag>``, continuing its
    ``blobs/<etag>.incomplete`` if an earlier run left one; returns the blob path.

    Raises:
        huggingface_hub's ``HfHubHTTPError`` (refused, 5xx), httpx transport errors after
        ``http_get``'s retries, ``OSError`` (size mismatch, disk), :class:`CorruptDownloadError`.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    url = hf_hub_url(repo_id, file.path, revision=commit)
    meta = get_hf_file_metadata(url)
    etag = meta.etag or file.etag
    storage = storage_folder(repo_id)
    blob = storage / "blobs" / etag
    lock = cache_root() / ".locks" / repo_folder_name(repo_id=repo_id, repo_type="model") / f"{etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if blob.is_file():
            return blob
        partial = blob.with_name(f"{etag}.incomplete")
        headers = build_hf_headers()
        headers["Accept-Encoding"] = "identity"  # byte ranges of the stored bytes, not of a compressed body
        if urlsplit(meta.location).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed CDN address: no token to another host
        with open(partial, "ab") as out:
            resumed = out.tell()
            http_get(
                meta.location,
                _Cancellable(out, cancelled or threading.Event()),
                resume_size=resumed,
                headers=headers,
                expected_size=meta.size or file.size,
                displayed_filename=file.path,
            )
        if resumed and SHA256.fullmatch(etag) and _sha256(partial) != etag:
            partial.unlink()
            raise CorruptDownloadError(
                f"{repo_id}/{file.path}: the resumed file's sha256 is not the Hub's {etag}: "
                "its partial download was removed, run the build again"
            )
        make_readable(partial)
        os.replace(partial, blob)
    return blob


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def kept_files(snapshot: Path, ignore_patterns: list[str] | tuple[str, ...]) -> list[str]:
    """The snapshot's files (POSIX paths relative to it) that ``ignore_patterns`` keep."""
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    return list(filter_repo_objects(names, ignore_patterns=list(ignore_patterns) or None))


def place(snapshot: Path, destination: Path, ignore_patterns: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Hard-link (across filesystems: copy) the kept files of ``snapshot`` into ``destination``, which
    must not exist; returns the relative paths placed.

    Raises:
        SpecpipeError: the snapshot holds no kept file; ``OSError`` from the copies.
    """
    names = kept_files(Path(snapshot), ignore_patterns)
    if not names:
        raise SpecpipeError(f"the downloaded snapshot {snapshot} holds no files: check the repository's revision")
    destination.mkdir(parents=True)
    for name in names:
        source, target = (Path(snapshot) / name).resolve(), destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    return names
