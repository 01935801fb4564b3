"""The LLM API (PyTorch backend) option names specpipe writes, as data, for the pinned 1.2 release.

Source: NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``, the 1.2-era copy read in the code
index (its commit is not shown there; it is the version between the 1.2.0 release candidates and 1.3:
speculative configs form a pydantic union discriminated on ``decoding_type``, ``Eagle3DecodingConfig``
exists, and ``MTPDecodingConfig`` warns that a flag "will do nothing in release 1.3"). The
tensorrtllm_backend history dates that window: submodule ``a65b0d4e`` for 1.2.0rc7 (2026-01-08),
``release/1.2@36e34eef`` (2026-03-17; the Dockerfile builds ``release/1.2`` = 1.2.0rc8 up to 98bfe1d,
the parent of 8addf2f), ``release/1.2.1`` first in its Dockerfile @ 8addf2fdc58a (2026-04-21).

What that file defines, and specpipe relies on:

- ``decoding_type`` literals: ``Eagle3`` (EAGLE-3; ``Eagle`` is accepted on PyTorch but converted to
  ``Eagle3`` with a warning), ``NGram``, ``Draft_Target`` (the literal; an older from-dict mapping
  spelled it ``DraftTarget``, and the discriminated union of this release does not list that
  spelling), ``MTP`` (no specpipe method uses it), plus ``Medusa`` and ``Lookahead`` which refuse the
  PyTorch backend.
- Common speculative fields: ``max_draft_len`` and ``speculative_model`` (validation aliases
  ``speculative_model`` / ``speculative_model_dir``). EAGLE: ``eagle_choices``,
  ``eagle3_one_model`` (default true). NGram: ``max_matching_ngram_size`` (default 2),
  ``is_keep_all``, ``is_use_oldest``, ``is_public_pool``. DraftTarget needs ``speculative_model``.
- Top-level ``LLM`` arguments used here: ``model``, ``backend``, ``tensor_parallel_size``,
  ``pipeline_parallel_size``, ``max_batch_size``, ``max_seq_len``, ``kv_cache_config``
  (``free_gpu_memory_fraction``, ``enable_block_reuse``), ``disable_overlap_scheduler``. All configs
  are strict (unknown keys are errors: ``extra="forbid"``).

Which specpipe method uses which ``decoding_type`` is the registry's
(:attr:`specpipe.speculative.MethodSpec.decoding_type`); the release pin is :mod:`specpipe.trtllm.release`.

Two-model speculation (draft-target, EAGLE-3 two-model) needs ``disable_overlap_scheduler: true``
(TensorRT-LLM ``docs/source/features/speculative-decoding.md``, draft/target example).

Spellings differ by release (:data:`SPELLINGS`, one sourced row per release); the one builder of
``speculative_config`` is :func:`build_speculative_config`, and the pinned release picks its row. The
first-contact check (:mod:`specpipe.trtllm.first_contact`) validates the written config against the
container's own argument classes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from specpipe.errors import SpecpipeError
from specpipe.speculative import METHODS, NGRAM_MATCH_DEFAULT, Method, SpeculativeSettings, entry_for
from specpipe.trtllm.release import CONTAINER_IMAGE, TRTLLM_VERSION

SOURCE = {
    "repo": "NVIDIA/TensorRT-LLM",
    "path": "tensorrt_llm/llmapi/llm_args.py",
    "release": "1.2.x",
    "identified_by": "Eagle3DecodingConfig Literal['Eagle3']; DraftTargetDecodingConfig Literal['Draft_Target']",
}

#: ``decoding_type`` -> every key its config class accepts (the common ones included).
_COMMON = {
    "decoding_type",
    "max_draft_len",
    "max_total_draft_tokens",
    "speculative_model",
    "speculative_model_dir",
    "max_concurrency",
    "draft_len_schedule",
    "load_format",
    "acceptance_window",
    "acceptance_length_threshold",
    "allow_advanced_sampling",
}
ACCEPTED_KEYS: dict[str, frozenset[str]] = {
    "Eagle3": frozenset(
        _COMMON
        | {
            "eagle_choices",
            "greedy_sampling",
            "posterior_threshold",
            "use_dynamic_tree",
            "dynamic_tree_max_topK",
            "num_eagle_layers",
            "max_non_leaves_per_layer",
            "eagle3_one_model",
            "eagle3_layers_to_capture",
            "eagle3_model_arch",
        }
    ),
    "NGram": frozenset(_COMMON | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}),
    "Draft_Target": frozenset(_COMMON),
}

#: Methods whose config needs a draft checkpoint in ``speculative_model``.
NEEDS_MODEL = frozenset({"Eagle3", "Draft_Target"})

#: Top-level keys specpipe writes into ``model.yaml`` / the ``trtllm-serve`` options file (all are
#: ``TorchLlmArgs`` fields in the source above; ``triton_config`` is read by the Triton model only).
TOP_LEVEL_KEYS = frozenset(
    {
        "model",
        "backend",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_batch_size",
        "max_seq_len",
        "kv_cache_config",
        "speculative_config",
        "disable_overlap_scheduler",
    }
)
KV_CACHE_KEYS = frozenset({"free_gpu_memory_fraction", "enable_block_reuse", "max_tokens", "dtype"})


# --- spellings by TensorRT-LLM release ------------------------------------------------------------------


@dataclass(frozen=True)
class Spelling:
    """How one TensorRT-LLM release spells the LLM API's ``speculative_config``.

    Attributes:
        decoding_types: method -> ``decoding_type`` literal.
        model_key: the key naming the draft checkpoint.
        source: where the row was read.
    """

    decoding_types: dict[Method, str]
    model_key: str
    source: str


#: The pinned release's ``decoding_type`` of each method: the registry's (``MethodSpec.decoding_type``).
PINNED_DECODING_TYPES = {method: spec.decoding_type for method, spec in METHODS.items() if spec.decoding_type}
#: The releases before 1.2 spell ``Eagle`` and ``DraftTarget``.
_BEFORE_1_2 = {Method.EAGLE: "Eagle", Method.NGRAM: "NGram", Method.DRAFT_MODEL: "DraftTarget"}

#: ``major.minor`` -> its spellings. A release missing here uses the nearest older row.
SPELLINGS: dict[str, Spelling] = {
    "1.0": Spelling(
        _BEFORE_1_2,
        "speculative_model_dir",
        "TensorRT-LLM docs/source/features/speculative-decoding.md @ 35dac55 (1.0: 'Eagle' is EAGLE-3, "
        "DraftTarget, speculative_model_dir; no Eagle3 literal)",
    ),
    "1.1": Spelling(
        _BEFORE_1_2,
        "speculative_model_dir",
        "as 1.0 (issue 13: 1.0/1.1 sources spell DraftTarget, speculative_model_dir, no Eagle3); "
        "confirmed on a container by the first-contact check",
    ),
    "1.2": Spelling(
        PINNED_DECODING_TYPES,
        "speculative_model",
        "tensorrt_llm/llmapi/llm_args.py, 1.2-era copy (see module docstring): Eagle3DecodingConfig, "
        "DraftTargetDecodingConfig Literal['Draft_Target'], speculative_model (alias speculative_model_dir)",
    ),
}


def spelling_for(version: str) -> Spelling:
    """The row of :data:`SPELLINGS` for TensorRT-LLM ``version`` (``1.2.1`` -> ``1.2``; newer -> newest).

    Raises:
        SpecpipeError: a release older than every row.
    """
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    rows = sorted((tuple(int(p) for p in key.split(".")), key) for key in SPELLINGS)
    older = [key for nums, key in rows if nums <= parts]
    if not older:
        raise SpecpipeError(
            f"TensorRT-LLM {version} predates the LLM API spellings specpipe knows "
            f"({rows[0][1]} and newer): use {CONTAINER_IMAGE}"
        )
    return SPELLINGS[older[-1]]


def _eagle_keys(settings: SpeculativeSettings) -> dict[str, Any]:
    return {
        "eagle3_one_model": True,
        **({"eagle_choices": settings.tree.to_list()} if settings.tree is not None else {}),
    }


def _ngram_keys(settings: SpeculativeSettings) -> dict[str, Any]:
    return {
        "max_matching_ngram_size": int(settings.max_matching_ngram_size or NGRAM_MATCH_DEFAULT),
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }


#: The method's own ``speculative_config`` keys (besides ``decoding_type``, ``max_draft_len`` and the
#: draft model), for every method the LLM API runs.
METHOD_KEYS: dict[Method, Callable[[SpeculativeSettings], dict[str, Any]]] = {
    Method.EAGLE: _eagle_keys,
    Method.NGRAM: _ngram_keys,
    Method.DRAFT_MODEL: lambda settings: {},
}


def build_speculative_config(
    settings: SpeculativeSettings, draft_path: str | None, version: str = TRTLLM_VERSION
) -> dict[str, Any] | None:
    """THE ``speculative_config`` mapping (``None`` without speculation), spelled for ``version``.

    Used by the plan (:func:`specpipe.trtllm.plan.llmapi_settings`) and the repository writer
    (:func:`specpipe.triton.llmapi.speculative_config`). ``draft_path``: the draft checkpoint as the
    server sees it (needed by methods with weights).

    Raises:
        SpecpipeError: a method without an LLM API spelling in that release, or a key the pinned
            release's config class does not accept (a defect).
    """
    if settings.method is Method.NONE:
        return None
    row = spelling_for(version)
    decoding_type = row.decoding_types.get(settings.method)
    if decoding_type is None:
        raise SpecpipeError(
            f"{settings.method.value} has no LLM API decoding_type in TensorRT-LLM {version}: "
            f"build with --runtime trtllm for the engine flow"
        )
    config: dict[str, Any] = {"decoding_type": decoding_type, "max_draft_len": settings.max_draft_len}
    if settings.spec.weights is not None and draft_path is not None:
        config[row.model_key] = draft_path
    config.update(entry_for(METHOD_KEYS, settings.method, "trtllm.llmapi_schema.METHOD_KEYS")(settings))
    accepted = ACCEPTED_KEYS.get(decoding_type)
    if accepted is not None:
        unknown = set(config) - accepted
        if unknown:
            raise SpecpipeError(
                f"speculative_config keys {sorted(unknown)} are not {decoding_type} options in "
                f"TensorRT-LLM {version}: report this as a bug"
            )
    return config
