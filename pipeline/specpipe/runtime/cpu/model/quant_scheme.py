"""The weight-only quantizations the CPU runtime runs, by the GPU path's names (torch-free).

``specpipe build -q`` names TensorRT-LLM's schemes (:data:`specpipe.speculative.ALL_QUANTIZATIONS`).
The CPU runtime takes two of them, with the same meaning (weights stored in fewer bits, activations
and arithmetic kept in floating point) but PyTorch's own CPU kernels
(:mod:`~specpipe.runtime.cpu.model.quantized_linear`):

* ``int8-wo``: int8 weights, one fp32 scale per output channel (symmetric);
* ``int4-wo``: int4 weights, an fp32 scale and zero point per group of
  :data:`~specpipe.runtime.cpu.model.quantized_linear.INT4_GROUP_SIZE` input channels (asymmetric).

``auto`` (the default) keeps fp32. The choice is written to the engine's ``manifest.json``
(``quantization``) at build and applied when the engine is loaded.
"""

from __future__ import annotations

from specpipe.errors import FlagError, ManifestError

#: ``-q`` values the CPU runtime takes besides ``auto`` (fp32).
CPU_QUANTIZATIONS = ("int8-wo", "int4-wo")


def cpu_quantization(value: str | None) -> str | None:
    """The weight-only scheme a CPU build records for ``-q value``: ``None`` for ``auto`` (fp32), else
    ``value``.

    Raises:
        FlagError: any other ``-q`` (``fp8``, ``int4-awq``, ``bf16``, ``fp16``: TensorRT-LLM only),
            naming what the CPU runtime takes.
    """
    if value in (None, "auto"):
        return None
    if value not in CPU_QUANTIZATIONS:
        raise FlagError(f"-q/--quantization {value} is not taken by the CPU runtime (it applies to --runtime trtllm "
                        f"or trtllm-llmapi): give -q auto (fp32), {' or '.join(CPU_QUANTIZATIONS)}")
    return value


def manifest_quantization(value: object, where: str) -> str | None:
    """The scheme a CPU engine's manifest records (``quantization``): ``None`` (fp32) or one of
    :data:`CPU_QUANTIZATIONS`.

    Raises:
        ManifestError: another value, naming ``where`` and the fix (rebuild).
    """
    if value is None or value in CPU_QUANTIZATIONS:
        return value  # type: ignore[return-value]
    raise ManifestError(f"{where}: quantization {value!r} is not run by the CPU runtime (it runs none, "
                        f"{', '.join(CPU_QUANTIZATIONS)}): rebuild the engine with 'specpipe build --force' and "
                        f"-q auto, int8-wo or int4-wo")
