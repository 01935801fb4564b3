"""Weight-only int8 and int4 linear layers on PyTorch's own packed CPU kernels (``-q int8-wo|int4-wo``).

The decode step is bound by the bytes of weights streamed per step (docs/cpu-measurements.md); storing
them in 8 or 4 bits cuts those bytes to about a quarter or an eighth of fp32's. As in TensorRT-LLM's
weight-only schemes of the same names, the activations enter the kernel in 16 bits (bf16 here, the
scales and zeros too) and the layer returns float32.

Why bf16 activations: with float32 inputs both ATen kernels take a slow path, slower than the fp32
prepacked layer itself; with bf16 inputs they are 2-3 times faster than it at 1-4 rows and close to it
at 12 (figures in ``docs/experiments.md``).

Kernels (ATen ops, the ones TorchInductor's CPU lowering and torchao's CPU layouts call; torch 2.13):

* ``int8-wo``: ``torch.ops.aten._weight_int8pack_mm(x, weight_int8 [N, K], scales [N])``: symmetric
  per-output-channel scales, ``w = q * scale`` with ``q`` in [-127, 127];
* ``int4-wo``: ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)`` on a
  weight packed by ``aten._convert_weight_to_int4pack_for_cpu`` (``q`` in [0, 15] as int32 ``[N, K]``
  -> uint8 ``[N, K / 2]``), with ``scales_and_zeros`` ``[K / group, N, 2]`` and
  ``w = (q - 8) * scale + zero`` per group of ``group`` input channels (checked against a dequantized
  matmul in ``tests/runtime/cpu/test_quantized_linear.py``). The packing needs ``N`` divisible by 16 and the kernel a
  group of 32, 64, 128 or 256 dividing ``K``; a layer that does not fit gets ``int8-wo``.

Batch invariance: each layer checks at load (:func:`invariant_min_rows`) that its kernel computes a row
bitwise alike at every row count of :data:`~specpipe.runtime.cpu.model.prepack.INVARIANCE_ROWS`, and pads
short inputs as :class:`~specpipe.runtime.cpu.model.prepack.PrepackedLinear` does where a CPU computes them
differently.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specpipe.runtime.cpu.model.prepack import INVARIANCE_ROWS, MAX_PAD_ROWS, PrepackedLinear
from specpipe.runtime.cpu.model.quant_scheme import CPU_QUANTIZATIONS

#: Input channels per int4 scale and zero point: the bf16 scale and zero (4 bytes a group) add 25 % to
#: the int4 bytes at 32 (12.5 % at 64). SmolLM2-135M teacher-forced over 8 prompts (58 positions), logits'
#: relative error against fp32 (worst prompt) and top-1 agreement: group 32 0.11 / 88 %, 64 0.42 / 50 %,
#: 128 0.46 / 50 % (``tests/runtime/cpu/test_quantized_smollm2.py``).
INT4_GROUP_SIZE = 32

#: Group sizes the int4 CPU kernel takes, tried from :data:`INT4_GROUP_SIZE` down.
_INT4_GROUPS = (256, 128, 64, 32)

#: The dtype activations, scales and zeros enter the kernels in (module doc).
COMPUTE_DTYPE = torch.bfloat16

#: :attr:`QuantizedLinear.min_rows` found per (scheme, out_features, in_features, group, threads).
_MIN_ROWS: dict[tuple, int] = {}


def invariant_min_rows(kernel_rows: Callable[[torch.Tensor], torch.Tensor], in_features: int) -> int:
    """The fewest rows from which ``kernel_rows`` (float32 ``[T, in_features]`` -> ``[T, out]``) computes
    each row bitwise alike whatever the other rows, checked on random rows at each of
    :data:`~specpipe.runtime.cpu.model.prepack.INVARIANCE_ROWS` (the rule of
    :meth:`~specpipe.runtime.cpu.model.prepack.PrepackedLinear.batch_invariant_min_rows`): 1 where every count
    agrees, at most :data:`~specpipe.runtime.cpu.model.prepack.MAX_PAD_ROWS`, and 1 where it takes more."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(max(INVARIANCE_ROWS), in_features, generator=generator)
    with torch.inference_mode():
        reference = kernel_rows(x)
        agrees = [torch.equal(kernel_rows(x[:n].clone()), reference[:n]) for n in INVARIANCE_ROWS]
    min_rows = max(INVARIANCE_ROWS)
    for n, same in zip(reversed(INVARIANCE_ROWS), reversed(agrees)):
        if not same:
            break
        min_rows = n
    return min_rows if min_rows <= MAX_PAD_ROWS else 1


def int4_group_size(out_features: int, in_features: int) -> int | None:
    """The int4 group for a ``[out_features, in_features]`` weight: the largest of 32, 64, 128, 256 up to
    :data:`INT4_GROUP_SIZE` that divides ``in_features``; ``None`` where none does or ``out_features``
    is not a multiple of 16 (the packing's requirement)."""
    if out_features % 16:
        return None
    return next((g for g in _INT4_GROUPS if g <= INT4_GROUP_SIZE and in_features % g == 0), None)


class QuantizedLinear(torch.nn.Module):
    """A weight-only quantized linear layer (module doc): ``[..., in_features]`` -> float32
    ``[..., out_features]`` (inputs enter the kernel as :data:`COMPUTE_DTYPE`, its outputs are widened
    to float32 and the bias added); inference only.

    Args:
        weight: float ``[out_features, in_features]`` (fp32 or bf16; quantized from its fp32 values and
            not held afterwards).
        bias: float ``[out_features]`` or ``None`` (kept in fp32, added after the kernel).

    Scales (and int4 zeros) are bf16, rounded up from ``max |w| / 127`` (int8) and ``(max - min) / 15``
    per group (int4), so the error per weight is at most half a step (int4: plus the zero's bf16
    rounding, ``|zero| * 2**-8``).
        scheme: ``"int8-wo"`` or ``"int4-wo"`` (:data:`~specpipe.runtime.cpu.model.quant_scheme.CPU_QUANTIZATIONS`);
            an int4 layer whose shape the kernel does not take (:func:`int4_group_size`) becomes int8.

    Attributes:
        scheme: the scheme this layer runs. group: int4 input channels per scale (0 for int8).
        min_rows: inputs of fewer rows are padded with zero rows to this many (:func:`invariant_min_rows`).

    Raises:
        ValueError: an unknown scheme or a weight that is not 2-D.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scheme: str):
        super().__init__()
        if scheme not in CPU_QUANTIZATIONS:
            raise ValueError(f"scheme must be one of {', '.join(CPU_QUANTIZATIONS)}, got {scheme!r}")
        if weight.dim() != 2:
            raise ValueError(f"QuantizedLinear needs a [out, in] weight, got shape {tuple(weight.shape)}")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.group = int4_group_size(*w.shape) if scheme == "int4-wo" else None
        self.scheme = "int4-wo" if self.group else "int8-wo"
        self.group = self.group or 0
        self.bias = None if bias is None else bias.detach().float().clone()
        if self.scheme == "int8-wo":
            scales = _bf16_at_least(w.abs().amax(dim=1) / 127)
            self.weight = torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8)
            self.scales = scales.to(COMPUTE_DTYPE)
        else:
            grouped = w.reshape(self.out_features, -1, self.group)
            low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
            scale = _bf16_at_least((high - low) / 15)
            zero = (low + 8 * scale).to(COMPUTE_DTYPE).float()  # w = (q - 8) * scale + zero
            q = torch.clamp(torch.round((grouped - (zero - 8 * scale)[..., None]) / scale[..., None]), 0, 15)
            self.weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                q.to(torch.int32).reshape(self.out_features, self.in_features), 1
            )
            # [K / group, N, 2]: each group's scale and zero
            self.scales = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(COMPUTE_DTYPE)
        key = (self.scheme, self.out_features, self.in_features, self.group, torch.get_num_threads())
        if key not in _MIN_ROWS:
            _MIN_ROWS[key] = invariant_min_rows(self._kernel_rows, self.in_features)
        self.min_rows = _MIN_ROWS[key]

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear | PrepackedLinear, scheme: str) -> "QuantizedLinear":
        """The quantized copy of an ``nn.Linear`` (``linear`` is left unchanged).

        Raises:
            TypeError: not an ``nn.Linear`` (a :class:`~specpipe.runtime.cpu.model.prepack.PrepackedLinear`'s
                weight is packed: quantize before prepacking). ValueError: what :class:`QuantizedLinear` raises.
        """
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"quantize the nn.Linear layers before prepacking them, got {type(linear).__name__}")
        return cls(linear.weight, linear.bias, scheme)

    def _kernel_rows(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel on 2-D contiguous rows ``[T, in_features]`` (``T`` >= 1), in :data:`COMPUTE_DTYPE`
        (or ``scales``' dtype), without bias: float32 ``[T, out_features]``."""
        scales = self.scales if scales is None else scales
        x = x.to(scales.dtype)
        if self.scheme == "int8-wo":
            return torch.ops.aten._weight_int8pack_mm(x, self.weight, scales).float()
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight, self.group, scales).float()

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for a 2-D contiguous input ``[T, in_features]`` (``T`` >= 1): float32 ``[T, out]``."""
        rows = len(x)
        if rows < self.min_rows:
            out = self._kernel_rows(torch.cat([x, x.new_zeros(self.min_rows - rows, self.in_features)]))[:rows]
        else:
            out = self._kernel_rows(x)
        return out if self.bias is None else out + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        if not len(rows):
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=torch.float32)
        return self.rows(rows).reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 ``[out_features, in_features]`` weight this layer computes with (for tests and
        error bounds; not held): ``q * scale``, or ``(q - 8) * scale + zero`` per group."""
        if self.scheme == "int8-wo":
            return self.weight.float() * self.scales.float()[:, None]
        eye = torch.eye(self.in_features, dtype=torch.float32)  # x = e_j gives row j of W.T, in float32
        return self._kernel_rows(eye, self.scales.float()).T.contiguous()

    def weight_bytes(self) -> int:
        """Bytes this layer holds: quantized weight, scales (and zeros) and bias."""
        tensors = [self.weight, self.scales] + ([] if self.bias is None else [self.bias])
        return sum(t.numel() * t.element_size() for t in tensors)


def _bf16_at_least(scale: torch.Tensor) -> torch.Tensor:
    """float32 scales rounded up to a bf16 value (so that ``|w| / scale`` stays within the int range) and
    kept above zero."""
    tiny = torch.finfo(torch.bfloat16).tiny
    rounded = scale.clamp(min=tiny).to(torch.bfloat16).float()
    return torch.where(rounded < scale, rounded * (1 + 2.0**-7), rounded).to(torch.bfloat16).float()


def quantize_linear_layers(module: torch.nn.Module, scheme: str) -> int:
    """Replace every float ``nn.Linear`` inside ``module`` (in place) by a :class:`QuantizedLinear` of
    ``scheme``. Call after :func:`~specpipe.runtime.cpu.model.fused_projections.fuse_projections` and instead of
    prepacking; a linear layer that is ``module`` itself is not replaced (pass its parent). A tied
    ``lm_head`` gets its own quantized copy while the input embedding stays as it is.

    Returns:
        the number of layers replaced.
    """
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.is_floating_point():
                setattr(parent, name, QuantizedLinear.from_linear(child, scheme))
                replaced += 1
    return replaced


def quantized_bytes(module: torch.nn.Module) -> int:
    """Bytes held by the :class:`QuantizedLinear` layers inside ``module``."""
    return sum(layer.weight_bytes() for layer in module.modules() if isinstance(layer, QuantizedLinear))


def linear_reference(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T (+ bias)`` in float64 with ``x`` rounded to :data:`COMPUTE_DTYPE` and the layer's
    dequantized weight ``W``: float64 ``[..., out]`` (what the kernel computes before rounding its
    output; for tests)."""
    out = F.linear(x.to(COMPUTE_DTYPE).double(), layer.dequantized_weight().double())
    return out if layer.bias is None else out + layer.bias.double()
