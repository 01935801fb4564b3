"""Build a CPU engine from an engine directory written by ``specpipe build``.

:data:`DRAFTERS` maps every method the registry (:data:`specpipe.speculative.METHODS`) runs on
:attr:`~specpipe.speculative.Runtime.CPU` to its drafter factory; adding a CPU method adds one entry.
The result is a :class:`~specpipe.runtime.cpu.deployment.Deployment` (target, drafter, settings) that the
batch scheduler serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from specpipe.errors import CompatibilityError, ManifestError, SpecpipeError
from specpipe.heads_format import COMPACT_FILES, compact_style, load_draft_vocab
from specpipe.manifest import Manifest, read_manifest
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.drafters.eagle import load_eagle_drafter
from specpipe.runtime.cpu.drafters.eagle3 import load_eagle3_drafter
from specpipe.runtime.cpu.drafters.medusa import load_medusa_drafter
from specpipe.runtime.cpu.drafters.proposer import Proposer
from specpipe.runtime.cpu.drafters.reduced_draft import ReducedVocabDraftModelDrafter
from specpipe.runtime.cpu.model.fused_projections import fuse_projections
from specpipe.runtime.cpu.model.prepack import PrepackedLinear, bf16_prepack_available, prepack_linear_layers
from specpipe.runtime.cpu.model.quant_scheme import manifest_quantization
from specpipe.runtime.cpu.model.weights_memory import own_memory, release_freed_memory
from specpipe.runtime.cpu.quantized_models import quantize_drafter, quantize_model
from specpipe.speculative import (
    ACCEPTANCE_RULES,
    DRAFT_VOCAB_DEFAULT,
    DYNAMIC_TREE_DEFAULTS,
    NGRAM_MATCH_DEFAULT,
    Method,
    Runtime,
    SpeculativeSettings,
    methods_for,
    names,
)
from specpipe.tree import Tree

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_REBUILD = "rebuild the engine with 'specpipe build --force'"


def load_checkpoint(path: Path, role: str) -> PreTrainedModel:
    """Load a Hugging Face causal-LM directory as fp32 in eval mode.

    Args:
        path: directory with ``config.json`` and the weights.
        role: ``"target"`` or ``"draft"``, for messages.

    Raises:
        SpecpipeError: the directory, its config or weights are missing, or loading them fails.
    """
    if not (path / "config.json").is_file():
        raise SpecpipeError(f"{role} checkpoint {path} is missing (no config.json): {_REBUILD}")
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        raise SpecpipeError(f"{role} checkpoint {path} has no weights ({_WEIGHT_FILES[0]}): {_REBUILD}")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as exc:  # any loading failure means an unusable checkpoint, whatever raised it
        raise SpecpipeError(
            f"{role} checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc}): {_REBUILD}"
        ) from exc
    return model.eval()


@dataclass(frozen=True)
class DraftSource:
    """What a drafter factory gets: the engine directory, its manifest, the loaded target (fp32, eval, not
    yet prepacked: heads copy rows of its embedding and lm_head first), whether to prepack the draft (and
    keep dense copies of its decoder layers, see :func:`load_engine`), the draft's dtype
    (:func:`resolve_draft_dtype`) and the manifest's weight-only ``quantization`` (``None``: fp32; else the
    draft's linear layers are quantized instead of prepacked)."""

    engine_dir: Path
    manifest: Manifest
    target: PreTrainedModel
    prepack: bool = True
    draft_dtype: torch.dtype = torch.float32
    dense_copy: bool = False
    quantization: str | None = None

    @property
    def settings(self) -> SpeculativeSettings:
        """The manifest's speculative settings."""
        return self.manifest.speculative

    def draft_dir(self) -> Path:
        """The folder of the manifest's draft entry for this method.

        Raises:
            ManifestError: no draft entry of this method with a path.
        """
        method = self.settings.method
        draft = self.manifest.draft
        if draft is None or draft.method != method.value or not draft.path:
            raise ManifestError(
                f"{self.engine_dir}: speculative method '{method.value}' needs a 'draft' entry "
                f"of that method with a 'path': {_REBUILD}"
            )
        return self.engine_dir / draft.path

    def tree(self) -> Tree:
        """The static tree, checked against ``max_draft_len``.

        Raises:
            ManifestError: the manifest has no tree. TreeError: more nodes than ``max_draft_len``.
        """
        settings = self.settings
        if settings.tree is None:
            raise ManifestError(
                f"{self.engine_dir}: method '{settings.method.value}' needs a tree (choices) in "
                f"the manifest: {_REBUILD}"
            )
        return settings.tree.check(max_nodes=settings.max_draft_len or None, what=f"{settings.method.value}_choices")

    @property
    def draft_vocab(self) -> bool:
        """Whether drafts score the reduced draft vocabulary (the default where the manifest says nothing)."""
        return self.settings.draft_vocab if self.settings.draft_vocab is not None else DRAFT_VOCAB_DEFAULT


def _no_drafter(source: DraftSource) -> Proposer:
    return NoDrafter()


def _ngram_drafter(source: DraftSource) -> Proposer:
    size = source.settings.max_matching_ngram_size
    return NgramDrafter(size if size is not None else NGRAM_MATCH_DEFAULT)


def _draft_model_drafter(source: DraftSource) -> Proposer:
    draft_dir = source.draft_dir()
    vocab = load_draft_vocab(draft_dir) if source.draft_vocab else None
    model = load_checkpoint(draft_dir, "draft").to(source.draft_dtype)
    drafter = ReducedVocabDraftModelDrafter(model, vocab) if vocab is not None else DraftModelDrafter(model)
    if source.quantization:
        quantize_model(model, source.quantization)
    elif source.prepack:
        fuse_projections(model.model)
        prepack_linear_layers(model.model, dense_copy=source.dense_copy)
        prepack_linear_layers(model)  # after the reduced drafter copied its lm_head rows
    own_memory(model)  # what is not prepacked leaves the checkpoint's memory map (one copy of the weights)
    return drafter


def _medusa_drafter(source: DraftSource) -> Proposer:
    draft_dir = source.draft_dir()
    drafter = load_medusa_drafter(
        draft_dir,
        source.target,
        source.tree(),
        draft_vocab=source.draft_vocab,
        prepack=source.prepack and not source.quantization,
        dtype=source.draft_dtype,
    )
    return quantize_drafter(drafter, source.quantization)


def _eagle_drafter(source: DraftSource) -> Proposer:
    settings = source.settings
    draft_dir = source.draft_dir()
    dynamic = bool(settings.dynamic_tree)
    top_k, depth = DYNAMIC_TREE_DEFAULTS
    load = load_eagle3_drafter if compact_style(draft_dir / COMPACT_FILES["eagle"]) == "eagle3" else load_eagle_drafter
    drafter = load(
        draft_dir,
        source.target,
        None if dynamic else source.tree(),
        draft_vocab=source.draft_vocab,
        dynamic=dynamic,
        top_k=settings.dynamic_top_k if settings.dynamic_top_k is not None else top_k,
        depth=settings.dynamic_depth if settings.dynamic_depth is not None else depth,
        prepack=source.prepack and not source.quantization,
        dtype=source.draft_dtype,
    )
    return quantize_drafter(drafter, source.quantization)


#: The drafter factory of every method the CPU runtime runs (``methods_for(Runtime.CPU)``).
DRAFTERS: dict[Method, Callable[[DraftSource], Proposer]] = {
    Method.NONE: _no_drafter,
    Method.NGRAM: _ngram_drafter,
    Method.DRAFT_MODEL: _draft_model_drafter,
    Method.EAGLE: _eagle_drafter,
    Method.MEDUSA: _medusa_drafter,
}


#: ``draft_dtype`` names accepted by :func:`load_engine`.
DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_draft_dtype(name: str = "auto") -> torch.dtype:
    """The dtype drafts run in: ``"float32"``, ``"bfloat16"``, or ``"auto"`` = bf16 where oneDNN runs bf16
    linear layers natively on this CPU (:func:`~specpipe.runtime.cpu.model.prepack.bf16_prepack_available`),
    else fp32 (ATen's bf16 fallback is slower than fp32 there).

    Drafts are proposals: the target verifies them in fp32, so greedy output is the same either way.

    Raises:
        ValueError: an unknown name.
    """
    if name == "auto":
        return torch.bfloat16 if bf16_prepack_available() else torch.float32
    if name not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype must be auto, {', '.join(DRAFT_DTYPES)}; got {name!r}")
    return DRAFT_DTYPES[name]


def load_engine(
    engine_dir: Path, *, prepack: bool = True, draft_dtype: str = "auto", dense_copy: bool = False
) -> tuple[Deployment, Manifest]:
    """Load an engine directory: its manifest, target and drafter.

    Args:
        engine_dir: a directory written by ``specpipe build --runtime cpu``.
        prepack: prepack the target's and the draft's linear layers (oneDNN, inference only; ``False``
            keeps plain ``nn.Linear``, for A/B measurements).
        draft_dtype: dtype of the EAGLE/Medusa heads, their reduced lm_head and a draft model
            (:func:`resolve_draft_dtype`); the target always runs in fp32.
        dense_copy: with ``prepack`` and no quantization, the decoder layers of the target and of a draft model also keep a
            dense copy of each weight for inputs of few rows (+ their size again; unused until
            :func:`~specpipe.runtime.cpu.dense_rows.choose_dense_rows` or
            :func:`~specpipe.runtime.cpu.model.prepack.set_dense_rows` turns them on, or
            :func:`~specpipe.runtime.cpu.model.prepack.drop_dense_copies` drops them).

    A manifest ``quantization`` of ``int8-wo`` / ``int4-wo`` (``specpipe build -q``) replaces the linear
    layers of the target (lm_head included), of a draft model and of EAGLE/Medusa heads by weight-only
    :class:`~specpipe.runtime.cpu.model.quantized_linear.QuantizedLinear` layers instead of prepacking them
    (drafts then run in fp32, with no dense copies: :mod:`~specpipe.runtime.cpu.quantized_models`).

    Returns:
        the deployment (target, drafter, settings) and the typed manifest.

    Raises:
        ManifestError: the manifest is missing, unreadable, from another version or incomplete, or names
            a quantization the CPU runtime does not run.
        SpecpipeError: a checkpoint or heads file is missing or corrupt, the speculative method is not
            run by the CPU runtime, or the tree does not fit the heads or ``max_draft_len``.
        CompatibilityError: the draft's vocabulary or heads do not fit the target.
    """
    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir)
    settings = manifest.speculative
    factory = DRAFTERS.get(settings.method)
    if factory is None or settings.method not in methods_for(Runtime.CPU):
        raise SpecpipeError(
            f"{engine_dir}: speculative method {settings.method.value!r} is not supported by the CPU runtime "
            f"(supported: {names(methods_for(Runtime.CPU))}): build the engine with one of those drafts"
        )
    if not manifest.target.path:
        raise ManifestError(f"{engine_dir}/manifest.json has no target path: {_REBUILD}")
    quantization = manifest_quantization(manifest.quantization, f"{engine_dir}/manifest.json")
    if quantization:
        dense_copy, draft_dtype = False, "float32"
    target = load_checkpoint(engine_dir / manifest.target.path, "target")
    # One copy of the weights: the tensors that will not be prepacked (embedding = tied lm_head, norms) get
    # memory of their own before drafters take views of them; the linear weights still view the
    # checkpoint's memory map until prepacking replaces them, and then the map goes.
    own_memory(target, skip_prepackable=prepack or bool(quantization))
    drafter = factory(
        DraftSource(engine_dir, manifest, target, prepack, resolve_draft_dtype(draft_dtype), dense_copy, quantization)
    )
    if quantization:
        quantize_model(target, quantization, drafter)
    elif prepack:
        fuse_projections(target.model)
        prepack_linear_layers(target.model, dense_copy=dense_copy)
        prepack_linear_layers(target)  # after tree heads took their (dense) copies of embedding and lm_head rows
        lm = getattr(drafter, "lm", None)
        if (
            isinstance(lm, ReducedLMHead)
            and lm.draft_vocab is None
            and lm.dtype == torch.float32
            and isinstance(target.lm_head, PrepackedLinear)
        ):
            lm.use_packed(target.lm_head)  # full draft vocabulary: share the target's packed lm_head
    release_freed_memory()
    try:
        deployment = Deployment(
            target, drafter, settings.max_draft_len, acceptance=settings.acceptance or ACCEPTANCE_RULES[0]
        )
        return deployment, manifest
    except ValueError as exc:
        raise CompatibilityError(f"{engine_dir}: {exc}") from exc
