"""One copy of the weights in a loaded CPU engine.

transformers loads a ``model.safetensors`` checkpoint as tensors that view a memory map of the file
(safetensors' zero-copy load), and :mod:`~specpipe.runtime.cpu.model.prepack` then copies every linear weight
into oneDNN's layout. The packed copies are all the engine computes with, but as long as one tensor still
views the map (the embedding, a norm), the whole mapping stays and every page prepacking read stays
resident: measured with SmolLM2-135M (540 MB fp32) and an EAGLE engine, 634 MB file-backed + 842 MB
anonymous resident after loading (``/proc/self/status`` RssFile / RssAnon), i.e. the weights twice.

:func:`own_memory` gives the tensors that are not prepacked (embedding, norms, rotary buffers) memory of
their own, so the map is released once the linear layers are replaced; :func:`release_freed_memory`
hands what glibc keeps of the freed transient copies back to the system (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Iterable

import torch


def _prepackable(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and module.weight.dtype == torch.float32


@torch.no_grad()
def own_memory(module: torch.nn.Module, *, skip_prepackable: bool = False) -> int:
    """Copy every parameter and buffer of ``module`` into memory of its own (in place, keeping the
    ``Parameter`` objects, so tied weights stay tied).

    Args:
        skip_prepackable: leave the weights and biases that only fp32 ``nn.Linear`` layers hold (they are
            about to be replaced by prepacked copies); a tied weight that another module also holds (the
            embedding of a tied lm_head) is copied.

    Returns:
        bytes copied.
    """
    linear_only: set[int] = set()
    if skip_prepackable:
        holders: dict[int, set[bool]] = {}
        for sub in module.modules():
            for tensor in list(sub.parameters(recurse=False)) + list(sub.buffers(recurse=False)):
                holders.setdefault(id(tensor), set()).add(_prepackable(sub))
        linear_only = {key for key, kinds in holders.items() if kinds == {True}}
    copied = 0
    seen: set[int] = set()
    for tensor in list(module.parameters()) + list(module.buffers()):
        if id(tensor) in seen or id(tensor) in linear_only or tensor.is_mkldnn or tensor.device.type != "cpu":
            continue
        seen.add(id(tensor))
        tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)
        copied += tensor.numel() * tensor.element_size()
    return copied


def release_freed_memory() -> None:
    """Collect garbage, then ask glibc to return free heap pages to the system (:func:`trim_heap`)."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Ask glibc to return the free pages of its heaps to the system (``malloc_trim(0)``; no-op without
    glibc): freed tensors below glibc's mmap threshold, such as an outgrown KV cache, otherwise stay
    resident."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    return trim


def resident_bytes() -> dict[str, int]:
    """This process's resident memory from ``/proc/self/status``: ``VmRSS``, ``RssAnon``, ``RssFile``
    in bytes (empty where ``/proc`` is missing)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def tensor_bytes(tensors: Iterable[torch.Tensor], packed_sizes: dict[int, int] | None = None) -> int:
    """Bytes held by ``tensors``, each storage counted once (dense tensors: their storage's size, keyed
    by its address; oneDNN-layout tensors, which own their buffer: elements x element size).

    Args:
        packed_sizes: bytes of the packed tensors (by ``id``) whose element count is not their size:
            MKL's packed GEMM (:class:`~specpipe.runtime.cpu.model.prepack.PrepackedLinear`, kernel ``"mkl"``)
            allocates a buffer of ``cblas_sgemm_pack_get_size`` floats, 2-4x the weight for SmolLM2's
            layers, and writes, so makes resident, only the weight's size of it.
    """
    packed_sizes = packed_sizes or {}
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if tensor.is_mkldnn:
            key = id(tensor)
            size = packed_sizes.get(key, tensor.numel() * tensor.element_size())
        else:
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        if key not in seen:
            seen.add(key)
            total += size
    return total
