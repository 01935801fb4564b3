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
