"""Target and draft presets: declarative TOML files in ``build/targets`` and ``build/drafts``.

A target preset names a model source and carries the architecture facts that planning needs offline.
A draft preset names a speculative method (``none``, ``ngram``, ``draft-model``, ``eagle``,
``medusa``, ``lookahead``) and its settings. Users add presets by dropping TOML files into a
directory listed in ``$SPECPIPE_PRESETS`` or by passing a path to a TOML file.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.errors import PresetError
from specpipe.paths import preset_roots
from specpipe.speculative import Method

#: The ``kind`` values a draft preset may take: the registry's methods.
DRAFT_KINDS = tuple(m.value for m in Method)


@dataclass(frozen=True)
class Architecture:
    """Transformer shape facts used for planning (memory, compatibility), all counts."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False

    @property
    def num_parameters(self) -> int:
        """Approximate parameter count of a Llama-style decoder (embeddings + layers + lm_head)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        lm_head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_layers * per_layer + h + lm_head


@dataclass(frozen=True)
class TargetPreset:
    """A target model: where its weights come from and its architecture."""

    name: str
    description: str
    family: str
    source: dict[str, Any]
    architecture: Architecture
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DraftPreset:
    """A speculative method and its settings.

    ``kind`` is one of :data:`DRAFT_KINDS`; ``source`` says where draft weights come from (absent for
    ``none``/``ngram``/``lookahead``); ``speculative`` holds method settings such as ``max_draft_len``.
    ``for_targets`` lists the targets the draft was made for (empty: any target with the same tokenizer).
    """

    name: str
    description: str
    kind: str
    source: dict[str, Any]
    speculative: dict[str, Any]
    for_targets: tuple[str, ...]
    path: Path
    architecture: Architecture | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"preset file {path} is not valid TOML: {exc}") from exc


def _architecture(data: dict[str, Any] | None, path: Path) -> Architecture | None:
    if not data:
        return None
    try:
        return Architecture(**data)
    except TypeError as exc:
        raise PresetError(f"preset file {path}: bad [architecture] table ({exc})") from exc


def _catalogue(kind: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in preset_roots():
        for path in sorted((root / kind).glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def available_targets() -> list[str]:
    return sorted(_catalogue("targets"))


def available_drafts() -> list[str]:
    return sorted(_catalogue("drafts"))


def _unknown(what: str, name: str, known: list[str]) -> PresetError:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return PresetError(
        f"unknown {what} '{name}': {hint}known {what}s: {', '.join(known)} (or pass a path to a preset .toml file)"
    )


def _locate(kind: str, name: str) -> Path:
    as_path = Path(name)
    if name.endswith(".toml"):
        if not as_path.is_file():
            raise PresetError(f"preset file {name} does not exist")
        return as_path
    catalogue = _catalogue(kind)
    if name not in catalogue:
        raise _unknown(kind[:-1], name, sorted(catalogue))
    return catalogue[name]


def load_target(name: str) -> TargetPreset:
    """Load a target preset by name (``smollm2-135m``) or TOML path.

    Raises:
        PresetError: unknown name (with the closest known name suggested) or a malformed file.
    """
    path = _locate("targets", name)
    data = _read_toml(path)
    arch = _architecture(data.pop("architecture", None), path)
    if arch is None:
        raise PresetError(f"target preset {path} has no [architecture] table")
    try:
        return TargetPreset(
            name=data.pop("name", path.stem),
            description=data.pop("description", ""),
            family=data.pop("family", "llama"),
            source=data.pop("source"),
            architecture=arch,
            path=path,
            extra=data,
        )
    except KeyError as exc:
        raise PresetError(f"target preset {path} lacks the key {exc}") from exc


def load_draft(name: str) -> DraftPreset:
    """Load a draft preset by name (``ngram``, ``smollm2-draft``, ``eagle`` ...) or TOML path.

    Raises:
        PresetError: unknown name (closest suggested), unknown ``kind`` or a malformed file.
    """
    path = _locate("drafts", name)
    data = _read_toml(path)
    kind = data.pop("kind", None)
    if kind not in DRAFT_KINDS:
        raise PresetError(f"draft preset {path}: kind {kind!r} is not one of {', '.join(DRAFT_KINDS)}")
    return DraftPreset(
        name=data.pop("name", path.stem),
        description=data.pop("description", ""),
        kind=kind,
        source=data.pop("source", {}),
        speculative=data.pop("speculative", {}),
        for_targets=tuple(data.pop("for_targets", ())),
        path=path,
        architecture=_architecture(data.pop("architecture", None), path),
        extra=data,
    )


def architecture_from_hf_config(config: dict[str, Any], where: str = "config.json") -> Architecture:
    """The :class:`Architecture` of a Hugging Face ``config.json`` (Llama-style keys).

    ``head_dim`` defaults to ``hidden_size // num_attention_heads`` and ``num_key_value_heads`` to
    ``num_attention_heads``, as in transformers' ``LlamaConfig``.

    Raises:
        PresetError: a required key is missing.
    """
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return Architecture(
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise PresetError(f"{where} lacks {exc}: it does not describe a decoder-only transformer") from exc


def target_from_model_dir(path: Path | str) -> TargetPreset:
    """A target preset synthesised from a local Hugging Face checkpoint directory (its config.json).

    Raises:
        PresetError: the directory has no readable config.json or the config lacks a required key.
    """
    import json

    directory = Path(path)
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise PresetError(f"target directory {directory} has no readable config.json ({exc})") from exc
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return TargetPreset(
        name=directory.name,
        description=f"local checkpoint {directory}",
        family=str(config.get("model_type", "llama")),
        source={"kind": "local", "path": str(directory.resolve())},
        architecture=architecture_from_hf_config(config, str(config_path)),
        path=config_path,
        extra={"trtllm": {"converter": "llama", "dtype": dtype if dtype in ("float16", "bfloat16") else "bfloat16"}},
    )
