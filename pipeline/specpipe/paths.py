"""Where specpipe reads and writes: cache, preset directories, default output roots."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """Download/conversion cache: ``$SPECPIPE_CACHE`` or ``~/.cache/specpipe``."""
    env = os.environ.get("SPECPIPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specpipe"


def preset_roots() -> list[Path]:
    """Directories holding the shipped presets (``targets/`` and ``drafts/`` inside each).

    In a source checkout (editable install) these are the repository's ``build/``; in an installed
    wheel they are packaged under ``specpipe/_presets``. ``$SPECPIPE_PRESETS`` (os.pathsep-separated)
    adds user directories, searched first.
    """
    roots: list[Path] = []
    extra = os.environ.get("SPECPIPE_PRESETS")
    if extra:
        roots += [Path(p).expanduser() for p in extra.split(os.pathsep) if p]
    checkout_build = PACKAGE_DIR.parent.parent / "build"
    for candidate in (checkout_build, PACKAGE_DIR / "_presets"):
        if (candidate / "targets").is_dir():
            roots.append(candidate)
    return roots


def default_engines_dir() -> Path:
    return Path("engines")


def default_repo_dir() -> Path:
    return Path("triton_repo")
