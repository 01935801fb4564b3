"""The LLM API (PyTorch backend) option names specpipe writes, as data, for the pinned 1.2 release.

Source: NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``, the 1.2-era copy read in the code
index (its commit is not shown there; it is the version between the 1.2.0 release candidates and 1.3:
speculative configs form a pydantic union discriminated on ``decoding_type``, ``Eagle3DecodingConfig``
exists, and ``MTPDecodingConfig`` warns that a flag "will do nothing in release 1.3"). The
tensorrtllm_backend history dates that window: submodule ``a65b0d4e`` for 1.2.0rc7 (2026-01-08),
``release/1.2@36e34eef`` (2026-03-17; Dockerfile @ 9e828d3 builds ``release/1.2`` = 1.2.0rc8),
``release/1.2.1`` first in its Dockerfile @ 8addf2fdc58a (2026-04-21).

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
"""

from __future__ import annotations

SOURCE = {"repo": "NVIDIA/TensorRT-LLM", "path": "tensorrt_llm/llmapi/llm_args.py", "release": "1.2.x",
          "identified_by": "Eagle3DecodingConfig Literal['Eagle3']; DraftTargetDecodingConfig Literal['Draft_Target']"}

#: ``decoding_type`` -> every key its config class accepts (the common ones included).
_COMMON = {"decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "speculative_model_dir",
           "max_concurrency", "draft_len_schedule", "load_format", "acceptance_window",
           "acceptance_length_threshold", "allow_advanced_sampling"}
ACCEPTED_KEYS: dict[str, frozenset[str]] = {
    "Eagle3": frozenset(_COMMON | {"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
                                   "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
                                   "eagle3_one_model", "eagle3_layers_to_capture", "eagle3_model_arch"}),
    "NGram": frozenset(_COMMON | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}),
    "Draft_Target": frozenset(_COMMON),
}

#: Methods whose config needs a draft checkpoint in ``speculative_model``.
NEEDS_MODEL = frozenset({"Eagle3", "Draft_Target"})

#: Top-level keys specpipe writes into ``model.yaml`` / the ``trtllm-serve`` options file (all are
#: ``TorchLlmArgs`` fields in the source above; ``triton_config`` is read by the Triton model only).
TOP_LEVEL_KEYS = frozenset({"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size",
                            "max_seq_len", "kv_cache_config", "speculative_config", "disable_overlap_scheduler"})
KV_CACHE_KEYS = frozenset({"free_gpu_memory_fraction", "enable_block_reuse", "max_tokens", "dtype"})
