"""The speculative methods: one registry record per method, and the typed settings both builds produce.

Every table that maps a method to something (which runtimes run it, its TensorRT-LLM spellings, the
quantizations it allows, its defaults, whether ``specpipe train-draft`` trains it) reads
:data:`METHODS`. Adding a method is the checklist in ``docs/architecture.md``.

TensorRT-LLM spellings, release 1.2.1 (the pin in :mod:`specpipe.trtllm.release`):

* ``trtllm-build --speculative_decoding_mode``: ``tensorrt_llm/commands/build.py`` choices
  (``draft_tokens_external``, ``medusa``, ``lookahead_decoding``, ``eagle``, ...);
* the backend's ``decoding_mode`` parameter: ``triton_backend/inflight_batcher_llm/src/utils.cc``
  ``getDecodingModeFromString`` (``top_k_top_p``, ``medusa``, ``lookahead``, ``eagle``, ...); draft-target
  and plain decoding have no mode of their own and use ``top_k_top_p``, the default for beam width 1;
* the LLM API's ``speculative_config.decoding_type``: ``tensorrt_llm/llmapi/llm_args.py``
  (``Eagle3DecodingConfig``, ``NGramDecodingConfig``, ``DraftTargetDecodingConfig``).

Quantizations per method come from each method's support matrix in TensorRT-LLM's
``examples/{eagle,medusa,draft_target_model,lookahead}/README.md``.

vLLM spellings, release 0.34.0 (the pin in :mod:`specpipe.vllm.release`): ``speculative_config.method``,
the ``SpeculativeMethod`` literal of ``vllm/config/speculative.py`` in the 0.34.0 wheel (``ngram``,
``draft_model``, ``eagle``, ``eagle3``, ``mtp``, ``suffix``, ...; no ``medusa`` and no lookahead decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, Mapping, TypeVar

from specpipe.errors import ManifestError, MethodTableError
from specpipe.tree import Tree


class Runtime(str, Enum):
    """Where an engine runs: the CPU reference runtime, TensorRT-LLM's engine flow, its LLM API, or vLLM."""

    CPU = "cpu"
    TRTLLM = "trtllm"
    TRTLLM_LLMAPI = "trtllm-llmapi"
    VLLM = "vllm"


class Method(str, Enum):
    """A speculative decoding method (the ``kind`` of a draft preset)."""

    NONE = "none"
    NGRAM = "ngram"
    DRAFT_MODEL = "draft-model"
    EAGLE = "eagle"
    MEDUSA = "medusa"
    LOOKAHEAD = "lookahead"


class Shape(str, Enum):
    """How draft tokens are arranged: none, one chain, or a token tree."""

    NONE = "none"
    CHAIN = "chain"
    TREE = "tree"


ALL_QUANTIZATIONS = ("bf16", "fp16", "fp8", "int4-awq", "int8-wo", "int4-wo")


@dataclass(frozen=True)
class MethodSpec:
    """What specpipe knows about one method.

    Attributes:
        method: the method.
        description: one line for help texts.
        runtimes: the runtimes that run it.
        shape: chain or tree (on the engine flow; the LLM API runs EAGLE-3 as a chain unless given a tree).
        weights: ``None`` (no draft weights), ``"heads"`` (EAGLE/Medusa heads on the target's features)
            or ``"model"`` (a separate draft causal LM).
        build_mode: ``trtllm-build --speculative_decoding_mode`` value, ``None`` where no flag is passed.
        decoding_mode: the tensorrtllm backend's ``decoding_mode`` parameter.
        decoding_type: the LLM API's ``speculative_config.decoding_type``, ``None`` where it has none.
        quantizations: the engine flow's supported quantizations, and ``quantization_source`` where that
            is documented.
        max_draft_len: default draft tokens per step (tree methods: the tree's node count).
        trainable: ``specpipe train-draft --method`` can train it.
        flavours: checkpoint flavours it accepts (EAGLE-1/2 heads: ``eagle1``; EAGLE-3: ``eagle3``).
        choices_key: the name TensorRT-LLM gives its tree (``eagle_choices``/``medusa_choices``).
        vllm_method: vLLM's ``speculative_config.method`` (EAGLE-1/2 heads; an EAGLE-3 head is ``eagle3``,
            :data:`VLLM_FLAVOUR_METHODS`), ``None`` where vLLM has none (plain decoding, Medusa, lookahead).
    """

    method: Method
    description: str
    runtimes: frozenset[Runtime]
    shape: Shape
    weights: str | None = None
    build_mode: str | None = None
    decoding_mode: str = "top_k_top_p"
    decoding_type: str | None = None
    quantizations: tuple[str, ...] = ALL_QUANTIZATIONS
    quantization_source: str | None = None
    max_draft_len: int = 0
    trainable: bool = False
    flavours: tuple[str, ...] = ()
    choices_key: str | None = None
    vllm_method: str | None = None

    @property
    def has_tree(self) -> bool:
        return self.shape is Shape.TREE

    def runs_on(self, runtime: Runtime | str) -> bool:
        return Runtime(runtime) in self.runtimes


_ALL = frozenset(Runtime)
METHODS: dict[Method, MethodSpec] = {
    spec.method: spec
    for spec in (
        MethodSpec(Method.NONE, "plain decoding (the baseline)", _ALL, Shape.NONE),
        MethodSpec(
            Method.NGRAM,
            "n-gram prompt lookup (no draft weights)",
            frozenset({Runtime.CPU, Runtime.TRTLLM_LLMAPI, Runtime.VLLM}),
            Shape.CHAIN,
            decoding_type="NGram",
            max_draft_len=4,
            vllm_method="ngram",
        ),
        MethodSpec(
            Method.DRAFT_MODEL,
            "a separate, smaller draft model",
            _ALL,
            Shape.CHAIN,
            weights="model",
            build_mode="draft_tokens_external",
            decoding_type="Draft_Target",
            quantizations=("bf16", "fp16", "fp8"),
            quantization_source="examples/draft_target_model/README.md support matrix (FP16/BF16/FP8)",
            max_draft_len=4,
            trainable=True,
            flavours=("causal-lm",),
            vllm_method="draft_model",
        ),
        MethodSpec(
            Method.EAGLE,
            "EAGLE draft head on the target's features",
            _ALL,
            Shape.TREE,
            weights="heads",
            build_mode="eagle",
            decoding_mode="eagle",
            decoding_type="Eagle3",
            quantizations=("bf16", "fp16"),
            quantization_source="examples/eagle/README.md support matrix (FP16/BF16 only)",
            max_draft_len=4,
            trainable=True,
            flavours=("eagle1", "eagle3"),
            choices_key="eagle_choices",
            vllm_method="eagle",
        ),
        MethodSpec(
            Method.MEDUSA,
            "Medusa heads on the target's last hidden state",
            frozenset({Runtime.CPU, Runtime.TRTLLM}),
            Shape.TREE,
            weights="heads",
            build_mode="medusa",
            decoding_mode="medusa",
            quantizations=("bf16", "fp16", "fp8"),
            quantization_source="examples/medusa/README.md support matrix (FP16, BF16, FP8 base model)",
            max_draft_len=4,
            trainable=True,
            flavours=("medusa",),
            choices_key="medusa_choices",
        ),
        MethodSpec(
            Method.LOOKAHEAD,
            "lookahead decoding (Jacobi n-grams of the target itself)",
            frozenset({Runtime.TRTLLM}),
            Shape.CHAIN,
            build_mode="lookahead_decoding",
            decoding_mode="lookahead",
            quantizations=("bf16", "fp16", "fp8"),
            quantization_source="examples/lookahead/README.md support matrix (FP16/BF16/FP8)",
        ),
    )
}


#: Checkpoint flavours whose vLLM ``speculative_config.method`` is not their method's ``vllm_method``.
VLLM_FLAVOUR_METHODS: dict[str, str] = {"eagle3": "eagle3"}


def spec_of(method: Method | str) -> MethodSpec:
    """The registry record of ``method``.

    Raises:
        ValueError: not a method name (see :class:`Method`).
    """
    return METHODS[Method(method)]


def methods_for(runtime: Runtime | str) -> tuple[Method, ...]:
    """The methods ``runtime`` runs, in registry order."""
    return tuple(m for m, s in METHODS.items() if s.runs_on(runtime))


T = TypeVar("T")


def entry_for(table: Mapping[Method, T], method: Method | str, table_name: str) -> T:
    """The entry of ``method`` in a per-method table (a ``dict[Method, ...]`` of the layer that owns it).

    Per-method behaviour lives in such tables, never in an if-chain whose last branch serves whatever
    method comes; ``tests/test_registry_tables.py`` checks that every table covers the methods that claim it.

    Raises:
        MethodTableError: ``method`` has no entry in ``table_name`` (specpipe was extended without it);
            the message names the method, the table and the checklist to follow.
    """
    method = Method(method)
    if method not in table:
        raise MethodTableError(
            f"method {method.value!r} has no entry in {table_name}: add one (docs/architecture.md, "
            f"'Adding a speculative method'); it has entries for {names(table)}"
        )
    return table[method]


def names(methods) -> str:
    """``"none, ngram, ..."`` for messages."""
    return ", ".join(Method(m).value for m in methods)


#: Defaults that are not the preset's to choose (CPU runtime and LLM API details).
NGRAM_MATCH_DEFAULT = 3  # max_matching_ngram_size, tokens
DYNAMIC_TREE_DEFAULTS = (4, 4)  # EAGLE-2 dynamic tree: top-k per expansion, depth
ACCEPTANCE_RULES = ("exact", "typical")
DRAFT_VOCAB_DEFAULT = True  # drafts score the heads' reduced vocabulary unless the settings say not


@dataclass(frozen=True)
class SpeculativeSettings:
    """The resolved speculative settings of one engine, the same for every runtime.

    Both builds produce it, the manifest stores it (:meth:`to_json`), and the loaders and repository
    writers read it (:meth:`from_json`). Only the fields the method uses are set.

    Attributes:
        method: the method.
        max_draft_len: draft tokens verified per step (tokens; 0 for ``none``).
        flavour: the draft checkpoint's flavour (``eagle1``, ``eagle3``, ``medusa``, ``causal-lm``) if known.
        tree: the token tree (EAGLE/Medusa; the LLM API's EAGLE-3 chain has none).
        num_eagle_layers: EAGLE levels drafted per step (the tree's depth).
        max_non_leaves_per_layer: TensorRT-LLM's EAGLE limit of expanded nodes per level.
        num_medusa_heads, num_medusa_layers: Medusa heads and residual layers per head.
        lookahead: (window W, n-gram N, verification set G).
        max_matching_ngram_size: n-gram lookup's longest match (tokens).
        dynamic_tree: EAGLE-2's dynamic tree instead of ``tree`` (CPU runtime), with ``dynamic_top_k``
            candidates per expansion and ``dynamic_depth`` levels.
        acceptance: ``exact`` (keeps the target's distribution) or ``typical`` (Medusa's, opt-in; CPU).
        draft_vocab: drafts score the heads' reduced vocabulary (CPU runtime).
    """

    method: Method
    max_draft_len: int = 0
    flavour: str | None = None
    tree: Tree | None = None
    num_eagle_layers: int | None = None
    max_non_leaves_per_layer: int | None = None
    num_medusa_heads: int | None = None
    num_medusa_layers: int | None = None
    lookahead: tuple[int, int, int] | None = None
    max_matching_ngram_size: int | None = None
    dynamic_tree: bool | None = None
    dynamic_top_k: int | None = None
    dynamic_depth: int | None = None
    acceptance: str | None = None
    draft_vocab: bool | None = None

    @property
    def spec(self) -> MethodSpec:
        return METHODS[self.method]

    def with_(self, **changes: Any) -> "SpeculativeSettings":
        """A copy with ``changes`` applied."""
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``speculative`` block: set fields only, the tree as ``choices`` (a list of paths)."""
        data: dict[str, Any] = {"method": self.method.value, "max_draft_len": self.max_draft_len}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("method", "max_draft_len") or value is None:
                continue
            if f.name == "tree":
                data["choices"] = value.to_list()
                data["tree_depth"], data["tree_nodes"] = value.depth, value.nodes
            elif f.name == "lookahead":
                data["lookahead"] = list(value)
            else:
                data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "manifest") -> "SpeculativeSettings":
        """Read a manifest's ``speculative`` block.

        Raises:
            ManifestError: an unknown method or key, or a value of the wrong type; the message says to rebuild.
        """
        known = {f.name for f in fields(cls)} - {"tree"}
        try:
            values = dict(data)
            method = Method(values.pop("method"))
            choices = values.pop("choices", None)
            values.pop("tree_depth", None), values.pop("tree_nodes", None)
            unknown = set(values) - known
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
            if values.get("lookahead") is not None:
                values["lookahead"] = tuple(int(v) for v in values["lookahead"])
            max_draft_len = int(values.pop("max_draft_len", 0))
            if max_draft_len < 0:
                raise ValueError(f"max_draft_len {max_draft_len} < 0")
            tree = Tree.parse(choices, what=f"{where} choices") if choices is not None else None
            return cls(method=method, max_draft_len=max_draft_len, tree=tree, **values)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(
                f"{where}: speculative settings are not valid ({exc}): rebuild the engine with 'specpipe build --force'"
            ) from exc
