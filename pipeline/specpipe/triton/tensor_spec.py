"""The types that describe a Triton model's tensor interface: one tensor (:class:`TensorSpec`), one model's
inputs and outputs (:class:`ModelInterface`) and one ensemble step's tensor mapping (:class:`EnsembleStep`).
The interfaces themselves, as TensorRT-LLM names them, are in :mod:`specpipe.triton.interface`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a Triton model.

    Attributes:
        name: tensor name, exactly as in TensorRT-LLM.
        dtype: Triton data type without ``TYPE_`` (``"INT32"``, ``"STRING"`` ...).
        dims: shape without the batch dimension; -1 is variable.
        optional: an input the client may leave out (outputs: always False).
        reshape: shape the model sees instead of ``dims`` (``()`` = a scalar per batch entry), or
            ``None`` for no reshape.
        doc: what the tensor holds, with units.
        ragged: ``allow_ragged_batch`` (requests of different lengths batched without padding; the
            tensorrtllm backend's variable-length inputs).
    """

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    doc: str = ""
    ragged: bool = False


@dataclass(frozen=True)
class ModelInterface:
    """Inputs and outputs of one model of the repository."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        """The input called ``name``; raises ``KeyError`` when there is none."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.name} has no input {name!r}")

    def output(self, name: str) -> TensorSpec:
        """The output called ``name``; raises ``KeyError`` when there is none."""
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.name} has no output {name!r}")


@dataclass(frozen=True)
class EnsembleStep:
    """One step of the ensemble: ``input_map`` / ``output_map`` map step tensor -> ensemble tensor."""

    model_name: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


def tensor(
    name: str, dtype: str, dims, optional: bool = False, reshape=None, doc: str = "", ragged: bool = False
) -> TensorSpec:
    """A :class:`TensorSpec` from lists or tuples (``dims``, ``reshape``: any sequence of ints)."""
    return TensorSpec(name, dtype, tuple(dims), optional, None if reshape is None else tuple(reshape), doc, ragged)


#: ``reshape`` target of tensorrt_llm's per-request scalars.
SCALAR = ()
