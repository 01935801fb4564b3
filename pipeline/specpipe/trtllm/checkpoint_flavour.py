"""Recognise what a local draft checkpoint is, from ``config.json`` keys and tensor names/shapes.

Flavours:
    ``eagle1``   EAGLE-1/2 head in the EAGLE authors' layout (SafeAILab/EAGLE ``eagle/model/cnets1.py``;
                 configs like ``eagle/train/EAGLE-LLaMA3-Instruct-8B.json`` @ f872b7f): one Llama decoder
                 layer ``layers.0.*``, ``fc.weight`` of shape ``[hidden, 2*hidden]`` (+ ``fc.bias`` when the
                 config's ``bias`` is true), optional ``embed_tokens.weight``; config ``num_hidden_layers`` 1.
                 EAGLE-2 uses the same weights (a run-time dynamic tree).
    ``eagle3``   EAGLE-3 head (SafeAILab/EAGLE ``eagle/traineagle3/cnets.py`` @ 9666a81 and config.json):
                 ``midlayer.*``, ``fc.weight`` ``[hidden, 3*target_hidden]``, ``lm_head.weight``
                 ``[draft_vocab_size, hidden]``, ``d2t``/``t2d``; config key ``draft_vocab_size``.
    ``medusa``   Medusa heads in the FasterDecoding layout: config ``medusa_num_heads``,
                 ``medusa_num_layers``; ``medusa_lm_head.safetensors``/``.pt`` with ``{h}.{l}.linear.weight``
                 ``[hidden, hidden]``, ``{h}.{l}.linear.bias`` and ``{h}.{L}.weight`` ``[vocab, hidden]``
                 (TensorRT-LLM ``tensorrt_llm/models/medusa/weight.py`` ``load_medusa_hf``).
    ``causal-lm`` a plain Hugging Face causal LM (``*ForCausalLM``, ``model.layers.*``).

Tensor names and shapes are read from safetensors headers only (no weights are loaded, nothing
heavy is imported). Pickled ``.pt``/``.bin`` files give no names; checks that need them report
"not checked".
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.errors import CompatibilityError

_MEDUSA_LAYER = re.compile(r"^(\d+)\.(\d+)\.linear\.weight$")
_MEDUSA_OUT = re.compile(r"^(\d+)\.(\d+)\.weight$")
_TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth")


class CheckpointFlavourError(CompatibilityError):
    """A draft checkpoint is unrecognised, incomplete or contradicts itself."""


@dataclass
class CheckpointInfo:
    """What a draft checkpoint directory holds.

    Attributes:
        path: the directory.
        flavour: ``eagle1`` | ``eagle3`` | ``medusa`` | ``causal-lm``.
        config: the parsed ``config.json``.
        tensors: tensor name -> shape, from safetensors headers (empty when none are readable).
        hidden_size: hidden width the head expects from the target (elements).
        vocab_size: logits width (tokens) the head produces over the target vocabulary.
        num_heads: Medusa heads (``None`` for other flavours).
        num_layers: Medusa layers per head, or decoder layers.
        notes: facts that could not be checked, for the report.
    """

    path: Path
    flavour: str
    config: dict[str, Any]
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_heads: int | None = None
    num_layers: int | None = None
    draft_vocab_size: int | None = None
    notes: list[str] = field(default_factory=list)


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a ``.safetensors`` file's JSON header (8-byte little-endian length).

    Raises:
        CheckpointFlavourError: the file is not a readable safetensors file.
    """
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise ValueError("header length out of range")
            header = json.loads(f.read(length))
        return {name: tuple(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}
    except (OSError, ValueError, struct.error, AttributeError, KeyError, TypeError) as exc:  # not a header mapping
        raise CheckpointFlavourError(
            f"{path} is not a safetensors/PyTorch weights file (unreadable safetensors "
            f"header: {type(exc).__name__}: {exc}): re-download it"
        ) from exc


def read_config(directory: Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict.

    Raises:
        CheckpointFlavourError: the directory or its config.json is missing or not JSON.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointFlavourError(f"--draft-model {directory} is not a directory")
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointFlavourError(f"{directory} has no config.json: pass the exported checkpoint directory")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointFlavourError(f"{path} is not valid JSON ({exc})") from exc


def _tensors(directory: Path) -> dict[str, tuple[int, ...]]:
    tensors: dict[str, tuple[int, ...]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(read_safetensors_header(file))
    return tensors


def _has_weights(directory: Path) -> bool:
    patterns = ("*.safetensors", "*.bin", "*.pt", "*.pth")
    return any(p for pattern in patterns for p in directory.glob(pattern) if p.name not in _TRAINING_STATE)


def inspect_checkpoint(directory: Path | str) -> CheckpointInfo:
    """Recognise the flavour of the checkpoint in ``directory`` and read its shape facts.

    Raises:
        CheckpointFlavourError: no config.json; a training-state folder instead of exported weights;
            a Medusa config without head count or whose head count contradicts the weights; an EAGLE
            ``bias`` flag that contradicts the weights; a layout not recognised.
    """
    directory = Path(directory)
    config = read_config(directory)
    if not _has_weights(directory):
        if any((directory / name).exists() for name in _TRAINING_STATE) or list(directory.glob("global_step*")):
            raise CheckpointFlavourError(
                f"{directory} is a training-state folder (optimizer/trainer state, no exported weights): "
                f"export the model weights (safetensors) and pass that directory"
            )
        raise CheckpointFlavourError(
            f"{directory} holds a config.json but no weight files (*.safetensors, *.bin, *.pt)"
        )
    tensors = _tensors(directory)
    names = set(tensors)

    if "eagle" in config or (isinstance(config.get("medusa"), dict)):
        raise CheckpointFlavourError(
            f"{directory} is a combined ModelOpt checkpoint (base model with built-in heads): specpipe builds from a "
            f"base model plus separate heads; pass the EAGLE/Medusa heads directory instead"
        )
    medusa_like = (
        any(_MEDUSA_LAYER.match(n) for n in names)
        or "medusa_num_heads" in config
        or "medusa_num_layers" in config
        or any(directory.glob("medusa_lm_head.*"))
    )
    if medusa_like:
        return _medusa(directory, config, tensors)
    if "draft_vocab_size" in config or any(n.startswith("midlayer.") for n in names) or "d2t" in names:
        return _eagle3(directory, config, tensors)
    eagle1_tensors = "fc.weight" in names and any(n.startswith("layers.") for n in names)
    eagle1_config = not names and "bias" in config and int(config.get("num_hidden_layers", 99)) <= 2
    if eagle1_tensors or eagle1_config:
        return _eagle1(directory, config, tensors)
    archs = config.get("architectures") or []
    if any(str(a).endswith("ForCausalLM") for a in archs) and (not names or any(n.startswith("model.") for n in names)):
        info = CheckpointInfo(directory, "causal-lm", config, tensors)
        info.hidden_size = config.get("hidden_size")
        info.vocab_size = config.get("vocab_size")
        info.num_layers = config.get("num_hidden_layers")
        if not names:
            info.notes.append("tensor names not checked: weights are pickled (.bin/.pt)")
        return info
    raise CheckpointFlavourError(
        f"{directory}: unrecognised checkpoint (config keys {sorted(config)[:8]}...): expected EAGLE-1/2 or EAGLE-3 heads "
        f"(EAGLE authors' layout), Medusa heads (FasterDecoding layout) or a *ForCausalLM model"
    )


def _medusa(directory: Path, config: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> CheckpointInfo:
    layer_keys = [m for m in (_MEDUSA_LAYER.match(n) for n in tensors) if m]
    found_heads = len({int(m.group(1)) for m in layer_keys}) if layer_keys else None
    found_layers = len({int(m.group(2)) for m in layer_keys}) if layer_keys else None
    if "medusa_num_heads" not in config:
        hint = f' (the weights hold {found_heads} heads: add "medusa_num_heads": {found_heads})' if found_heads else ""
        raise CheckpointFlavourError(
            f"{directory}/config.json is a Medusa config without head count: it lacks 'medusa_num_heads'{hint}"
        )
    heads = int(config["medusa_num_heads"])
    layers = int(config.get("medusa_num_layers", 1))
    if found_heads is not None and found_heads != heads:
        raise CheckpointFlavourError(
            f"{directory}: config.json says medusa_num_heads={heads} but the weights hold {found_heads} heads: "
            f"set medusa_num_heads to {found_heads} in config.json"
        )
    if found_layers is not None and found_layers != layers:
        raise CheckpointFlavourError(
            f"{directory}: config.json says medusa_num_layers={layers} but the weights hold {found_layers} layers per head: "
            f"set medusa_num_layers to {found_layers}"
        )
    info = CheckpointInfo(directory, "medusa", config, tensors, num_heads=heads, num_layers=layers)
    if "0.0.linear.weight" in tensors:
        info.hidden_size = tensors["0.0.linear.weight"][1]
    out = tensors.get(f"0.{layers}.weight")
    if out is not None:
        info.vocab_size = out[0]
    if info.hidden_size is None:
        info.notes.append("Medusa head width not checked: weights are pickled (medusa_lm_head.pt)")
    return info


def _eagle3(directory: Path, config: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> CheckpointInfo:
    info = CheckpointInfo(directory, "eagle3", config, tensors)
    hidden = config.get("hidden_size")
    target_hidden = config.get("target_hidden_size", hidden)
    fc = tensors.get("fc.weight")
    if fc is not None and target_hidden is not None and fc[1] != 3 * target_hidden:
        raise CheckpointFlavourError(
            f"{directory}: EAGLE-3 fc.weight has shape {list(fc)}, config implies [{hidden}, {3 * target_hidden}]: "
            f"config.json does not describe these weights"
        )
    info.hidden_size = target_hidden
    info.vocab_size = config.get("vocab_size")
    info.draft_vocab_size = config.get("draft_vocab_size", info.vocab_size)
    info.num_layers = config.get("num_hidden_layers", 1)
    return info


def _eagle1(directory: Path, config: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> CheckpointInfo:
    info = CheckpointInfo(directory, "eagle1", config, tensors)
    hidden = config.get("hidden_size")
    fc = tensors.get("fc.weight")
    if fc is not None and hidden is not None and tuple(fc) != (hidden, 2 * hidden):
        raise CheckpointFlavourError(
            f"{directory}: EAGLE fc.weight has shape {list(fc)}, config hidden_size {hidden} implies [{hidden}, {2 * hidden}]"
        )
    if tensors and "bias" in config:
        has_bias = "fc.bias" in tensors
        if bool(config["bias"]) != has_bias:
            raise CheckpointFlavourError(
                f"{directory}: config.json says bias={str(bool(config['bias'])).lower()} but fc.bias is "
                f'{"present" if has_bias else "absent"} in the weights: set "bias": {str(has_bias).lower()} in config.json'
            )
    embed = tensors.get("embed_tokens.weight")
    info.hidden_size = hidden
    info.vocab_size = embed[0] if embed else config.get("vocab_size")
    if embed and config.get("vocab_size") not in (None, embed[0]):
        raise CheckpointFlavourError(
            f"{directory}: config vocab_size {config.get('vocab_size')} but embed_tokens.weight has {embed[0]} rows"
        )
    info.num_layers = config.get("num_hidden_layers", 1)
    if not tensors:
        info.notes.append("EAGLE tensor names not checked: weights are pickled (pytorch_model.bin)")
    return info
