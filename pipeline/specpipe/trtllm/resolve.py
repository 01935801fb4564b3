"""Resolve ``--target``/``--draft``/``--draft-model`` into what the TensorRT-LLM stages plan with.

A target is a preset name, a preset ``.toml``, or a local Hugging Face checkpoint directory. A draft
is a preset (``eagle``, ``medusa``, ``lookahead``, ``llama3.2-1b`` ...) whose weights may be replaced
with ``--draft-model PATH|ID``; a local directory is inspected (flavour, head width, vocabulary), a
Hugging Face id is resolved from its ``config.json`` (local cache first; the network only outside dry
runs). ``--draft-model`` with ``--draft none`` picks the method from the checkpoint's flavour.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.errors import CompatibilityError, PresetError, SpecpipeError
from specpipe.presets import (
    Architecture,
    DraftPreset,
    TargetPreset,
    architecture_from_hf_config,
    load_draft,
    load_target,
    target_from_model_dir,
)
from specpipe.speculative import METHODS, Method, spec_of
from specpipe.trtllm.checkpoint_flavour import CheckpointFlavourError, CheckpointInfo, inspect_checkpoint

#: Checkpoint flavour -> the method that uses it (the registry's ``flavours``).
FLAVOUR_METHOD = {flavour: method.value for method, spec in METHODS.items() for flavour in spec.flavours}
FLAVOUR_NAMES = {
    "eagle1": "EAGLE-1/2 head",
    "eagle3": "EAGLE-3 head",
    "medusa": "Medusa heads",
    "causal-lm": "causal LM",
}


class OfflineError(SpecpipeError):
    """A config needed for planning is neither local nor cached, and the network may not be used."""


@dataclass
class Target:
    """The target: its preset (architecture facts), where its weights come from, its 16-bit dtype."""

    preset: TargetPreset
    source: dict[str, Any]
    dtype: str

    @property
    def name(self) -> str:
        return self.preset.name

    @property
    def arch(self) -> Architecture:
        return self.preset.architecture


@dataclass
class Draft:
    """The speculative method and, where it has weights, what they are.

    Attributes:
        method: ``none`` | ``ngram`` | ``draft-model`` | ``eagle`` | ``medusa`` | ``lookahead``.
        preset: the draft preset (settings under ``speculative``).
        source: ``{"kind": "hf", "repo_id", "revision"}`` or ``{"kind": "local", "path"}``; ``None``
            without weights.
        flavour: ``eagle1`` | ``eagle3`` | ``medusa`` | ``causal-lm`` | ``None``.
        hidden_size, vocab_size: what the head expects/produces (elements, tokens); ``None`` unknown.
        arch: architecture of a draft model (draft-model method).
        num_heads, num_layers: Medusa heads and layers per head; EAGLE head decoder layers.
        checkpoint: the inspected local checkpoint, if any.
    """

    method: str
    preset: DraftPreset
    source: dict[str, Any] | None = None
    flavour: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    arch: Architecture | None = None
    num_heads: int | None = None
    num_layers: int | None = None
    checkpoint: CheckpointInfo | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.preset.name


def resolve_target(name: str) -> Target:
    """The target named by ``--target`` (preset name, ``.toml`` path, or checkpoint directory).

    Raises:
        PresetError: unknown preset (closest suggested), bad file, or a directory without config.json.
    """
    as_path = Path(name)
    if not name.endswith(".toml") and as_path.is_dir():
        preset = target_from_model_dir(as_path)
    else:
        preset = load_target(name)
    trt = dict(preset.extra.get("trtllm", {}))
    source = trt.get("source") or preset.source
    if source.get("kind") not in ("hf", "local"):
        raise PresetError(
            f"target '{preset.name}' has no Hugging Face or local checkpoint for TensorRT-LLM (source kind "
            f"{source.get('kind')!r}): add a [trtllm] source to {preset.path}"
        )
    return Target(preset=preset, source=dict(source), dtype=str(trt.get("dtype", "bfloat16")))


def _hf_config(repo_id: str, revision: str, allow_network: bool) -> dict[str, Any]:
    """``config.json`` of a Hugging Face repo: from the local cache, else (if allowed) downloaded.

    Raises:
        OfflineError: not cached and the network may not be used (dry run) or is unreachable.
    """
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text())
    if not allow_network:
        raise OfflineError(
            f"config.json of {repo_id} is not in the local Hugging Face cache and a dry run uses no network: "
            f"download the repo's config first or pass a local directory with --draft-model"
        )
    try:
        return json.loads(Path(hf_hub_download(repo_id, "config.json", revision=revision)).read_text())
    except Exception as exc:  # network, auth, missing repo: all mean the same to the user
        raise OfflineError(
            f"cannot read config.json of {repo_id}@{revision} ({type(exc).__name__}: {exc}): check the id, "
            f"your network and HF token, or pass a local directory"
        ) from exc


def flavour_from_config(config: dict[str, Any]) -> str | None:
    """Flavour from config keys alone (for Hugging Face ids whose weights are not downloaded yet)."""
    if "medusa_num_heads" in config or "medusa_num_layers" in config:
        return "medusa"
    if "draft_vocab_size" in config:
        return "eagle3"
    if "bias" in config and int(config.get("num_hidden_layers", 99)) <= 2:
        return "eagle1"
    if any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
        return "causal-lm"
    return None


def _info_from_config(config: dict[str, Any], where: str) -> CheckpointInfo:
    flavour = flavour_from_config(config)
    if flavour is None:
        raise CheckpointFlavourError(f"{where}: config.json matches no known draft layout (EAGLE, Medusa, causal LM)")
    if flavour == "medusa" and "medusa_num_heads" not in config:
        raise CheckpointFlavourError(
            f"{where}/config.json is a Medusa config without head count: it lacks 'medusa_num_heads'"
        )
    info = CheckpointInfo(Path(where), flavour, config)
    info.hidden_size = config.get("target_hidden_size", config.get("hidden_size"))
    info.vocab_size = config.get("vocab_size")
    info.draft_vocab_size = config.get("draft_vocab_size")
    info.num_heads = config.get("medusa_num_heads")
    info.num_layers = config.get("medusa_num_layers", config.get("num_hidden_layers"))
    info.notes.append("tensor names not checked: weights not downloaded yet")
    return info


def _inspect_draft_model(spec: str, allow_network: bool) -> tuple[CheckpointInfo, dict[str, Any]]:
    path = Path(spec).expanduser()
    if path.exists():
        return inspect_checkpoint(path), {"kind": "local", "path": str(path.resolve())}
    if "/" not in spec or spec.startswith((".", "/")):
        raise CheckpointFlavourError(
            f"--draft-model {spec}: no such directory (and not a Hugging Face id 'owner/name')"
        )
    repo, _, revision = spec.partition("@")
    config = _hf_config(repo, revision or "main", allow_network)
    return _info_from_config(config, repo), {"kind": "hf", "repo_id": repo, "revision": revision or "main"}


def resolve_draft(name: str, draft_model: str | None, target: Target, allow_network: bool) -> Draft:
    """The draft for ``--draft name`` and ``--draft-model`` against ``target``.

    Raises:
        PresetError: unknown draft preset; ``--draft-model`` with a method that has no weights.
        CompatibilityError: a draft model of the wrong flavour for the method; no published head for
            the target and no ``--draft-model``; a draft-model preset made for other targets.
        CheckpointFlavourError: the ``--draft-model`` checkpoint is unrecognised or inconsistent.
        OfflineError: an id whose config.json cannot be read.
    """
    info = source = None
    if draft_model is not None:
        info, source = _inspect_draft_model(draft_model, allow_network)
        if name == "none":
            method = FLAVOUR_METHOD[info.flavour]
            name = method if spec_of(method).weights == "heads" else Method.NONE.value
    preset = load_draft(name) if (name != "none" or draft_model is None) else None
    if preset is None:  # a plain causal LM passed with --draft none: a draft-model preset made up for it
        preset = DraftPreset(
            name=Path(draft_model).name or "draft",
            description=f"draft model {draft_model}",
            kind=Method.DRAFT_MODEL.value,
            source=source,
            speculative={"max_draft_len": spec_of(Method.DRAFT_MODEL).max_draft_len},
            for_targets=(),
            path=Path(draft_model),
        )
    method = preset.kind
    draft = Draft(method=method, preset=preset)
    if spec_of(method).weights is None:
        if draft_model is not None:
            raise PresetError(
                f"--draft-model has no meaning with --draft {preset.name} ({method} uses no draft weights): drop it"
            )
        return draft
    if info is not None:
        wanted = method
        if FLAVOUR_METHOD[info.flavour] != wanted:
            raise CompatibilityError(
                f"--draft-model {draft_model} is a {FLAVOUR_NAMES[info.flavour]}, but --draft {preset.name} needs "
                f"{ {'eagle': 'EAGLE heads', 'medusa': 'Medusa heads', 'draft-model': 'a causal LM'}[wanted] }: "
                f"use --draft {FLAVOUR_METHOD[info.flavour] if info.flavour != 'causal-lm' else 'none'} or another checkpoint"
            )
        draft.source, draft.flavour, draft.checkpoint = source, info.flavour, info
        draft.hidden_size, draft.vocab_size, draft.draft_vocab_size = (
            info.hidden_size,
            info.vocab_size,
            info.draft_vocab_size,
        )
        draft.num_heads, draft.num_layers, draft.notes = info.num_heads, info.num_layers, list(info.notes)
        if info.flavour == "causal-lm":
            draft.arch = architecture_from_hf_config(info.config, f"{draft_model}/config.json")
            draft.vocab_size = draft.arch.vocab_size
        return draft
    if method == "eagle":
        heads = preset.extra.get("heads", {})
        head = heads.get(target.name)
        if head is None:
            raise CompatibilityError(
                f"no EAGLE head is published for target '{target.name}' (heads exist for {', '.join(heads) or 'none'}): "
                f"pass one with --draft-model PATH|ID, or use --draft lookahead / a draft model"
            )
        draft.source = {"kind": "hf", "repo_id": head["repo_id"], "revision": head.get("revision", "main")}
        draft.flavour = head["flavour"]
        draft.hidden_size, draft.vocab_size = head["hidden_size"], head["vocab_size"]
        draft.draft_vocab_size = head.get("draft_vocab_size")
        draft.num_layers = head.get("num_layers", 1)
        return draft
    if method == "medusa":
        raise CompatibilityError(
            f"no Medusa heads are published for target '{target.name}' in the FasterDecoding layout: pass your heads "
            f"with --draft-model PATH|ID (config.json with medusa_num_heads + medusa_lm_head.safetensors)"
        )
    # draft-model preset
    if preset.for_targets and target.name not in preset.for_targets:
        raise CompatibilityError(
            f"draft '{preset.name}' was made for {', '.join(preset.for_targets)}, not for target '{target.name}': "
            f"pick a draft made for {target.name}, or pass one with --draft-model"
        )
    src = dict(preset.extra.get("trtllm", {}).get("source") or preset.source)
    if src.get("kind") != "hf" or preset.architecture is None:
        raise PresetError(
            f"draft '{preset.name}' has no Hugging Face checkpoint and architecture for TensorRT-LLM (source kind "
            f"{src.get('kind')!r}): it is a CPU-runtime draft; use --runtime cpu or a draft such as llama3.2-1b"
        )
    draft.source, draft.flavour, draft.arch = src, "causal-lm", preset.architecture
    draft.vocab_size, draft.hidden_size = preset.architecture.vocab_size, preset.architecture.hidden_size
    return draft
