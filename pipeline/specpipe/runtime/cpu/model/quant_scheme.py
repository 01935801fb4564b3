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
        raise FlagError(
            f"-q/--quantization {value} is not taken by the CPU runtime (it applies to --runtime trtllm "
            f"or trtllm-llmapi): give -q auto (fp32), {' or '.join(CPU_QUANTIZATIONS)}"
        )
    return value


def manifest_quantization(value: object, where: str) -> str | None:
    """The scheme a CPU engine's manifest records (``quantization``): ``None`` (fp32) or one of
    :data:`CPU_QUANTIZATIONS`.

    Raises:
        ManifestError: another value, naming ``where`` and the fix (rebuild).
    """
    if value is None or value in CPU_QUANTIZATIONS:
        return value  # type: ignore[return-value]
    raise ManifestError(
        f"{where}: quantization {value!r} is not run by the CPU runtime (it runs none, "
        f"{', '.join(CPU_QUANTIZATIONS)}): rebuild the engine with 'specpipe build --force' and "
        f"-q auto, int8-wo or int4-wo"
    )


def target_weight_bytes(arch, scheme: str | None) -> int:
    """Bytes a Llama-style target's weights take once loaded by the CPU runtime under ``scheme``.

    fp32 (``None``): every parameter in 4 bytes (a tied lm_head shares the embedding). Weight-only: the
    linear layers of the decoder and the lm_head (its own copy where tied) at 1 byte a weight plus a bf16
    scale per output channel (``int8-wo``), or half a byte plus a bf16 scale and zero per 32 input channels
    (``int4-wo``); the embedding and the norms stay fp32. Layers the int4 kernel does not take become int8
    at load, which this does not model.

    Args:
        arch: a :class:`~specpipe.presets.Architecture` (counts of layers, heads, sizes).
        scheme: ``None``, ``"int8-wo"`` or ``"int4-wo"``.

    Raises:
        ValueError: another scheme.
    """
    h, i, v = arch.hidden_size, arch.intermediate_size, arch.vocab_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)] * arch.num_layers + [(v, h)]  # (out, in)
    norms = (2 * arch.num_layers + 1) * h * 4
    if scheme is None:
        return sum(o * n for o, n in shapes[:-1]) * 4 + v * h * 4 * (1 if arch.tie_word_embeddings else 2) + norms
    if scheme == "int8-wo":
        linear = sum(o * n + 2 * o for o, n in shapes)
    elif scheme == "int4-wo":
        linear = sum(o * n // 2 + 4 * o * (n // 32) for o, n in shapes)
    else:
        raise ValueError(f"unknown weight-only scheme {scheme!r}: give one of {', '.join(CPU_QUANTIZATIONS)}")
    return linear + v * h * 4 + norms
