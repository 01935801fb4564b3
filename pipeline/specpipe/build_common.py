"""What the CPU and TensorRT-LLM build stages share: the engine-name rule, the writability probe, the
up-to-date check, the flags each runtime takes, and the CPU runtime's KV cache bound."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from specpipe.errors import FlagError, ManifestError, SpecpipeError
from specpipe.manifest import changed_files, read_manifest
from specpipe.progress import warn

ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class OutputRootError(SpecpipeError):
    """The engines root cannot be written."""


def is_engine_name(name: str) -> bool:
    """``name`` is a plain directory name: letters, digits, ``.``, ``_``, ``-``, no paths."""
    return bool(ENGINE_NAME.match(name))


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a file can be made in it (a ``mkdtemp`` probe, removed).

    Raises:
        OutputRootError: it cannot be created or written, naming the fix (``--engines-dir``).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".specpipe-probe-", dir=directory)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputRootError(
            f"cannot write to engines directory {directory} ({exc.strerror or exc}): choose another with --engines-dir"
        ) from exc


def up_to_date(dest: Path, inputs_hash: str, *, verify_files: bool = False) -> bool:
    """``dest`` holds an engine built from ``inputs_hash`` by this specpipe (version and manifest format).

    With ``verify_files`` every file the manifest lists (``target``/``draft`` ``files``) is rehashed;
    a missing or changed one is reported (stderr) and makes the engine out of date.
    """
    try:
        manifest = read_manifest(dest)
    except ManifestError:
        return False
    if manifest.inputs_hash != inputs_hash:
        return False
    if not verify_files:
        return True
    changed = changed_files(dest, manifest)
    if changed:
        warn(f"{changed[0]} is missing or changed since the build: rebuilding")
    return not changed


def physical_memory_bytes() -> int:
    """This machine's physical memory (bytes), 0 where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def cpu_kv_cache_bytes_per_token(arch) -> int:
    """Bytes the CPU runtime's fp32 KV cache takes per token of one request: ``2 x layers x kv_heads x
    head_dim x 4`` (``arch``: a :class:`~specpipe.presets.Architecture`)."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4


def check_cpu_batch_memory(arch, max_batch_size: int, memory_bytes: int | None = None) -> None:
    """Refuse a ``--max-batch-size`` whose KV cache cannot fit in this machine's memory.

    The CPU runtime keeps one fp32 KV cache slot per request decoded together, all as long as the
    longest request (:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`), so at full context it holds
    ``max_batch_size x max_position_embeddings x 2 x layers x kv_heads x head_dim x 4`` bytes
    (SmolLM2-135M: 45 KiB a token, 3 GiB for 8 requests at 8,192 tokens).

    Args:
        arch: the target's :class:`~specpipe.presets.Architecture`.
        memory_bytes: the memory to fit in (default: :func:`physical_memory_bytes`; 0 = unknown, no check).

    Raises:
        FlagError: the cache would exceed the memory, naming the largest batch size that fits.
    """
    memory = physical_memory_bytes() if memory_bytes is None else memory_bytes
    per_request = cpu_kv_cache_bytes_per_token(arch) * arch.max_position_embeddings
    allowed = max(1, memory // per_request)  # one request is always allowed: few reach the full context
    if not memory or max_batch_size <= allowed:
        return
    raise FlagError(
        f"--max-batch-size {max_batch_size} is more than this machine can hold: the CPU runtime's KV cache takes "
        f"{per_request / 2**20:.0f} MiB per request at the model's full context ({arch.max_position_embeddings} "
        f"tokens), {max_batch_size * per_request / 2**30:.1f} GiB in all, and the machine has "
        f"{memory / 2**30:.1f} GiB: use --max-batch-size {allowed} or less"
    )
