"""The draft half of a CPU build (:mod:`specpipe.build_cpu`): a draft model's checkpoint made or copied
into the engine, and the compact weights file whose hash decides whether a head or distilled build is
stale."""

from __future__ import annotations

import shutil
from pathlib import Path

from specpipe.errors import PresetError
from specpipe.heads_format import COMPACT_FILES
from specpipe.manifest import Part
from specpipe.models.draft import check_same_vocabulary, truncate_target
from specpipe.models.fetch import check_checkpoint_dir
from specpipe.models.heads import make_distilled_draft, resolve_heads_dir, shipped_dir
from specpipe.presets import DraftPreset, TargetPreset
from specpipe.speculative import METHODS, Method


def make_draft(draft: DraftPreset, draft_model: str | None, target_dir: Path, out: Path) -> Part:
    """Write the draft checkpoint into ``out``: a copy of ``--draft-model``, the shipped distilled draft, or
    the target truncated to its first layers; returns the manifest part.

    Raises:
        PresetError: no shipped distilled draft, or a source kind the CPU runtime does not build.
        SpecpipeError, CompatibilityError: an unusable checkpoint, or another vocabulary than the target's.
    """
    if draft_model:
        source_dir = Path(draft_model).expanduser()
        check_checkpoint_dir(source_dir)
        check_same_vocabulary(target_dir, source_dir)
        shutil.copytree(source_dir, out)
        source = {"kind": "local", "path": str(source_dir.resolve())}
    elif draft.source.get("kind") == "distilled":
        shipped = shipped_dir(str(draft.source["target"]), "draft-model")
        if shipped is None:
            raise PresetError(
                f"draft preset '{draft.name}': no distilled draft ships for {draft.source['target']}: run "
                f"'specpipe train-draft --target {draft.source['target']} --method draft-model' and pass "
                f"--draft-model with the rebuilt checkpoint"
            )
        facts = make_distilled_draft(shipped, target_dir, out)
        check_same_vocabulary(target_dir, out)
        source = {**draft.source, "weights": shipped.name, **facts}
    elif draft.source.get("kind") == "truncate-target":
        truncate_target(target_dir, out, int(draft.source["num_layers"]))
        check_same_vocabulary(target_dir, out)
        source = draft.source
    else:
        raise PresetError(
            f"draft preset '{draft.name}': source kind {draft.source.get('kind')!r} is not supported on "
            f"the CPU runtime (use truncate-target, or pass --draft-model DIR)"
        )
    return Part(preset=draft.name, method=draft.kind, source=source, path="draft")


def shipped_weights(target: TargetPreset, draft: DraftPreset, draft_model: str | None) -> Path | None:
    """The compact weights file a head/distilled build reads, or ``None``."""
    if METHODS[Method(draft.kind)].weights == "heads":
        return resolve_heads_dir(target.name, draft.kind, draft_model) / COMPACT_FILES[draft.kind]
    if draft.kind == Method.DRAFT_MODEL.value and not draft_model and draft.source.get("kind") == "distilled":
        found = shipped_dir(str(draft.source.get("target")), "draft-model")
        return found / COMPACT_FILES["draft-model"] if found else None
    return None
