"""``specpipe build --runtime cpu``: an engine directory for the CPU reference runtime.

Layout of ``engines/NAME/``::

    manifest.json   what was built, from what (sha256 of every file), by which specpipe
    target/         the target as a Hugging Face checkpoint (weights hard-linked from the cache)
    draft/          the draft model checkpoint (draft-model method only)

The directory is assembled under a temporary name beside the destination and renamed into place,
so an interrupted build leaves no half-written engine. Unchanged inputs skip the build.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, ManifestError, PresetError, SpecpipeError
from specpipe.fsutil import link_tree, write_dir_atomically
from specpipe.manifest import Manifest, Part, canonical_hash, read_manifest_json, sha256_file, write_manifest
from specpipe.presets import DraftPreset, TargetPreset, load_draft, load_target
from specpipe.progress import console
from specpipe.speculative import Runtime, SpeculativeSettings
from specpipe.tree import Tree

CPU_METHODS = ("none", "ngram", "draft-model", "eagle", "medusa")
HEAD_METHODS = ("eagle", "medusa")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_speculative(draft: DraftPreset, max_draft_len: int | None) -> dict[str, Any]:
    """The ``speculative`` block of the manifest: the preset's settings with overrides applied.

    Raises:
        PresetError: ``max_draft_len`` given for ``none``, or not a positive integer.
    """
    settings = dict(draft.speculative)
    if draft.kind == "none":
        if max_draft_len is not None:
            raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
        settings["max_draft_len"] = 0
    else:
        value = max_draft_len if max_draft_len is not None else settings.get("max_draft_len", 4)
        if not isinstance(value, int) or value <= 0:
            raise PresetError(f"max_draft_len must be a positive integer, got {value!r}")
        settings["max_draft_len"] = value
    settings["method"] = draft.kind
    return settings


def resolve_cpu_tree(draft: DraftPreset, max_draft_len: int | None, choices: str | None) -> dict[str, Any]:
    """The ``speculative`` block of an EAGLE/Medusa engine for the CPU runtime.

    The tree comes from ``--choices``, else the preset's ``[cpu]`` table (``choices``,
    ``max_draft_len``, ``dynamic_tree``, ``dynamic_top_k``, ``dynamic_depth``, ``acceptance``), else a
    small CPU default; the GPU presets' large trees (``mc_sim_7b_63``) cost too much to verify on CPU.
    Depth against the heads is checked once the heads are known (:func:`_make_draft`).

    Raises:
        SpecpipeError: malformed choices, or more nodes than ``max_draft_len``.
    """
    cpu = dict(draft.extra.get("cpu", {}))
    dynamic = bool(cpu.get("dynamic_tree", False)) and choices is None
    paths = choices or cpu.get("choices")
    if not paths:
        raise PresetError(f"draft preset '{draft.name}' has no [cpu] choices: add a tree or pass --choices")
    limit = max_draft_len or cpu.get("max_draft_len")
    spec = Tree.parse(paths, what=f"{draft.kind}_choices").breadth_first().check(
        max_nodes=limit, what=f"{draft.kind}_choices")
    settings: dict[str, Any] = {
        "method": draft.kind,
        "choices": spec.to_list(),
        "max_draft_len": int(limit or spec.nodes),
        "tree_depth": spec.depth,
        "dynamic_tree": dynamic,
        "acceptance": cpu.get("acceptance", "exact"),
        "draft_vocab": bool(cpu.get("draft_vocab", True)),
    }
    if dynamic:
        settings.update(dynamic_top_k=int(cpu.get("dynamic_top_k", 4)), dynamic_depth=int(cpu.get("dynamic_depth", 4)))
    if draft.kind == "eagle":
        settings["num_eagle_layers"] = settings.get("dynamic_depth", spec.depth)
    return settings


def check_cpu_pairing(target: TargetPreset, draft: DraftPreset) -> None:
    """Refuse drafts the CPU runtime cannot run, or that were made for another target.

    Raises:
        PresetError: the method is not available on the CPU runtime.
        CompatibilityError: the draft was made for other targets.
    """
    if draft.kind not in CPU_METHODS:
        raise PresetError(
            f"draft '{draft.name}' ({draft.kind}) is not available on the CPU runtime yet: use one of "
            f"{', '.join(CPU_METHODS)} methods (e.g. --draft ngram), or --runtime trtllm"
        )
    if draft.kind in HEAD_METHODS:
        return  # heads are matched to the target by their shapes when the engine is built
    if draft.for_targets and target.name not in draft.for_targets:
        raise CompatibilityError(
            f"draft '{draft.name}' was made for {', '.join(draft.for_targets)}, not for target "
            f"'{target.name}': pick a draft made for {target.name} (or --draft ngram)"
        )


def build_inputs(target: TargetPreset, draft: DraftPreset, speculative: dict[str, Any], draft_model: str | None) -> dict[str, Any]:
    """Everything that determines the engine's content; its hash decides whether to rebuild."""
    return {
        "runtime": "cpu",
        "specpipe_version": __version__,
        "target": {"preset": target.name, "source": target.source},
        "draft": {"preset": draft.name, "kind": draft.kind, "source": draft.source, "draft_model": draft_model},
        "speculative": speculative,
    }


def build_cpu(request: BuildRequest) -> Path:
    """Build (or reuse) ``engines/NAME`` for the CPU runtime and return its path.

    Raises:
        PresetError, CompatibilityError: bad presets or pairing (before anything is fetched).
        SpecpipeError: unwritable output root, failed download/conversion, corrupt cache.
    """
    target = load_target(request.target)
    draft = load_draft(request.draft)
    check_cpu_pairing(target, draft)
    from specpipe.bench.tuned import apply_tuned

    request = apply_tuned(request, target.name, draft.name)  # the setting 'specpipe tune' recorded, if any
    if request.draft_model and draft.kind not in ("draft-model", *HEAD_METHODS):
        raise PresetError(f"--draft-model only applies to draft-model, eagle and medusa drafts, not '{draft.name}' ({draft.kind})")
    if draft.kind in HEAD_METHODS:
        from specpipe.models.heads import resolve_heads_dir

        speculative = resolve_cpu_tree(draft, request.max_draft_len, request.choices)
        resolve_heads_dir(target.name, draft.kind, request.draft_model)  # fail before fetching anything
    else:
        speculative = resolve_speculative(draft, request.max_draft_len)
    name = request.engine_name(target.name, draft.name)
    if not _NAME.match(name):
        raise SpecpipeError(f"engine name {name!r} must be letters, digits, '.', '_' or '-' (no paths)")
    engines_dir = Path(request.engines_dir)
    _check_writable(engines_dir)
    dest = engines_dir / name

    inputs = build_inputs(target, draft, speculative, request.draft_model)
    shipped = _shipped_weights(target, draft, request.draft_model)
    if shipped is not None:
        inputs["draft"]["weights_sha256"] = sha256_file(shipped)  # retrained weights trigger a rebuild
    inputs_hash = canonical_hash(inputs)
    if not request.force and _up_to_date(dest, inputs_hash):
        console.print(f"[green]✓[/green] engine {dest} is up to date (inputs unchanged): nothing rebuilt")
        return dest

    from specpipe.models.fetch import ensure_target_checkpoint, hash_tree

    target_ckpt = ensure_target_checkpoint(target)
    def assemble(tmp: Path) -> None:
        link_tree(target_ckpt, tmp / "target", ignore=shutil.ignore_patterns(".*"))
        draft_entry = None
        if draft.kind == "draft-model":
            draft_entry = _make_draft(draft, request.draft_model, tmp / "target", tmp / "draft")
        elif draft.kind in HEAD_METHODS:
            draft_entry = _make_heads(target, draft, request.draft_model, speculative, tmp / "target", tmp / "draft")
        draft_part = None
        if draft_entry:
            entry = {k: v for k, v in draft_entry.items() if k != "kind"}
            draft_part = Part(**entry, method=draft_entry["kind"], files=hash_tree(tmp / "draft"))
        write_manifest(tmp, Manifest(
            name=name,
            runtime=Runtime.CPU,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            inputs_hash=inputs_hash,
            target=Part(preset=target.name, source=target.source, path="target", files=hash_tree(tmp / "target")),
            draft=draft_part,
            speculative=SpeculativeSettings.from_json(speculative, "the build's speculative settings"),
        ))

    write_dir_atomically(dest, assemble)
    console.print(f"[green]✓[/green] built engine {dest} ({draft.kind}, max_draft_len={speculative['max_draft_len']})")
    return dest


def _make_draft(draft: DraftPreset, draft_model: str | None, target_dir: Path, out: Path) -> dict[str, Any]:
    from specpipe.models.draft import check_same_vocabulary, truncate_target
    from specpipe.models.fetch import check_checkpoint_dir

    if draft_model:
        source_dir = Path(draft_model).expanduser()
        check_checkpoint_dir(source_dir)
        check_same_vocabulary(target_dir, source_dir)
        shutil.copytree(source_dir, out)
        source = {"kind": "local", "path": str(source_dir.resolve())}
    elif draft.source.get("kind") == "distilled":
        from specpipe.models.heads import make_distilled_draft, shipped_dir

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
    return {"preset": draft.name, "kind": draft.kind, "source": source, "path": "draft"}


def _shipped_weights(target: TargetPreset, draft: DraftPreset, draft_model: str | None) -> Path | None:
    """The compact weights file a head/distilled build reads, or ``None``."""
    from specpipe.models.heads import resolve_heads_dir, shipped_dir
    from specpipe.heads_format import COMPACT_FILES

    if draft.kind in HEAD_METHODS:
        return resolve_heads_dir(target.name, draft.kind, draft_model) / COMPACT_FILES[draft.kind]
    if draft.kind == "draft-model" and not draft_model and draft.source.get("kind") == "distilled":
        found = shipped_dir(str(draft.source.get("target")), "draft-model")
        return found / COMPACT_FILES["draft-model"] if found else None
    return None


def _make_heads(target: TargetPreset, draft: DraftPreset, draft_model: str | None, speculative: dict[str, Any],
                target_dir: Path, out: Path) -> dict[str, Any]:
    """Place EAGLE/Medusa heads (shipped or ``--draft-model``) into ``out`` and check the tree against them.

    Raises:
        CompatibilityError: heads trained for another target. SpecpipeError: corrupt heads, a tree deeper
        than the Medusa heads.
    """
    from specpipe.models.heads import place_heads, recipe, resolve_heads_dir
    source_dir = resolve_heads_dir(target.name, draft.kind, draft_model)
    facts = place_heads(draft.kind, source_dir, target_dir, out)
    if draft.kind == "medusa":
        Tree.parse(speculative["choices"]).check(max_depth=int(facts["num_heads"]), what="medusa_choices",
                                                 depth_limit="Medusa heads")
        speculative["num_medusa_heads"] = int(facts["num_heads"])
        speculative["num_medusa_layers"] = int(facts["num_layers"])
    made_by = recipe(source_dir) or {}
    source = {"kind": "local" if draft_model else "shipped", "path": str(source_dir.resolve()) if draft_model else source_dir.name,
              "command": made_by.get("command"), "heldout_metrics": made_by.get("heldout_metrics")}
    return {"preset": draft.name, "kind": draft.kind, "source": source, "path": "draft", "heads": facts}


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecpipeError(f"cannot create engines directory {directory} ({exc.strerror}): choose another with --engines-dir") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecpipeError(f"engines directory {directory} is not writable: choose another with --engines-dir")


def _up_to_date(dest: Path, inputs_hash: str) -> bool:
    try:
        manifest = read_manifest_json(dest)
    except ManifestError:
        return False
    if manifest.get("inputs_hash") != inputs_hash:
        return False
    for part in ("target", "draft"):
        entry = manifest.get(part)
        if not entry:
            continue
        for rel, digest in entry.get("files", {}).items():
            path = dest / entry["path"] / rel
            if not path.is_file() or sha256_file(path) != digest:
                console.print(f"[yellow]![/yellow] {path} is missing or changed since the build: rebuilding")
                return False
    return True
