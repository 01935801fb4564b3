"""A TensorRT-LLM build's speculative settings: each method's resolver and its one-line description.

The settings come from the draft preset's ``[speculative]`` table, ``--choices``, ``--lookahead`` and
``--max-draft-len``, with the registry's defaults (:mod:`specpipe.speculative`). Per method, one entry of
:data:`RESOLVERS` and one of :data:`DESCRIPTIONS`.

Sources: EAGLE's ``max_draft_len <= 256`` from ``examples/eagle/convert_checkpoint.py`` @ 65b31db;
lookahead's ``max_draft_len`` formula from ``examples/lookahead/README.md`` @ 83ab45a, its (W, N, G) rules
(N = 1 needs W = 1 and G = 0) from ``cpp/tensorrt_llm/executor/decodingConfig.cpp`` @ 0371ba0; trees from
:mod:`specpipe.tree`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, PresetError
from specpipe.speculative import NGRAM_MATCH_DEFAULT, Method, Runtime, SpeculativeSettings, entry_for, spec_of
from specpipe.tree import Tree
from specpipe.trtllm.resolve import Draft

EAGLE_MAX_DRAFT_LEN = 256
#: Draft tokens of the LLM API's EAGLE-3 chain when the preset names none (``llmapi_max_draft_len``).
LLMAPI_EAGLE_CHAIN = 3
#: The tree used when neither ``--choices`` nor the preset gives one (:data:`specpipe.tree.MC_SIM_7B_63`).
DEFAULT_TREE = "mc_sim_7b_63"
#: TensorRT-LLM's EAGLE ``max_non_leaves_per_layer`` when the preset names none.
EAGLE_NON_LEAVES_DEFAULT = 10
#: Medusa heads and residual layers per head when neither the checkpoint nor the preset says.
MEDUSA_HEADS_DEFAULT, MEDUSA_LAYERS_DEFAULT = 4, 1


def lookahead_max_draft_len(w: int, n: int, g: int) -> int:
    """Draft tokens per step of lookahead (W, N, G): ``(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)``."""
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


def resolve_speculative(request: BuildRequest, draft: Draft) -> SpeculativeSettings:
    """Speculative settings from the preset, ``--choices``, ``--lookahead`` and ``--max-draft-len``.

    Defaults: the registry's ``max_draft_len`` (:mod:`specpipe.speculative`), the preset's
    ``[speculative]`` table, :data:`DEFAULT_TREE`.

    Raises:
        PresetError: an option that means nothing for the method.
        CompatibilityError: ``max_draft_len`` smaller than the tree, a tree deeper than the EAGLE
            layers/Medusa heads, a lookahead ``max_draft_len`` that disagrees with (W, N, G), EAGLE limits.
        MethodTableError: a method without an entry in :data:`RESOLVERS`.
    """
    method = Method(draft.method)
    if request.choices is not None and not spec_of(method).has_tree:
        raise PresetError(f"--choices has no meaning with {method.value} (only EAGLE and Medusa use a tree): drop it")
    if request.lookahead is not None and method is not Method.LOOKAHEAD:
        raise PresetError(f"--lookahead has no meaning with {method.value}: drop it, or use --draft lookahead")
    resolver = entry_for(RESOLVERS, method, "trtllm.draft_settings.RESOLVERS")
    return resolver(request, draft, SpeculativeSettings(method, flavour=draft.flavour), draft.preset.speculative)


def _none(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    if request.max_draft_len is not None:
        raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
    return base


def _lookahead(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    w, n, g = request.lookahead or (settings["window_size"], settings["ngram_size"], settings["verification_set_size"])
    if n == 1:  # TensorRT-LLM: "ngramSize=1 requires windowSize=1" and "verificationSetSize=0"
        raise CompatibilityError(
            f"lookahead (W, N, G) = ({w}, {n}, {g}): TensorRT-LLM requires W = 1 and G = 0 for N = 1, and G >= 1 "
            f"here (cpp/tensorrt_llm/executor/decodingConfig.cpp @ 0371ba0): use N >= 2, e.g. --lookahead {w},2,{g}"
        )
    need = lookahead_max_draft_len(w, n, g)
    if request.max_draft_len is not None and request.max_draft_len != need:
        raise CompatibilityError(
            f"--max-draft-len {request.max_draft_len} disagrees with lookahead (W, N, G) = ({w}, {n}, {g}), which "
            f"needs max_draft_len {need} = (N-2) + (W-1+G)*(N-1): drop --max-draft-len or change --lookahead"
        )
    return base.with_(max_draft_len=need, lookahead=(w, n, g))


def _chain(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    return base.with_(
        max_draft_len=request.max_draft_len or int(settings.get("max_draft_len", base.spec.max_draft_len))
    )


def _ngram(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    return _chain(request, draft, base, settings).with_(
        max_matching_ngram_size=int(settings.get("max_matching_ngram_size", NGRAM_MATCH_DEFAULT))
    )


def _tree(request: BuildRequest, base: SpeculativeSettings, settings: dict[str, Any]) -> tuple[Tree, int]:
    """The tree and ``max_draft_len`` of a tree method, the tree checked against the draft length."""
    tree = Tree.parse(request.choices or settings.get("choices", DEFAULT_TREE))
    max_draft_len = (
        request.max_draft_len if request.max_draft_len is not None else int(settings.get("max_draft_len", tree.nodes))
    )
    tree.check(max_nodes=max_draft_len, what=base.spec.choices_key)
    return tree, max_draft_len


def _eagle(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    if request.runtime == Runtime.TRTLLM_LLMAPI.value and request.choices is None:
        # LLM API EAGLE-3: a linear chain of draft tokens unless a tree is given.
        return base.with_(
            max_draft_len=request.max_draft_len or int(settings.get("llmapi_max_draft_len", LLMAPI_EAGLE_CHAIN))
        )
    tree, max_draft_len = _tree(request, base, settings)
    if max_draft_len > EAGLE_MAX_DRAFT_LEN:
        raise CompatibilityError(
            f"--max-draft-len {max_draft_len} exceeds EAGLE's limit of {EAGLE_MAX_DRAFT_LEN} in TensorRT-LLM: use <= 256"
        )
    return base.with_(
        max_draft_len=max_draft_len,
        tree=tree,
        num_eagle_layers=tree.depth,
        max_non_leaves_per_layer=max(
            tree.max_non_leaves, int(settings.get("max_non_leaves_per_layer", EAGLE_NON_LEAVES_DEFAULT))
        ),
    )


def _medusa(
    request: BuildRequest, draft: Draft, base: SpeculativeSettings, settings: dict[str, Any]
) -> SpeculativeSettings:
    tree, max_draft_len = _tree(request, base, settings)
    heads = draft.num_heads or int(settings.get("num_medusa_heads", MEDUSA_HEADS_DEFAULT))
    layers = draft.num_layers or int(settings.get("num_medusa_layers", MEDUSA_LAYERS_DEFAULT))
    tree.check(
        max_depth=heads,
        what=base.spec.choices_key,
        depth_limit="Medusa heads",
        fix_depth="use a tree at most {limit} deep with --choices, or heads with more levels",
    )
    return base.with_(max_draft_len=max_draft_len, tree=tree, num_medusa_heads=heads, num_medusa_layers=layers)


Resolver = Callable[[BuildRequest, Draft, SpeculativeSettings, dict[str, Any]], SpeculativeSettings]
#: Each method's settings on the TensorRT-LLM flows (and the depth limits of its tree), for every method
#: either flow runs. Arguments: the request, the resolved draft, the settings so far (method and
#: flavour) and the preset's ``[speculative]`` table.
RESOLVERS: dict[Method, Resolver] = {
    Method.NONE: _none,
    Method.NGRAM: _ngram,
    Method.DRAFT_MODEL: _chain,
    Method.EAGLE: _eagle,
    Method.MEDUSA: _medusa,
    Method.LOOKAHEAD: _lookahead,
}


def _describe_eagle(spec: SpeculativeSettings) -> str:
    if spec.tree is None:
        return f"linear chain of {spec.max_draft_len} draft tokens (LLM API EAGLE-3)"
    return (
        f"eagle_choices depth {spec.tree.depth} = num_eagle_layers {spec.num_eagle_layers}, "
        f"{spec.tree.nodes} nodes <= max_draft_len {spec.max_draft_len}"
    )


def _describe_medusa(spec: SpeculativeSettings) -> str:
    return (
        f"medusa_choices depth {spec.tree.depth} <= {spec.num_medusa_heads} heads, "
        f"{spec.tree.nodes} nodes <= max_draft_len {spec.max_draft_len}"
    )


def _describe_lookahead(spec: SpeculativeSettings) -> str:
    w, n, g = spec.lookahead
    return f"(W, N, G) = ({w}, {n}, {g}) -> max_draft_len {spec.max_draft_len}"


def _describe_chain(spec: SpeculativeSettings) -> str:
    return f"max_draft_len {spec.max_draft_len}"


#: The pre-flight line "draft length vs tree/method" of each method that drafts.
DESCRIPTIONS: dict[Method, Callable[[SpeculativeSettings], str]] = {
    Method.NGRAM: _describe_chain,
    Method.DRAFT_MODEL: _describe_chain,
    Method.EAGLE: _describe_eagle,
    Method.MEDUSA: _describe_medusa,
    Method.LOOKAHEAD: _describe_lookahead,
}


def describe(spec: SpeculativeSettings) -> str:
    """How the draft length follows from the tree or the method's settings (one line).

    Raises:
        MethodTableError: a method without an entry in :data:`DESCRIPTIONS`.
    """
    return entry_for(DESCRIPTIONS, spec.method, "trtllm.draft_settings.DESCRIPTIONS")(spec)
