"""The model-config parameters TensorRT-LLM's Triton C++ backend (``backend: "tensorrtllm"``) reads, as data.

Every key below is read by name in the backend's sources, with the C++ type it is parsed as
(``std::stoi``/``std::stof``/``True|true|TRUE|1``/``False|false|FALSE|0`` for ``bool``):

- ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` and ``model_state.cc`` in
  NVIDIA/TensorRT-LLM @ 0c8de69a1ca6213eebb20a51873890ff128666c2 (the ``tensorrtllm`` backend shipped
  with the 1.2 line; the same key set as triton-inference-server/tensorrtllm_backend
  ``inflight_batcher_llm/src/*.cc`` @ c2e65b8, the last copy kept in that repository).

Facts the writer relies on (same sources):

- A parameter that is missing, or whose text does not parse as its type, is ignored with a warning
  and the default applies, except the three ``required`` keys: ``tokenizer_dir``,
  ``xgrammar_tokenizer_info_path`` and ``guided_decoding_backend`` are read without a fallback when
  the executor config is made, so a config without them fails to load. An empty value means "unset"
  for those three (no guided decoding).
- ``worker_path`` is refused (replaced by ``executor_worker_path``); it is not listed.
- ``eagle_choices`` / ``medusa_choices`` are parsed by ``utils::csvStrToVecVecInt``: groups ``{a, b}``
  separated by commas, no outer braces (see :meth:`specpipe.tree.Tree.to_backend_text`).
- ``decoding_mode`` accepts exactly :data:`DECODING_MODES`; anything else falls back to
  ``top_k_top_p`` (beam width 1) with a warning. Draft-target has no mode of its own.
- ``decoding_mode`` ``lookahead`` throws at load unless all three ``lookahead_*`` keys are set.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = {
    "repo": "NVIDIA/TensorRT-LLM",
    "commit": "0c8de69a1ca6213eebb20a51873890ff128666c2",
    "paths": [
        "triton_backend/inflight_batcher_llm/src/model_instance_state.cc",
        "triton_backend/inflight_batcher_llm/src/model_state.cc",
    ],
    "release": "1.2.x",
}


@dataclass(frozen=True)
class BackendParameter:
    """One parameter: ``kind`` is the C++ type it is parsed as; ``default`` what applies when unset
    (``None``: no default, the feature is off or the value comes from the engine); ``required``: the
    model fails to load without the key."""

    key: str
    kind: str
    default: str | None
    meaning: str
    required: bool = False


_P = BackendParameter

PARAMETERS: dict[str, BackendParameter] = {
    p.key: p
    for p in (
        _P(
            "gpt_model_type",
            "string",
            None,
            "batching: V1 | inflight_batching | inflight_fused_batching (else load fails)",
        ),
        _P("gpt_model_path", "string", None, "decoder engine directory (must exist)"),
        _P("encoder_model_path", "string", None, "encoder engine directory (encoder-decoder models)"),
        _P("max_beam_width", "int32", "1", "beams per request at most"),
        _P("max_tokens_in_paged_kv_cache", "int32", None, "KV-cache pool size, tokens"),
        _P(
            "kv_cache_free_gpu_mem_fraction",
            "float",
            "0.9",
            "fraction of free GPU memory (after loading) for the KV-cache pool",
        ),
        _P("cross_kv_cache_fraction", "float", None, "share of the pool for cross attention (encoder-decoder)"),
        _P("kv_cache_host_memory_bytes", "size_t", "0", "host memory for offloaded KV blocks, bytes"),
        _P("kv_cache_onboard_blocks", "bool", "true", "bring offloaded blocks back to GPU"),
        _P("max_attention_window_size", "int32 list", None, "attention window per layer, tokens"),
        _P("sink_token_length", "int32", None, "tokens always kept in the attention window"),
        _P("enable_kv_cache_reuse", "bool", "true", "reuse KV blocks of shared prefixes"),
        _P("multi_block_mode", "bool", "true", "split long-context attention over blocks"),
        _P("enable_context_fmha_fp32_acc", "bool", "false", "FP32 accumulation in context attention"),
        _P("cuda_graph_mode", "bool", "false", "CUDA graphs for generation steps"),
        _P("cuda_graph_cache_size", "int32", "0", "CUDA graphs kept"),
        _P("num_nodes", "int32", "1", "nodes the engine spans"),
        _P("gpu_device_ids", "string", None, "GPU ids per instance: '0,1;2,3'"),
        _P("participant_ids", "string", None, "MPI ranks per instance (orchestrator mode without spawning)"),
        _P(
            "executor_worker_path",
            "string",
            "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
            "worker executable (orchestrator mode)",
        ),
        _P("lora_cache_max_adapter_size", "int32", "64", "LoRA: largest adapter rank"),
        _P("lora_cache_optimal_adapter_size", "int32", "8", "LoRA: page width"),
        _P("lora_cache_gpu_memory_fraction", "float", "0.05", "LoRA: GPU cache fraction"),
        _P("lora_cache_host_memory_bytes", "size_t", "1073741824", "LoRA: host cache, bytes"),
        _P("lora_prefetch_dir", "string", None, "LoRA: adapters loaded at start"),
        _P("batch_scheduler_policy", "string", "guaranteed_no_evict", "max_utilization | guaranteed_no_evict"),
        _P(
            "speculative_decoding_fast_logits",
            "bool",
            "false",
            "draft logits passed in device memory (orchestrator mode, no spawning)",
        ),
        _P("tokenizer_dir", "string", None, "tokenizer directory (read at load; empty = unset)", required=True),
        _P(
            "xgrammar_tokenizer_info_path",
            "string",
            None,
            "xgrammar tokenizer info JSON (empty = no guided decoding)",
            required=True,
        ),
        _P("guided_decoding_backend", "string", None, "'xgrammar' or empty (no guided decoding)", required=True),
        _P("iter_stats_max_iterations", "int32", "1000", "iterations of statistics kept"),
        _P("request_stats_max_iterations", "int32", "0", "iterations of per-request statistics kept"),
        _P("enable_trt_overlap", "bool", "false", "overlap two micro-batches (experimental)"),
        _P("normalize_log_probs", "bool", "true", "normalize returned log-probabilities"),
        _P("enable_chunked_context", "bool", "false", "split long prompts into chunks (needs paged context FMHA)"),
        _P("decoding_mode", "string", None, "see DECODING_MODES; unset/other = top_k_top_p"),
        _P("medusa_choices", "choices", None, "Medusa tree, '{0}, {0, 0}, {1}' (unset = mc_sim_7b_63)"),
        _P("eagle_choices", "choices", None, "EAGLE tree, '{0}, {0, 0}, {1}' (unset = mc_sim_7b_63)"),
        _P("lookahead_window_size", "uint32", None, "lookahead W (required with decoding_mode lookahead)"),
        _P("lookahead_ngram_size", "uint32", None, "lookahead N (required with decoding_mode lookahead)"),
        _P("lookahead_verification_set_size", "uint32", None, "lookahead G (required with decoding_mode lookahead)"),
        _P("gpu_weights_percent", "float", "1.0", "share of weights kept on the GPU (weight streaming)"),
        _P("recv_poll_period_ms", "int", "0", "response polling period, ms (0 = busy loop)"),
        _P("exclude_input_in_output", "bool", "false", "default for requests that do not set it"),
        _P("cancellation_check_period_ms", "int", "100", "how often cancellations are checked, ms"),
        _P("stats_check_period_ms", "int", "100", "how often statistics are collected, ms"),
    )
}

#: Values of ``decoding_mode`` the backend maps to an executor decoding mode.
DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")

REQUIRED = tuple(k for k, p in PARAMETERS.items() if p.required)

_BOOL = {"True", "true", "TRUE", "1", "False", "false", "FALSE", "0"}


def value_problems(parameters: dict[str, str]) -> list[str]:
    """Everything the backend would ignore, misread or refuse in ``parameters`` (key -> text).

    Checks: keys the backend does not read, missing required keys, and values that do not parse as
    the key's type (the backend would silently fall back to its default).
    """
    problems = [f"'{k}' is not a parameter the tensorrtllm backend reads" for k in parameters if k not in PARAMETERS]
    problems += [f"required parameter '{k}' is missing" for k in REQUIRED if k not in parameters]
    for key, text in parameters.items():
        spec = PARAMETERS.get(key)
        if spec is None or text == "" and spec.kind == "string":
            continue
        if spec.kind == "bool" and text not in _BOOL:
            problems.append(f"'{key}' = {text!r} is not a boolean the backend accepts")
        elif spec.kind in ("int", "int32", "uint32", "size_t") and not text.strip().isdigit():
            problems.append(f"'{key}' = {text!r} is not a non-negative integer")
        elif spec.kind == "float":
            try:
                float(text)
            except ValueError:
                problems.append(f"'{key}' = {text!r} is not a number")
        elif key == "decoding_mode" and text not in DECODING_MODES:
            problems.append(f"'decoding_mode' = {text!r} is not one of {', '.join(DECODING_MODES)}")
        elif key == "gpt_model_type" and text not in ("V1", "v1", "inflight_batching", "inflight_fused_batching"):
            problems.append(f"'gpt_model_type' = {text!r} is not V1, inflight_batching or inflight_fused_batching")
        elif key == "batch_scheduler_policy" and text not in ("max_utilization", "guaranteed_no_evict"):
            problems.append(f"'batch_scheduler_policy' = {text!r} is not max_utilization or guaranteed_no_evict")
    if parameters.get("decoding_mode") == "lookahead":
        problems += [
            f"decoding_mode lookahead needs '{k}'"
            for k in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
            if k not in parameters
        ]
    return problems
