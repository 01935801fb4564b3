"""Before a Hugging Face download: can this token read the repository, and does what it fetches fit on disk?

:func:`check_sources` runs, for each repository a build will download, and before anything is written:

1. access: :meth:`huggingface_hub.HfApi.auth_check` (``GET /api/models/REPO/auth-check``), which raises
   :class:`~huggingface_hub.errors.GatedRepoError` for a gated repository whose licence this account has
   not accepted, :class:`~huggingface_hub.errors.RepositoryNotFoundError` for a missing or private one
   (the Hub answers 401 to both without a token), and a plain 401
   :class:`~huggingface_hub.errors.HfHubHTTPError` for a token the Hub refuses
   (``utils/_http.py`` ``hf_raise_for_status``, huggingface_hub 2.4.0);
2. size: :meth:`~huggingface_hub.HfApi.model_info` with ``files_metadata=True`` lists every file with
   its size; files the ``--exclude`` patterns drop (:func:`huggingface_hub.utils.filter_repo_objects`,
   the filter ``snapshot_download`` applies) and blobs already in the cache do not count, bytes of a
   resumable partial blob (:mod:`specpipe.models.hub_download`) count only for what is left;
3. disk: the bytes to fetch against :func:`shutil.disk_usage` of the cache's filesystem
   (``HF_HUB_CACHE``, default ``$HF_HOME/hub``) and, when the engines directory is on another
   filesystem (its files are then copies, not hard links), of the engines directory's.

A failure is one :class:`HubAccessError` / :class:`DiskSpaceError` line naming the repository and the fix.
huggingface_hub is imported inside the functions (dry runs stay light and offline).
"""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from specpipe.errors import SpecpipeError

GIB = 1024**3
LOGIN_FIX = "log in with `hf auth login` or set HF_TOKEN to a token of an account that has access"


class HubAccessError(SpecpipeError):
    """The Hub refused this token for a repository (gated licence not accepted, bad token, not found)."""


class DiskSpaceError(SpecpipeError):
    """A filesystem has less free space than the downloads need."""


@dataclass(frozen=True)
class HubSource:
    """One repository to download: ``repo_id``, ``revision`` (branch, tag or commit) and the
    ``--exclude`` glob patterns (``ignore_patterns`` of ``snapshot_download``)."""

    repo_id: str
    revision: str = "main"
    ignore_patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repository at a commit: ``path`` in the repository, ``size`` in bytes and the cache
    blob name ``etag`` (the LFS sha256, else the git blob id: the Hub's ``X-Linked-Etag`` / ``ETag``)."""

    path: str
    size: int
    etag: str


@dataclass
class RepoDownload:
    """What downloading ``source`` means: its ``commit``, the kept ``files`` and the bytes still to fetch
    (``missing``, in bytes; the kept total is :attr:`total`)."""

    source: HubSource
    commit: str
    files: list[RemoteFile] = field(default_factory=list)
    missing: int = 0

    @property
    def total(self) -> int:
        """Bytes of every kept file."""
        return sum(f.size for f in self.files)


def is_offline() -> bool:
    """Whether huggingface_hub is in offline mode (``HF_HUB_OFFLINE=1``): no Hub call may be made."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def licence_page(repo_id: str) -> str:
    """The repository's page on the Hub, where a gated licence is accepted: on ``HF_ENDPOINT``, default
    https://huggingface.co, as huggingface_hub 2.4.0 ``constants.py`` ``ENDPOINT`` reads it (without
    importing huggingface_hub: dry runs name the page too)."""
    return f"{os.environ.get('HF_ENDPOINT', 'https://huggingface.co').rstrip('/')}/{repo_id}"


def describe_hub_error(exc: BaseException, repo_id: str, revision: str = "main") -> str:
    """One line saying why the Hub refused ``repo_id`` (or the download failed) and the fix.

    ``exc`` is any exception a huggingface_hub call raised; unknown ones are quoted by their first line.
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, SpecpipeError):
        return str(exc)
    page = licence_page(repo_id)
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):
        return (
            f"{repo_id} is a gated repository and this account has not been granted access (HTTP {status}): "
            f"accept its licence at {page}, then {LOGIN_FIX}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r}: fix the revision in the preset or --draft-model"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{repo_id} was not found, or is private or gated and no accepted token was sent (HTTP {status}): "
            f"check the name at {page}; if it is gated, accept its licence there and {LOGIN_FIX}"
        )
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return (
            f"the Hugging Face Hub refused the token for {repo_id} (HTTP {status}): {LOGIN_FIX} "
            f"(tokens: https://huggingface.co/settings/tokens)"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        return (
            f"{repo_id}@{revision} is not (completely) in the Hugging Face cache {cache_root()} and the Hub "
            f"cannot be used (HF_HUB_OFFLINE=1 or no connection): unset HF_HUB_OFFLINE, check the network, "
            f"or run `hf download {repo_id}`"
        )
    if isinstance(exc, PermissionError):
        path = Path(exc.filename or cache_root()).absolute()
        in_cache = path.is_relative_to(cache_root().absolute())
        fix = (
            "set HF_HOME (or HF_HUB_CACHE) to a folder this user can write"
            if in_cache
            else "choose another --engines-dir"
        )
        return f"cannot write {path} (permission denied): {fix}, or fix its permissions"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return textwrap.shorten(lines[0], 300, placeholder=" ...") if lines else repr(exc)


def format_size(n: int) -> str:
    """``n`` bytes as GiB (two decimals) from 1 GiB up, else as MiB (one decimal)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def _hub_call(call, source: HubSource, endpoint: str):
    """``call()``, its Hub refusals as :class:`HubAccessError` and transport failures as one line."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return call()
    except HfHubHTTPError as exc:
        message = describe_hub_error(exc, source.repo_id, source.revision)
        raise HubAccessError(message if source.repo_id in message else f"{source.repo_id}: {message}") from exc
    except Exception as exc:  # transport errors (httpx), OfflineModeIsEnabled
        raise SpecpipeError(
            f"cannot reach the Hugging Face Hub at {endpoint} for {source.repo_id}: "
            f"{type(exc).__name__}: {_first_line(exc)}: check the network, or set HF_HUB_OFFLINE=1 "
            "to build from the cache only"
        ) from exc


def check_access(source: HubSource, api=None) -> None:
    """Raise unless the current token (``HF_TOKEN`` or ``hf auth login``) may download ``source``.

    Raises:
        HubAccessError: gated and not granted, refused token, not found (one line with the fix).
        SpecpipeError: the Hub cannot be reached (the endpoint and the cause).
    """
    from huggingface_hub import HfApi

    api = api or HfApi()
    _hub_call(lambda: api.auth_check(source.repo_id), source, api.endpoint)


def cache_root() -> Path:
    """The Hugging Face cache directory (``HF_HUB_CACHE``, default ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def storage_folder(repo_id: str) -> Path:
    """The cache folder of a model repository (``models--ORG--NAME``)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_root() / repo_folder_name(repo_id=repo_id, repo_type="model")


def plan_download(source: HubSource, api=None) -> RepoDownload:
    """The commit, kept files and bytes still to fetch of ``source`` (one ``model_info`` call).

    Raises:
        HubAccessError: the Hub refused the repository or revision.
        SpecpipeError: the Hub cannot be reached.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    api = api or HfApi()
    info = _hub_call(
        lambda: api.model_info(source.repo_id, revision=source.revision, files_metadata=True), source, api.endpoint
    )
    siblings = {s.rfilename: s for s in info.siblings or []}
    kept = filter_repo_objects(siblings, ignore_patterns=list(source.ignore_patterns) or None)
    files = [
        RemoteFile(name, int((s.lfs.size if s.lfs else s.size) or 0), s.lfs.sha256 if s.lfs else str(s.blob_id))
        for name, s in ((n, siblings[n]) for n in kept)
    ]
    blobs = storage_folder(source.repo_id) / "blobs"
    missing = 0
    for f in files:
        if (blobs / f.etag).is_file():
            continue
        partial = blobs / f"{f.etag}.incomplete"
        missing += max(f.size - (partial.stat().st_size if partial.is_file() else 0), 0)
    return RepoDownload(source, str(info.sha), files, missing)


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(downloads: list[RepoDownload], engines_dir: Path) -> list[str]:
    """Compare the downloads' bytes with the free space of the cache's and the engines directory's
    filesystems; returns one report line per filesystem.

    Raises:
        DiskSpaceError: a filesystem has less free space than needed (sizes, per repository, and the fix).
    """
    cache = cache_root()
    places = [
        (
            f"the Hugging Face cache {cache}",
            _existing(cache),
            [(d.source.repo_id, d.missing) for d in downloads],
            "free space there, or put the cache on a larger disk with HF_HOME=/path (or HF_HUB_CACHE)",
        )
    ]
    if os.stat(_existing(cache)).st_dev != os.stat(_existing(engines_dir)).st_dev:  # no hard links: copies
        places.append(
            (
                f"the engines directory {engines_dir} (another filesystem than the cache: files are copied)",
                _existing(engines_dir),
                [(d.source.repo_id, d.total) for d in downloads],
                "free space there, or choose another --engines-dir on the cache's filesystem",
            )
        )
    lines = []
    for what, probe, parts, fix in places:
        need, free = sum(n for _, n in parts), shutil.disk_usage(probe).free
        if need > free:
            detail = ", ".join(f"{repo} {format_size(n)}" for repo, n in parts)
            raise DiskSpaceError(
                f"not enough free disk for the downloads: {what} has {format_size(free)} free, "
                f"they need {format_size(need)} ({detail}): {fix}"
            )
        lines.append(f"disk: {what}: {format_size(need)} to write, {format_size(free)} free")
    return lines


def check_sources(sources: list[HubSource], engines_dir: Path, api=None) -> list[str]:
    """Access, size and free-disk checks of every source (see the module docstring); returns report lines.

    Raises:
        HubAccessError, DiskSpaceError, SpecpipeError: the first failing check.
    """
    if not sources:
        return []
    from huggingface_hub import HfApi

    api = api or HfApi()
    downloads = []
    for source in sources:
        check_access(source, api)
        downloads.append(plan_download(source, api))
    lines = [
        f"hub: {d.source.repo_id}@{d.source.revision} ({d.commit[:12]}): access ok, {len(d.files)} files, "
        f"{format_size(d.total)}, {format_size(d.missing)} not yet in the cache"
        for d in downloads
    ]
    return lines + check_disk(downloads, engines_dir)
