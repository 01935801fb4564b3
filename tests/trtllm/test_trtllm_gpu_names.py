"""Every row of the GPU table is detected from the names and totals real boards report through
``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``.

Each entry below is what ``nvidia-smi`` printed on a real machine, with where it was seen. A row added to
``specpipe.trtllm.gpus`` without such an entry fails ``test_every_gpu_row_has_a_real_nvidia_smi_name``.
"""

import pytest
from fake_programs import printing_program

from specpipe.trtllm import environment
from specpipe.trtllm.gpus import GPUS, MIB

MEMORY_FIGURES = "https://thundergolfer.com/blog/nvidia-gpu-memory-capacity (NVML totals, MiB, per board)"

#: GPU table row -> [(name nvidia-smi prints, memory.total MiB, where it was seen)].
REAL_BOARDS: dict[str, list[tuple[str, int, str]]] = {
    "a10g-24gb": [
        ("NVIDIA A10G", 23028, "https://github.com/NVIDIA/DCGM/issues/232 (nvidia-smi table: 8722MiB / 23028MiB)")
    ],
    "l4-24gb": [
        (
            "NVIDIA L4",
            23034,
            f"{MEMORY_FIGURES}; name as in nvidia-smi --query-gpu=name logs on GitHub ('NVIDIA L4, 23034 MiB')",
        )
    ],
    "a100-40gb": [
        (
            "NVIDIA A100-SXM4-40GB",
            40960,
            "https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834 (nvidia-smi table: 598MiB / 40960MiB)",
        ),
        (
            "NVIDIA A100-PCIE-40GB",
            40960,
            f"{MEMORY_FIGURES}; name as in nvidia-smi --query-gpu=name,memory.total "
            f"output on GitHub ('NVIDIA A100-PCIE-40GB, 40960 MiB')",
        ),
    ],
    "a100-80gb": [
        (
            "NVIDIA A100-SXM4-80GB",
            81920,
            "https://github.com/NVIDIA/CUDALibrarySamples/issues/104 (Product Name) and "
            "https://github.com/NVIDIA/DCGM/issues/152; total: " + MEMORY_FIGURES,
        ),
        (
            "NVIDIA A100 80GB PCIe",
            81920,
            f"{MEMORY_FIGURES}; name as in nvidia-smi --query-gpu=name,memory.total "
            f"output on GitHub ('NVIDIA A100 80GB PCIe, 81920 MiB')",
        ),
    ],
    "l40s-48gb": [
        (
            "NVIDIA L40S",
            46068,
            "https://github.com/akash-network/provider-configs/pull/99 "
            "(nvidia-smi --query-gpu=name,driver_version,memory.total: 46068 MiB)",
        )
    ],
    "h100-80gb": [
        (
            "NVIDIA H100 80GB HBM3",
            81559,
            "https://github.com/NVIDIA/nccl/issues/1264 (nvidia-smi table: 0MiB / 81559MiB)",
        ),
        (
            "NVIDIA H100 PCIe",
            81559,
            "nvidia-smi --query-gpu=name,memory.total output on GitHub "
            "('NVIDIA H100 PCIe, 81559 MiB'); total: " + MEMORY_FIGURES,
        ),
    ],
    "h100-nvl-94gb": [
        (
            "NVIDIA H100 NVL",
            95830,
            "https://github.com/akash-network/provider-configs/pull/91 (name, "
            "nvidia-smi --query-gpu=name); total as in nvidia-smi "
            "--query-gpu=name,memory.total output on GitHub ('NVIDIA H100 NVL, 95830 MiB')",
        )
    ],
    "h200-141gb": [
        (
            "NVIDIA H200",
            143771,
            "https://github.com/NVIDIA/mig-parted/issues/120 (Product Name: NVIDIA H200); total: " + MEMORY_FIGURES,
        )
    ],
    "b200": [
        (
            "NVIDIA B200",
            183359,
            "https://github.com/NVIDIA/TensorRT-LLM/issues/10278 (nvidia-smi table: 166593MiB / 183359MiB)",
        )
    ],
}
CASES = [(row, name, mib) for row, boards in REAL_BOARDS.items() for name, mib, _ in boards]


def fake_nvidia_smi(tmp_path, monkeypatch, output: str) -> None:
    """An ``nvidia-smi`` on PATH that prints ``output`` (the CSV lines of the query)."""
    printing_program(tmp_path / "bin", "nvidia-smi", output)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_every_gpu_row_has_a_real_nvidia_smi_name():
    missing = sorted(set(GPUS) - set(REAL_BOARDS))
    assert not missing, f"GPU rows without a real nvidia-smi name and total in REAL_BOARDS: {missing}"
    assert not set(REAL_BOARDS) - set(GPUS)
    assert all(source for boards in REAL_BOARDS.values() for _, _, source in boards)


@pytest.mark.parametrize("row, name, mib", CASES, ids=[c[1] for c in CASES])
def test_each_real_board_matches_its_row(row, name, mib):
    assert abs(GPUS[row].memory_bytes / MIB - mib) <= environment.MEMORY_TOLERANCE * mib
    assert environment.match_board(name, mib) == row


@pytest.mark.parametrize(
    "name, mib, row",
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-40gb"),
    ],
)
def test_a100_boards_are_detected_through_nvidia_smi(tmp_path, monkeypatch, name, mib, row):
    fake_nvidia_smi(tmp_path, monkeypatch, f"{name}, {mib}")
    assert environment.detect_gpu() == row


def test_the_model_token_is_matched_whole():
    assert environment.match_board("NVIDIA L4", 23034) == "l4-24gb"
    assert environment.match_board("NVIDIA L40S", 23034) is None  # L40S is not L4
    assert environment.match_board("NVIDIA GH200 480GB", 97871) is None
    assert environment.match_board("NVIDIA A800-SXM4-80GB", 81920) is None  # an A800 is not in the table
