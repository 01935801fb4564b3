"""Build a :class:`SpeculativeEngine` from an engine directory written by ``specpipe build``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from specpipe.errors import CompatibilityError, ManifestError, SpecpipeError
from specpipe.manifest import read_manifest_json
from specpipe.runtime.cpu.drafters import DraftModelDrafter, Drafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.engine import SpeculativeEngine
from specpipe.runtime.cpu.prepack import prepack_linear_layers

METHODS = ("none", "ngram", "draft-model", "eagle", "medusa")
HEAD_METHODS = ("eagle", "medusa")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def load_checkpoint(path: Path, role: str) -> PreTrainedModel:
    """Load a Hugging Face causal-LM directory as fp32 in eval mode.

    Args:
        path: directory with ``config.json`` and the weights.
        role: ``"target"`` or ``"draft"``, for messages.

    Raises:
        SpecpipeError: the directory, its config or weights are missing, or loading them fails.
    """
    fix = "rebuild the engine with 'specpipe build --force'"
    if not (path / "config.json").is_file():
        raise SpecpipeError(f"{role} checkpoint {path} is missing (no config.json): {fix}")
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        raise SpecpipeError(f"{role} checkpoint {path} has no weights ({_WEIGHT_FILES[0]}): {fix}")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as exc:  # any loading failure means an unusable checkpoint, whatever raised it
        raise SpecpipeError(f"{role} checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc}): {fix}") from exc
    return model.eval()


def _drafter(engine_dir: Path, manifest: dict[str, Any], speculative: dict[str, Any]) -> Drafter:
    method = speculative.get("method")
    if method == "none":
        return NoDrafter()
    if method == "ngram":
        return NgramDrafter(int(speculative.get("max_matching_ngram_size", 3)))
    if method == "draft-model":
        draft = manifest.get("draft")
        if not draft or draft.get("kind") != "draft-model" or "path" not in draft:
            raise ManifestError(
                f"{engine_dir}: speculative method 'draft-model' needs a 'draft' entry of kind 'draft-model' "
                f"with a 'path': rebuild the engine with 'specpipe build --force'"
            )
        draft_dir = engine_dir / draft["path"]
        from specpipe.runtime.cpu.reduced_draft import ReducedVocabDraftModelDrafter, load_draft_vocab

        vocab = load_draft_vocab(draft_dir) if speculative.get("draft_vocab", True) else None
        model = load_checkpoint(draft_dir, "draft")
        drafter = ReducedVocabDraftModelDrafter(model, vocab) if vocab is not None else DraftModelDrafter(model)
        prepack_linear_layers(model)  # after the reduced drafter copied its lm_head rows
        return drafter
    raise SpecpipeError(
        f"{engine_dir}: speculative method {method!r} is not supported by the CPU runtime "
        f"(supported: {', '.join(METHODS)}): build the engine with one of those drafts"
    )


def load_engine(engine_dir: Path) -> tuple[SpeculativeEngine, dict[str, Any]]:
    """Load an engine directory: its manifest, target and drafter.

    Returns:
        the engine and the manifest (``manifest.json`` as a dict).

    Raises:
        ManifestError: the manifest is missing, unreadable, from another version or incomplete.
        SpecpipeError: a checkpoint is missing or corrupt, or the speculative method is unsupported.
        CompatibilityError: the draft model's vocabulary differs from the target's.
    """
    engine_dir = Path(engine_dir)
    manifest = read_manifest_json(engine_dir)
    try:
        target_path = engine_dir / manifest["target"]["path"]
        speculative = dict(manifest["speculative"])
        max_draft_len = int(speculative.get("max_draft_len", 0))
        if max_draft_len < 0:
            raise ValueError(f"max_draft_len {max_draft_len} < 0")
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(
            f"{engine_dir}/manifest.json lacks a valid target path or speculative settings ({exc!r}): "
            f"rebuild the engine with 'specpipe build --force'"
        ) from exc
    if speculative.get("method") in HEAD_METHODS:
        return _load_tree_engine(engine_dir, manifest, speculative, target_path, max_draft_len), manifest
    target = load_checkpoint(target_path, "target")
    drafter = _drafter(engine_dir, manifest, speculative)
    prepack_linear_layers(target)
    try:
        engine = SpeculativeEngine(target, drafter, max_draft_len=max_draft_len)
    except ValueError as exc:
        raise CompatibilityError(f"{engine_dir}: {exc}") from exc
    return engine, manifest


def _load_tree_engine(engine_dir: Path, manifest: dict[str, Any], speculative: dict[str, Any], target_path: Path, max_draft_len: int):
    """EAGLE/Medusa: the heads read the target's features, so the target loads first; tree steps."""
    from specpipe.runtime.cpu.tree import TreeSpeculativeEngine, load_tree_drafter

    draft = manifest.get("draft")
    if not draft or draft.get("kind") != speculative["method"] or "path" not in draft:
        raise ManifestError(
            f"{engine_dir}: speculative method {speculative['method']!r} needs a 'draft' entry of that kind with a "
            f"'path': rebuild the engine with 'specpipe build --force'"
        )
    target = load_checkpoint(target_path, "target")
    drafter = load_tree_drafter(engine_dir / draft["path"], speculative["method"], target, speculative)
    prepack_linear_layers(target)  # after the heads took their (dense) copies of embedding and lm_head rows
    try:
        return TreeSpeculativeEngine(target, drafter, max_draft_len, acceptance=speculative.get("acceptance", "exact"))
    except ValueError as exc:
        raise CompatibilityError(f"{engine_dir}: {exc}") from exc
