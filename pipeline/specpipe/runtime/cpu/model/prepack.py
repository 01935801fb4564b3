"""Prepacked fp32 linear layers: the CPU counterpart of building an engine.

PyTorch's default CPU ``nn.Linear`` (MKL's ``sgemm`` on the plain ``[out, in]`` weight) packs the weight
again on every call with more than one row, so its time grows steeply with the rows: verifying a few
draft tokens costs far more than one decoding step. Packing the weight once, at load, avoids that. Two
packed kernels exist in PyTorch, each the one TorchInductor's CPU freezing pass emits:

* **MKL's packed GEMM** (``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, i.e.
  ``cblas_sgemm_pack`` / ``cblas_sgemm_compute``), for fp32 on Intel CPUs where PyTorch has MKL;
* **oneDNN's linear** with a reordered weight (``torch.ops.mkldnn._reorder_linear_weight`` /
  ``_linear_pointwise``; ``aten.mkldnn_linear`` on a ``Tensor.to_mkldnn`` weight where that pair is
  missing), for bf16 layers (drafts) and for fp32 elsewhere.

One packing serves every row count. The fp32 kernel is chosen by CPU (:func:`mkl_packed_gemm_available`):
on an AMD CPU MKL's was much slower than oneDNN's, held more than the weights' bytes and computed a few
rows differently from many (figures in ``docs/experiments.md``).

Each layer pads inputs of fewer than :attr:`PrepackedLinear.min_rows` rows with zero rows (found per
layer shape at load, :meth:`PrepackedLinear.batch_invariant_min_rows`), so that a row's output is bitwise
the same whatever the rows computed with it: kernels pick their code path by the input's shape, and some
compute one row, or a few, differently from more.

Precision stays fp32 (bf16 would be faster still, but its rounding makes greedy decoding depend on how
many tokens a forward holds, which breaks the greedy identity of speculative decoding).

A layer can also keep a *dense copy* (``dense_copy=True``) and use it for inputs of at most
:attr:`PrepackedLinear.dense_rows` rows, or keep only the copy (:func:`drop_packed_weights`: one copy of
the weights, as loaded); :mod:`~specpipe.runtime.cpu.dense_rows` decides at load. The kernels round
differently (about 1e-6 relative).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F

#: ``dense_rows`` of a layer that has only its dense copy left (:func:`drop_packed_weights`).
ALL_ROWS = 1 << 62


#: The row count MKL's packing is tuned for (``cblas_sgemm_pack``'s ``m``; the packed weight serves
#: any row count): 128 is as fast as 16 for 1-16 rows and faster for a prompt chunk.
MKL_PACK_ROWS = 128


def _shape_only(rows: int, columns: int) -> torch.Tensor:
    """A ``[rows, columns]`` fp32 tensor of zeros that holds one element: ``_mkl_linear`` takes the
    unpacked weight only to fall back to when its ``batch_size`` is not the input's row count, which
    :class:`PrepackedLinear` always passes."""
    return torch.zeros((), dtype=torch.float32).expand(rows, columns)


@functools.cache
def mkl_packed_gemm_available() -> bool:
    """Whether PyTorch has MKL's packed-weight GEMM (``cblas_sgemm_pack`` / ``cblas_sgemm_compute``
    behind ``torch.ops.mkl._mkl_reorder_linear_weight`` and ``_mkl_linear``, the pair TorchInductor's
    CPU freezing pass emits for fp32 linear layers where MKL is present) and is the fp32 kernel to use:
    on Intel CPUs only (module doc: oneDNN's kernel is faster elsewhere)."""
    if not _intel_cpu():
        return False
    if not (
        torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_linear")
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    ):
        return False
    return _one_packing_serves_every_row_count()


@functools.cache
def _intel_cpu() -> bool:
    """Whether ``/proc/cpuinfo`` names an Intel CPU (``GenuineIntel``); False where it is unreadable."""
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _one_packing_serves_every_row_count() -> bool:
    """MKL documents the packed buffer's size, not its layout, as a function of the row count it was
    packed for; check once per process that a weight packed for :data:`MKL_PACK_ROWS` rows computes
    1, 3 and 17 rows as ``F.linear`` does."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(37, 29, generator=generator)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, MKL_PACK_ROWS)
    for rows in (1, 3, 17):
        x = torch.randn(rows, 29, generator=generator)
        got = torch.ops.mkl._mkl_linear(x, packed, _shape_only(37, 29), None, rows)
        if not torch.allclose(got, F.linear(x, weight), rtol=1e-4, atol=1e-5):
            return False
    return True


@functools.cache
def _fused_linear_available() -> bool:
    """Whether PyTorch has oneDNN's dense-in/dense-out linear op with a pre-reordered weight (the one
    TorchInductor's CPU freezing pass uses): no format conversion per call, about half the time of
    ``aten.mkldnn_linear`` for SmolLM2's layers at 1-12 rows."""
    return hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


#: Row counts compared by :meth:`PrepackedLinear.batch_invariant_min_rows`: a batch of plain steps,
#: verifications, and a prompt chunk beside them.
INVARIANCE_ROWS = (1, 2, 3, 4, 5, 8, 13, 16, 33, 130)

#: The most rows an input is padded to (:attr:`PrepackedLinear.min_rows`); a kernel that needs more to
#: compute rows independently of the batch is used unpadded.
MAX_PAD_ROWS = 8

#: :attr:`PrepackedLinear.min_rows` found per (kernel, out_features, in_features, bias, threads).
_MIN_ROWS: dict[tuple, int] = {}


def prepack_available() -> bool:
    """Whether this PyTorch build has the oneDNN (mkldnn) CPU backend."""
    return bool(torch.backends.mkldnn.is_available())


@functools.cache
def native_bf16() -> bool:
    """Whether oneDNN runs bf16 matrix products natively on this CPU (AVX-512 BW/VL/DQ, best with
    avx512_bf16 or AMX): ``torch.ops.mkldnn._is_mkldnn_bf16_supported``; false where PyTorch has no
    oneDNN or cannot tell. Without it bf16 matmuls fall back to ATen kernels many times slower than fp32's
    (an AVX2-only CPU)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(prepack_available() and check is not None and check())
    except RuntimeError:
        return False


@functools.cache
def bf16_prepack_available() -> bool:
    """Whether bf16 linear layers are prepacked: oneDNN runs bf16 natively (:func:`native_bf16`) and has the
    fused linear op. Without it bf16 weights are not prepacked."""
    return native_bf16() and _fused_linear_available()


def _packable_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.bfloat16) if bf16_prepack_available() else (torch.float32,)


class PrepackedLinear(torch.nn.Module):
    """An fp32 (or, where :func:`bf16_prepack_available`, bf16) linear layer whose weight
    ``[out_features, in_features]`` is held packed for its kernel, once, at load. Maps
    ``[..., in_features]`` to ``[..., out_features]`` in the weight's dtype (inputs are cast to it);
    inference only.

    Kernels (:attr:`kernel`), in order of preference:

    * ``"mkl"`` (fp32, :func:`mkl_packed_gemm_available`: Intel CPUs): MKL's packed-weight GEMM. The
      weight is streamed once per call whatever the row count;
    * ``"onednn"``: oneDNN's linear with a reordered weight (bf16 layers, or fp32 without MKL);
    * ``"mkldnn-tensor"``: ``aten.mkldnn_linear`` on a ``Tensor.to_mkldnn`` weight (older builds).

    Args:
        linear: the layer to copy (its weight and bias, if any, are copied; it is left unchanged).
        dense_copy: also keep the fp32 weight as it is, ``[out_features, in_features]`` (``dense``, +in x out x
            4 bytes), used through ``F.linear`` for inputs of at most :attr:`dense_rows` rows (0 until set;
            :data:`ALL_ROWS` once :func:`drop_packed_weights` has dropped the packed weight).

    Attributes:
        min_rows: fp32 inputs of fewer rows are padded with zero rows to this many
            (:meth:`batch_invariant_min_rows`), so that each row's output is bitwise the same whatever
            rows share the call: a request's logits do not depend on its batch.
    """

    def __init__(self, linear: torch.nn.Linear, dense_copy: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = (
            torch.bfloat16 if linear.weight.dtype == torch.bfloat16 and bf16_prepack_available() else torch.float32
        )
        weight = linear.weight.detach().to(self.dtype).contiguous()
        bias = None if linear.bias is None else linear.bias.detach().to(self.dtype).contiguous()
        self.dense = weight.clone() if dense_copy and self.dtype == torch.float32 else None
        self.dense_bias = None if self.dense is None or bias is None else bias.clone()
        self.dense_rows = 0
        self.bias = bias
        if self.dtype == torch.float32 and mkl_packed_gemm_available():
            self.kernel = "mkl"
            self.weight = torch.ops.mkl._mkl_reorder_linear_weight(weight, MKL_PACK_ROWS)
            self._shape_only = _shape_only(self.out_features, self.in_features)
        elif _fused_linear_available():
            self.kernel = "onednn"
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight)
        else:
            self.kernel = "mkldnn-tensor"
            self.weight = weight.to_mkldnn()
            self.bias = None if bias is None else bias.to_mkldnn()
        self.min_rows = 1
        if self.dtype == torch.float32:
            key = (self.kernel, self.out_features, self.in_features, bias is not None, torch.get_num_threads())
            if key not in _MIN_ROWS:
                _MIN_ROWS[key] = self.batch_invariant_min_rows()
            self.min_rows = _MIN_ROWS[key]

    def batch_invariant_min_rows(self) -> int:
        """The fewest rows from which this layer's kernel computes each row bitwise alike whatever the
        other rows (checked on random rows at each of :data:`INVARIANCE_ROWS`, on the current thread
        count): 1 where every row count agrees; at most :data:`MAX_PAD_ROWS`; 1 also where it takes more
        (then a row's last bits may depend on its batch).

        Kernels pick their code path by the input's shape, so a CPU may compute one row, or a few,
        differently from more (examples in ``docs/experiments.md``)."""
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(max(INVARIANCE_ROWS), self.in_features, generator=generator)
        with torch.inference_mode():
            reference = self._kernel_rows(x)
            agrees = [torch.equal(self._kernel_rows(x[:n].clone()), reference[:n]) for n in INVARIANCE_ROWS]
        min_rows = max(INVARIANCE_ROWS)
        for n, same in zip(reversed(INVARIANCE_ROWS), reversed(agrees)):
            if not same:
                break
            min_rows = n
        return min_rows if min_rows <= MAX_PAD_ROWS else 1

    def _kernel_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The packed kernel on 2-D contiguous rows ``[T, in_features]`` (``T`` >= 1): ``[T, out_features]``."""
        if self.kernel == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.weight, self._shape_only, self.bias, len(x))
        if self.kernel == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, self.bias, "none", [], "")
        return torch.ops.aten.mkldnn_linear(x.to_mkldnn(), self.weight, self.bias).to_dense()

    def _packed_rows(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`_kernel_rows`, padded with zero rows to :attr:`min_rows`."""
        rows = len(x)
        if rows >= self.min_rows:
            return self._kernel_rows(x)
        return self._kernel_rows(torch.cat([x, x.new_zeros(self.min_rows - rows, self.in_features)]))[:rows]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for a 2-D float32 contiguous input ``[T, in_features]`` (a batched forward's
        packed rows; ``T`` >= 1), without the reshapes and casts: ``[T, out_features]``, the same values."""
        if self.dense_rows and len(x) <= self.dense_rows and self.dense is not None:
            return F.linear(x, self.dense, self.dense_bias)
        return self._packed_rows(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense_rows and x.numel() <= self.dense_rows * self.in_features and self.dense is not None:
            return F.linear(x.float(), self.dense, self.dense_bias)
        rows = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        if not len(rows):
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=self.dtype)
        return self._packed_rows(rows).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "PrepackedLinear":
        """A bias-free layer computing ``x @ weight.T`` for a float ``[out_features, in_features]`` weight."""
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        return cls(linear)


def set_dense_rows(module: torch.nn.Module, rows: int) -> int:
    """Use the dense copies of the :class:`PrepackedLinear` layers inside ``module`` for inputs of at most
    ``rows`` rows (0: never).

    Returns:
        bytes held by those dense copies.
    """
    total = 0
    for layer in module.modules():
        if isinstance(layer, PrepackedLinear) and layer.dense is not None and layer.weight is not None:
            layer.dense_rows = rows
            total += layer.dense.numel() * layer.dense.element_size()
    return total


def drop_dense_copies(module: torch.nn.Module) -> int:
    """Drop the dense copies of the :class:`PrepackedLinear` layers inside ``module`` (then call
    :func:`~specpipe.runtime.cpu.model.weights_memory.release_freed_memory` to hand the memory back).

    Returns:
        bytes dropped.
    """
    dropped = set_dense_rows(module, 0)
    for layer in module.modules():
        if isinstance(layer, PrepackedLinear) and layer.weight is not None:
            layer.dense = layer.dense_bias = None
    return dropped


def drop_packed_weights(module: torch.nn.Module) -> int:
    """Keep only the dense copies of the :class:`PrepackedLinear` layers inside ``module`` that have one:
    their packed weights are dropped and ``F.linear`` on the copy runs every input (one copy of the
    weights; then call :func:`~specpipe.runtime.cpu.model.weights_memory.release_freed_memory`).

    Returns:
        bytes dropped (the packed weights' dense size; oneDNN's blocked layout may pad a little more).
    """
    dropped = 0
    for layer in module.modules():
        if isinstance(layer, PrepackedLinear) and layer.dense is not None and layer.weight is not None:
            layer.dense_rows = ALL_ROWS
            layer.weight = layer.bias = None
            dropped += layer.dense.numel() * layer.dense.element_size()
    return dropped


def prepack_linear_layers(module: torch.nn.Module, dense_copy: bool = False) -> int:
    """Replace every fp32 ``nn.Linear`` (and bf16 one, where :func:`bf16_prepack_available`) inside
    ``module`` (in place) by a :class:`PrepackedLinear`.

    Results equal ``nn.Linear``'s up to float32 rounding (~1e-6 relative). The replaced layers are
    inference-only (no autograd) and their ``weight`` is no longer a dense tensor, so anything that
    slices a weight (a reduced draft vocabulary, say) must copy it first. A linear layer that is
    ``module`` itself is not replaced (pass its parent). A tied ``lm_head`` gets its own packed copy
    (+vocab x hidden x 4 bytes) while the input embedding stays dense. ``dense_copy``: each fp32 layer
    also keeps a dense copy (see :class:`PrepackedLinear`, :func:`set_dense_rows`).

    Returns:
        the number of layers replaced (0 when this PyTorch build lacks oneDNN).
    """
    if not prepack_available():
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype in _packable_dtypes():
                setattr(parent, name, PrepackedLinear(child, dense_copy))
                replaced += 1
    return replaced
