"""The GPUs a memory plan can be made for: memory (bytes) and CUDA compute capability.

Memory is the total device memory the driver reports (``nvidia-smi --query-gpu=memory.total``, MiB),
not the marketing figure: an "80 GB" H100 reports 81559 MiB. Figures are the commonly reported
values for the SXM/PCIe boards named; a board variant with a different total (e.g. H100 NVL 94 GB)
has its own entry. Compute capabilities are NVIDIA's published values (CUDA GPUs list).

``model`` is the token of the board name ``nvidia-smi`` prints that names the GPU model (``A100`` in
``NVIDIA A100-SXM4-80GB``, ``H100`` in ``NVIDIA H100 80GB HBM3``): detection
(:func:`specpipe.trtllm.environment.match_board`) splits the name on ``-`` and spaces and matches this
token exactly, then the memory. ``tests/trtllm/test_trtllm_gpu_names.py`` holds, for every row, the names and
totals real boards report, with where each was seen.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from specpipe.errors import SpecpipeError

MIB = 1 << 20
GIB = 1 << 30


class UnknownGpuError(SpecpipeError):
    """``--gpu`` names no GPU in :data:`GPUS`."""


@dataclass(frozen=True)
class Gpu:
    """One GPU model: ``memory_bytes`` total device memory (bytes), ``compute_capability`` (major, minor),
    ``model`` the model token of the board name ``nvidia-smi`` prints (see the module docstring)."""

    name: str
    description: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    model: str

    @property
    def sm(self) -> int:
        """SM version as TensorRT-LLM's ``get_sm_version()`` reports it (e.g. 90 for 9.0)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def arch(self) -> str:
        return {8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}.get(self.compute_capability[0], "?")


_TABLE = [
    Gpu("a10g-24gb", "NVIDIA A10G 24 GB", 23028 * MIB, (8, 6), "A10G"),
    Gpu("l4-24gb", "NVIDIA L4 24 GB", 23034 * MIB, (8, 9), "L4"),
    Gpu("a100-40gb", "NVIDIA A100 40 GB (SXM4/PCIe)", 40960 * MIB, (8, 0), "A100"),
    Gpu("a100-80gb", "NVIDIA A100 80 GB (SXM4/PCIe)", 81920 * MIB, (8, 0), "A100"),
    Gpu("l40s-48gb", "NVIDIA L40S 48 GB", 46068 * MIB, (8, 9), "L40S"),
    Gpu("h100-80gb", "NVIDIA H100 80 GB HBM3 (SXM/PCIe)", 81559 * MIB, (9, 0), "H100"),
    Gpu("h100-nvl-94gb", "NVIDIA H100 NVL 94 GB", 95830 * MIB, (9, 0), "H100"),
    Gpu("h200-141gb", "NVIDIA H200 141 GB HBM3e", 143771 * MIB, (9, 0), "H200"),
    Gpu("b200", "NVIDIA B200 (HGX, 180 GB usable HBM3e)", 183359 * MIB, (10, 0), "B200"),
]

GPUS: dict[str, Gpu] = {gpu.name: gpu for gpu in _TABLE}
ALIASES = {"b200-180gb": "b200", "h200": "h200-141gb", "h100": "h100-80gb", "l40s": "l40s-48gb"}


def lookup_gpu(name: str) -> Gpu:
    """The GPU named ``name`` (case-insensitive; a few short aliases such as ``h100`` accepted).

    Raises:
        UnknownGpuError: no such GPU; the message suggests the closest name and lists all.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    close = difflib.get_close_matches(key, list(GPUS) + list(ALIASES), n=1, cutoff=0.4)
    hint = f"did you mean '{ALIASES.get(close[0], close[0])}'? " if close else ""
    raise UnknownGpuError(f"unknown GPU '{name}': {hint}known GPUs: {', '.join(GPUS)}")
