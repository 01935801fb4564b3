"""What a CPU build takes from its request and presets: the flags it refuses, the drafts it pairs with a
target, and the speculative settings it resolves (:func:`resolve_speculative`) for :mod:`specpipe.build_cpu`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, FlagError, PresetError
from specpipe.presets import DraftPreset, TargetPreset, load_draft
from specpipe.speculative import (
    DYNAMIC_TREE_DEFAULTS,
    METHODS,
    Method,
    Runtime,
    SpeculativeSettings,
    entry_for,
    methods_for,
    names,
)
from specpipe.tree import Tree

_TRTLLM = "--runtime trtllm or trtllm-llmapi"
#: BuildRequest fields the CPU runtime does not take: field -> (flag, the runtimes that take it).
TRTLLM_ONLY_FIELDS = {
    "gpu": ("--gpu", _TRTLLM),
    "tp": ("--tp", _TRTLLM),
    "pp": ("--pp", _TRTLLM),
    "gpus": ("--gpus", _TRTLLM),
    "max_input_len": ("--max-input-len", _TRTLLM),
    "max_seq_len": ("--max-seq-len", _TRTLLM),
    "lookahead": ("--lookahead", "--runtime trtllm"),
    "executor": ("--executor", _TRTLLM),
}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BuildRequest)}


def refused_flags(request: BuildRequest) -> list[str]:
    """One line per flag of ``request`` that the CPU runtime does not take (set away from its default)."""
    return [
        f"{flag} is not taken by the CPU runtime (it applies to {runtimes}): drop it, or build with {runtimes}"
        for field, (flag, runtimes) in TRTLLM_ONLY_FIELDS.items()
        if getattr(request, field) != _DEFAULTS[field]
    ]


def check_cpu_pairing(target: TargetPreset, draft: DraftPreset) -> None:
    """Refuse drafts the CPU runtime cannot run, or that were made for another target.

    Raises:
        PresetError: the method is not available on the CPU runtime.
        CompatibilityError: the draft was made for other targets.
    """
    if draft.kind not in methods_for(Runtime.CPU):
        raise PresetError(
            f"draft '{draft.name}' ({draft.kind}) is not available on the CPU runtime yet: use one of "
            f"{names(methods_for(Runtime.CPU))} methods (e.g. --draft ngram), or --runtime trtllm"
        )
    if METHODS[Method(draft.kind)].weights == "heads":
        return  # heads are matched to the target by their shapes when the engine is built
    if draft.for_targets and target.name not in draft.for_targets:
        raise CompatibilityError(
            f"draft '{draft.name}' was made for {', '.join(draft.for_targets)}, not for target "
            f"'{target.name}': pick a draft made for {target.name} (or --draft ngram)"
        )


#: The most draft tokens the CPU runtime verifies in a step: its forward cost is measured up to this many
#: (``specpipe.runtime.cpu.scheduler.forward_cost.MEASURED_TOKENS``); on a CPU more than a handful never pays.
CPU_MAX_DRAFT_LEN = 64


def _check_cpu_draft_len(value: int, from_flag: bool) -> None:
    where, error = ("--max-draft-len", FlagError) if from_flag else ("the draft preset's max_draft_len", PresetError)
    if value > CPU_MAX_DRAFT_LEN:
        raise error(
            f"{where} {value} is more than the CPU runtime verifies in a step ({CPU_MAX_DRAFT_LEN} draft "
            f"tokens): give at most {CPU_MAX_DRAFT_LEN}"
        )


def resolve_speculative(
    draft: DraftPreset, max_draft_len: int | None, choices: str | Tree | None
) -> SpeculativeSettings:
    """The engine's speculative settings: the preset's with ``--max-draft-len`` / ``--choices`` applied.

    Chain methods take the preset's ``[speculative]`` table. Tree methods (EAGLE, Medusa) take the
    preset's ``[cpu]`` table (``choices``, ``max_draft_len``, ``dynamic_tree``, ``dynamic_top_k``,
    ``dynamic_depth``, ``acceptance``, ``draft_vocab``), else that of the shipped preset of the same
    method; the GPU presets' large trees (``mc_sim_7b_63``) cost too much to verify on CPU. A Medusa
    tree's depth is checked against the heads once they are known (:mod:`specpipe.build_cpu`).

    Raises:
        PresetError: ``--max-draft-len`` with ``none``, a non-positive draft length, an unknown preset key.
        FlagError: ``--choices`` with a chain method, ``--max-draft-len`` above :data:`CPU_MAX_DRAFT_LEN`.
        TreeError: malformed choices, or more nodes than ``max_draft_len``.
    """
    method = Method(draft.kind)
    if not METHODS[method].has_tree:
        if choices is not None:
            raise FlagError(f"--choices has no meaning with {method.value} (only EAGLE and Medusa use a tree): drop it")
        values = dict(draft.speculative)
        if method is Method.NONE:
            if max_draft_len is not None:
                raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
            values["max_draft_len"] = 0
        else:
            value = (
                max_draft_len
                if max_draft_len is not None
                else values.get("max_draft_len", METHODS[method].max_draft_len)
            )
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PresetError(f"max_draft_len must be a positive integer, got {value!r}")
            _check_cpu_draft_len(value, max_draft_len is not None)
            values["max_draft_len"] = value
        known = {f.name for f in dataclasses.fields(SpeculativeSettings)} - {"method", "tree"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise PresetError(
                f"draft preset '{draft.name}': [speculative] keys {unknown} are unknown to the CPU runtime: remove them"
            )
        return SpeculativeSettings(method=method, **values)
    cpu = _cpu_table(draft)
    dynamic = bool(cpu.get("dynamic_tree", False)) and choices is None
    limit = max_draft_len or cpu.get("max_draft_len")
    if limit:
        _check_cpu_draft_len(int(limit), max_draft_len is not None)
    what = METHODS[method].choices_key
    tree = Tree.parse(choices if choices is not None else cpu["choices"], what=what).breadth_first()
    tree.check(max_nodes=limit, what=what)
    settings = SpeculativeSettings(
        method=method,
        max_draft_len=int(limit or tree.nodes),
        tree=tree,
        dynamic_tree=dynamic,
        acceptance=cpu.get("acceptance", "exact"),
        draft_vocab=bool(cpu.get("draft_vocab", True)),
    )
    if dynamic:
        settings = settings.with_(
            dynamic_top_k=int(cpu.get("dynamic_top_k", DYNAMIC_TREE_DEFAULTS[0])),
            dynamic_depth=int(cpu.get("dynamic_depth", DYNAMIC_TREE_DEFAULTS[1])),
        )
    return entry_for(TREE_LEVELS, method, "build_cpu_settings.TREE_LEVELS")(settings)


#: What each tree method records of its tree's levels (EAGLE: the levels it drafts, the dynamic tree's
#: depth or the static tree's; Medusa's come from its heads, :data:`specpipe.build_cpu.HEAD_COUNTS`).
TREE_LEVELS: dict[Method, Callable[[SpeculativeSettings], SpeculativeSettings]] = {
    Method.EAGLE: lambda s: s.with_(num_eagle_layers=s.dynamic_depth if s.dynamic_tree else s.tree.depth),
    Method.MEDUSA: lambda s: s,
}


def _cpu_table(draft: DraftPreset) -> dict[str, Any]:
    """The ``[cpu]`` table of ``draft``, else of the shipped preset of its method.

    Raises:
        PresetError: neither has a ``[cpu]`` tree.
    """
    for preset in (draft, load_draft(draft.kind)):
        cpu = dict(preset.extra.get("cpu", {}))
        if cpu.get("choices"):
            return cpu
    raise PresetError(
        f"draft preset '{draft.name}' has no [cpu] choices tree: add one (e.g. choices = [[0], [0, 0], [1]]) "
        f"or pass --choices"
    )
