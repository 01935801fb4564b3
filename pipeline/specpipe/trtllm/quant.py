"""Quantization schemes of the engine flow and where TensorRT-LLM 1.2 supports them.

Each scheme says which TensorRT-LLM tool writes the checkpoint, the bytes stored per weight and per
KV-cache element, and the GPUs it runs on. :func:`check_support` refuses the combinations TensorRT-LLM
rejects or does not support, before any step runs.

Sources (TensorRT-LLM):
    * ``examples/models/core/llama/convert_checkpoint.py`` @ fd96a08bdc489f41f139b295935b10ed43652fa1:
      ``--dtype``, ``--use_weight_only --weight_only_precision {int8,int4,...}``; AWQ "only supported by
      quantize.py".
    * ``examples/quantization/quantize.py`` @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd: ``--qformat``
      ``fp8``/``int4_awq``, ``--kv_cache_dtype fp8``, ``--awq_block_size`` 128, Medusa heads.
    * ``tensorrt_llm/builder.py`` ``build()`` (index copy id 205252225): on SM 100-119 INT8/INT4
      weight-only and INT8 KV cache raise ``RuntimeError``; FP8 context FMHA needs SM >= 89.
    * Support matrices (recorded per method in :data:`specpipe.speculative.METHODS`, ``quantizations``
      and ``quantization_source``): ``examples/eagle/README.md`` @ 585c756 (FP16/BF16, SM >= 80, no PP);
      ``examples/medusa/README.md`` (index copy id 713996416: FP16, BF16, FP8 base model, SM >= 80);
      ``examples/draft_target_model/README.md`` @ 567239f (FP16/BF16/FP8 both models, SM >= 80);
      ``examples/lookahead/README.md`` @ 83ab45a (FP16/BF16/FP8, SM >= 80).
    * FP8 needs SM >= 89 (Ada, Hopper, Blackwell): TensorRT-LLM precision documentation
      (``docs/source/reference/precision.md``; commit not checked, UNCONFIRMED) and the FP8 kernels'
      architecture guard in builder.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.errors import CompatibilityError
from specpipe.speculative import ALL_QUANTIZATIONS, Method, Runtime, spec_of
from specpipe.trtllm.gpus import Gpu

#: ``--quantization`` values: ``auto`` (the checkpoint's own 16-bit type) and every scheme.
QUANTIZATIONS = ("auto", *ALL_QUANTIZATIONS)


class UnsupportedCombinationError(CompatibilityError):
    """Quantization x speculative method x GPU that TensorRT-LLM 1.2 does not build or run."""


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme.

    Attributes:
        name: specpipe's name (``bf16``, ``fp8`` ...).
        dtype: TensorRT-LLM ``--dtype`` of the unquantized parts (``bfloat16``/``float16``).
        tool: ``convert`` (the model's convert_checkpoint.py) or ``quantize`` (quantize.py).
        weight_bytes: bytes stored per quantized weight (scales included, see ``scale_overhead``).
        kv_bytes: bytes per KV-cache element.
        min_sm: lowest SM version (e.g. 89) the kernels exist for.
        blocked_sm: SM range ``(lo, hi)`` inclusive where builder.py raises.
    """

    name: str
    dtype: str
    tool: str
    weight_bytes: float
    kv_bytes: int
    min_sm: int = 80
    blocked_sm: tuple[int, int] | None = None

    @property
    def quantized(self) -> bool:
        return self.name not in ("bf16", "fp16")


# int4-awq: 4-bit weights + one 16-bit scale per 128-weight block (--awq_block_size 128): 0.5 + 2/128.
SCHEMES: dict[str, Scheme] = {
    "bf16": Scheme("bf16", "bfloat16", "convert", 2.0, 2),
    "fp16": Scheme("fp16", "float16", "convert", 2.0, 2),
    "fp8": Scheme("fp8", "bfloat16", "quantize", 1.0, 1, min_sm=89),
    "int4-awq": Scheme("int4-awq", "bfloat16", "quantize", 0.5 + 2 / 128, 2, blocked_sm=(100, 119)),
    "int8-wo": Scheme("int8-wo", "bfloat16", "convert", 1.0, 2, blocked_sm=(100, 119)),
    "int4-wo": Scheme("int4-wo", "bfloat16", "convert", 0.5, 2, blocked_sm=(100, 119)),
}


def resolve_scheme(name: str, default_dtype: str = "bfloat16") -> Scheme:
    """The scheme for ``--quantization name``; ``auto`` is the checkpoint's own 16-bit type.

    Raises:
        CompatibilityError: unknown name.
    """
    if name == "auto":
        name = "fp16" if default_dtype == "float16" else "bf16"
    if name not in SCHEMES:
        raise CompatibilityError(f"unknown --quantization '{name}': use one of {', '.join(QUANTIZATIONS)}")
    return SCHEMES[name]


def engine_quantizations(method: Method | str) -> tuple[str, ...]:
    """The schemes the engine flow builds ``method`` with (the registry's support matrix; none for a
    method the engine flow does not run)."""
    spec = spec_of(method)
    return spec.quantizations if spec.runs_on(Runtime.TRTLLM) else ()


def check_support(scheme: Scheme, method: str, gpu: Gpu | None) -> None:
    """Refuse quantization x method x GPU combinations TensorRT-LLM 1.2 does not support.

    Raises:
        UnsupportedCombinationError: naming both sides and what to use instead.
    """
    spec = spec_of(method)
    method, allowed = spec.method.value, engine_quantizations(spec.method)
    if scheme.name not in allowed:
        raise UnsupportedCombinationError(
            f"--quantization {scheme.name} with --draft method '{method}' is not supported by TensorRT-LLM's "
            f"engine flow ({spec.quantization_source or method}): use --quantization "
            f"{' or '.join(allowed)}"
        )
    if gpu is None:
        return
    if method != "none" and gpu.sm < 80:
        raise UnsupportedCombinationError(
            f"speculative method '{method}' needs compute capability >= 8.0, {gpu.name} has "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}: use an Ampere or newer GPU"
        )
    if gpu.sm < scheme.min_sm:
        raise UnsupportedCombinationError(
            f"--quantization {scheme.name} needs compute capability >= {scheme.min_sm // 10}.{scheme.min_sm % 10} "
            f"(Ada/Hopper/Blackwell), {gpu.name} has {gpu.compute_capability[0]}.{gpu.compute_capability[1]}: "
            f"use --quantization bf16 or int4-awq on {gpu.name}, or an H100/H200/L40S"
        )
    if scheme.blocked_sm and scheme.blocked_sm[0] <= gpu.sm <= scheme.blocked_sm[1]:
        raise UnsupportedCombinationError(
            f"--quantization {scheme.name} (INT8/INT4 weight-only) fails on SM {gpu.sm} ({gpu.name}): TensorRT-LLM "
            f"raises 'INT8/INT4 quantization is not supported on SM>=100': use --quantization fp8 or bf16"
        )
