"""Filesystem helpers: whole-directory writes and hard-linked copies.

A directory is written into a temporary sibling, then renamed into place. On any failure (an
exception, Ctrl-C) the temporary directory is removed and an existing directory at the destination
is left as it was; readers never see a half-written directory.

Some writers create private files whatever the umask (safetensors writes mode 0600, temporary
directories are 0700), which a server running as another user (a container's, a pod's) cannot
read; finished outputs are therefore given the permissions the umask allows.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Callable
from pathlib import Path


def write_dir_atomically(out_dir: Path, fill: Callable[[Path], None]) -> Path:
    """Call ``fill(tmp)`` on an empty temporary directory beside ``out_dir``, then replace ``out_dir`` by it.

    Returns:
        ``out_dir`` as an absolute path.

    Raises:
        whatever ``fill`` raises (nothing is left behind), or ``OSError`` from the renames.
    """
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(out_dir)
    tag = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
    old = out_dir.parent / f".{out_dir.name}.old-{tag}"
    try:
        tmp.mkdir()
        fill(tmp)
        make_readable(tmp)
        if out_dir.exists():
            os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if old.exists():
                os.replace(old, out_dir)  # put the previous directory back
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def remove_abandoned(out_dir: Path) -> list[Path]:
    """Remove the temporary siblings of ``out_dir`` that a killed writer left (``SIGKILL``, power loss):
    those whose writer ran on this host and is no longer running (hostname and PID are in their names).
    A writer on another host sharing the folder, or still running, keeps its own. (A ``.old-`` sibling,
    left only by a kill between the two renames, may hold the only complete copy and is kept.)

    Returns:
        the directories removed.
    """
    removed = []
    host = socket.gethostname()
    for path in Path(out_dir).parent.glob(f".{Path(out_dir).name}.tmp-*"):
        writer_host, _, pid = path.name.rsplit(".tmp-", 1)[1].rpartition("-")[0].rpartition("-")
        if writer_host != host or not pid.isdigit() or _running(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_readable(path: Path) -> None:
    """Give ``path`` (a file, or a directory and everything below it) the read permissions, and for
    directories the search permission, that the process umask allows (e.g. 0600 -> 0644 under umask
    022). Symbolic links are not followed; nothing is made writable or executable that was not."""
    allowed = ~_umask()
    readable, searchable = 0o444 & allowed, 0o111 & allowed

    def fix(p: Path, is_dir: bool) -> None:
        mode = p.lstat().st_mode & 0o7777
        wanted = mode | readable | (searchable if is_dir else 0)
        if wanted != mode:
            os.chmod(p, wanted)

    path = Path(path)
    if path.is_symlink():
        return
    if not path.is_dir():
        fix(path, False)
        return
    fix(path, True)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                fix(Path(root, name), True)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                fix(Path(root, name), False)


def link_tree(src: Path, dst: Path, ignore: Callable | None = None) -> None:
    """Copy the directory ``src`` to ``dst``, hard-linking files where the filesystem allows it.

    Hard links make engine directories cheap (the weights are not duplicated on disk); across
    filesystems the files are copied. ``ignore`` is passed to :func:`shutil.copytree`.
    """

    def link_or_copy(source: str, destination: str) -> None:
        try:
            os.link(source, destination)
        except OSError:
            shutil.copy2(source, destination)

    shutil.copytree(src, dst, copy_function=link_or_copy, ignore=ignore)
