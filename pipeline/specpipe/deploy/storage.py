"""What a pod of a TensorRT-LLM deployment reads, where it comes from, and how much room it takes.

The pod sees the repository at ``/models`` and the engines root at ``/engines``
(:mod:`specpipe.triton.deployment`), but reads only the paths the repository's configs name under
``/engines`` (engine flow: the engine's ``target``, ``draft`` and ``tokenizer`` folders; LLM API:
the downloaded checkpoints under ``/engines/.trtllm-work/``). :func:`pod_data` finds those paths
in the repository itself, so a claim or an image carries exactly them and not the whole engines
root. A claim holds them as ``repository/`` (mounted at ``/models``) and ``engines/REL``
(``engines/`` mounted at ``/engines``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from specpipe.errors import SpecpipeError
from specpipe.triton.deployment import CONTAINER_ENGINES

#: Sub-folders of the claim: the repository, and the engines root's needed part.
CLAIM_REPOSITORY = "repository"
CLAIM_ENGINES = "engines"
#: Room added to the measured size (engines are written once, but a re-copy or a log needs some).
HEADROOM = 1.2
_CONTAINER_PATH = re.compile(re.escape(CONTAINER_ENGINES) + r"/[^\s\"',]+")
_TEXT_SUFFIXES = {".pbtxt", ".yaml", ".yml", ".json"}


@dataclass(frozen=True)
class PodData:
    """The host folders a pod reads.

    Attributes:
        repo_dir: the repository (``triton_repo/NAME``), the pod's ``/models``.
        engines_root: the host engines root, the pod's ``/engines``.
        paths: what the repository names under ``/engines``, relative to it (POSIX, sorted, none
            inside another), e.g. ``("llama3-8b-eagle/target", "llama3-8b-eagle/tokenizer")``.
    """

    repo_dir: Path
    engines_root: Path
    paths: tuple[str, ...]

    def host_path(self, rel: str) -> Path:
        """The host path of ``rel`` (one of :attr:`paths`)."""
        return self.engines_root / rel

    def missing(self) -> list[Path]:
        """The host paths of :attr:`paths` that do not exist (an engine not built yet)."""
        return [self.host_path(rel) for rel in self.paths if not self.host_path(rel).exists()]


def pod_data(repo_dir: Path, engines_root: Path) -> PodData:
    """The paths the repository's configs (``config.pbtxt``, ``model.yaml`` ...) name under ``/engines``.

    Raises:
        SpecpipeError: a named path leaves ``/engines`` (``..``).
    """
    repo_dir = Path(repo_dir)
    found: set[PurePosixPath] = set()
    for path in sorted(repo_dir.rglob("*")):
        if path.is_file() and path.suffix in _TEXT_SUFFIXES:
            for match in _CONTAINER_PATH.findall(path.read_text(errors="replace")):
                rel = PurePosixPath(match).relative_to(CONTAINER_ENGINES)
                if ".." in rel.parts:
                    raise SpecpipeError(f"{path} names {match}, outside {CONTAINER_ENGINES}: repackage it with 'specpipe package'")
                found.add(rel)
    outer = sorted(p for p in found if not any(q != p and q in p.parents for q in found))
    return PodData(repo_dir, Path(engines_root), tuple(p.as_posix() for p in outer))


def disk_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (or of the file itself); links are not followed."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            stat = os.lstat(os.path.join(root, name))
            total += stat.st_size
    return total


def claim_size(data: PodData) -> str:
    """The claim's size: the repository and the engine paths as measured on disk, plus
    :data:`HEADROOM`, in whole GiB (``"17Gi"``; at least 1Gi).

    Raises:
        SpecpipeError: a path is not on disk yet (its size cannot be measured): build the engine or
            give the size.
    """
    missing = data.missing()
    if missing:
        raise SpecpipeError(f"{missing[0]} is not on disk (the engine is not built yet), so the claim's size cannot be "
                            f"measured: build the engine first, or give --storage-size (e.g. 200Gi)")
    total = disk_bytes(data.repo_dir) + sum(disk_bytes(data.host_path(rel)) for rel in data.paths)
    return f"{max(1, math.ceil(total * HEADROOM / 2**30))}Gi"


_QUANTITY = re.compile(r"^[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$")


def check_quantity(text: str) -> str:
    """``--storage-size``: a Kubernetes quantity such as ``200Gi`` (binary or decimal suffix).

    Raises:
        SpecpipeError: anything else.
    """
    if not _QUANTITY.match(text):
        raise SpecpipeError(f"--storage-size {text!r} is not a storage quantity: write it as e.g. 200Gi or 500G")
    return text
