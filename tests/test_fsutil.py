"""Whole-directory writes: all or nothing, readable by other users as the umask allows."""

from __future__ import annotations

import os
import stat

import pytest

from specpipe.fsutil import link_tree, make_readable, write_dir_atomically


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_failed_fill_leaves_the_previous_directory_and_no_temporary(tmp_path):
    out = tmp_path / "engine"
    write_dir_atomically(out, lambda d: (d / "a.txt").write_text("first"))

    def broken(d):
        (d / "a.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_dir_atomically(out, broken)
    assert (out / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_outputs_get_the_read_permissions_the_umask_allows(tmp_path, umask_022):
    def fill(d):
        private = d / "weights.safetensors"
        private.write_bytes(b"x")
        os.chmod(private, 0o600)  # as safetensors writes it
        (d / "sub").mkdir(mode=0o700)  # as tempfile.mkdtemp makes it
        script = d / "sub" / "run.sh"
        script.write_text("#!/bin/sh\n")
        os.chmod(script, 0o700)

    out = write_dir_atomically(tmp_path / "repo", fill)
    assert _mode(out) == 0o755 and _mode(out / "sub") == 0o755
    assert _mode(out / "weights.safetensors") == 0o644  # readable, not made executable
    assert _mode(out / "sub" / "run.sh") == 0o744  # executable for its owner only, as it was


def test_make_readable_respects_a_stricter_umask(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"")
    os.chmod(f, 0o600)
    old = os.umask(0o077)
    try:
        make_readable(f)
    finally:
        os.umask(old)
    assert _mode(f) == 0o600


def test_link_tree_shares_file_data(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"abc")
    link_tree(src, tmp_path / "dst")
    assert (tmp_path / "dst" / "w.bin").read_bytes() == b"abc"
    assert os.stat(src / "w.bin").st_ino == os.stat(tmp_path / "dst" / "w.bin").st_ino


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_write(tmp_path):
    """SIGKILL cannot be caught, so the next write of the same folder removes what a dead writer on this
    host left; a live writer's folder and another host's are kept."""
    import os
    import socket
    import subprocess
    import sys

    from specpipe.fsutil import remove_abandoned

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    out = tmp_path / "engine"
    left = {
        name: tmp_path / f".engine.tmp-{name}"
        for name in (
            f"{host}-{dead.pid}-0badc0de",
            f"{host}-{os.getpid()}-11111111",
            f"elsewhere-{dead.pid}-22222222",
            "old-format",
        )
    }
    for path in left.values():
        (path / "weights").mkdir(parents=True)
    (tmp_path / ".other.tmp-x").mkdir()
    assert remove_abandoned(out) == [left[f"{host}-{dead.pid}-0badc0de"]]
    write_dir_atomically(out, lambda d: (d / "f").write_text("x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".other.tmp-x", "engine"] + [p.name for n, p in left.items() if n != f"{host}-{dead.pid}-0badc0de"]
    )


def test_sigterm_during_a_write_leaves_nothing_behind(tmp_path):
    """``kill`` (SIGTERM) ends a specpipe command as Ctrl-C does, so a write in progress is cleaned up."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import signal, sys, time\n"
        "from pathlib import Path\n"
        "from specpipe.cli import _stop_on_sigterm\n"
        "from specpipe.fsutil import write_dir_atomically\n"
        "signal.signal(signal.SIGTERM, _stop_on_sigterm)\n"
        "def fill(d):\n"
        "    (d / 'part').write_text('x')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        f"write_dir_atomically(Path({str(tmp_path / 'out')!r}), fill)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    proc.wait(timeout=30)
    assert time.monotonic() - started < 10 and proc.returncode != 0
    assert list(tmp_path.iterdir()) == []
