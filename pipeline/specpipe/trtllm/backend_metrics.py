"""What a TensorRT-LLM deployment's Triton exports on its metrics port (8002) without specpipe's CPU
model: the series the Grafana dashboard (docker/grafana/) may read there, and how they stand in for
the CPU model's (docs/metrics.md).

TensorRT-LLM's Triton backend (``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc`` in NVIDIA/TensorRT-LLM @ 0d5352f5) exports gauges, labels ``model``,
``version`` and one category label each: ``nv_trt_llm_request_metrics`` (``request_type``: ``active``,
``max``, ``scheduled``, ``context``, ``waiting``), ``nv_trt_llm_runtime_memory_metrics``
(``memory_type``), ``nv_trt_llm_kv_cache_block_metrics`` (``kv_cache_block_type``: ``max``, ``free``,
``used``, ``tokens_per``, ``reused``, ``fraction``), ``nv_trt_llm_inflight_batcher_metrics``
(``inflight_batcher_specific_metric``: ``total_context_tokens``, ``generation_requests``,
``micro_batch_id``, ``paused_requests``), ``nv_trt_llm_general_metrics`` (``general_type``:
``timestamp``, ``iteration_counter``); the counter ``nv_trt_llm_disaggregated_serving_metrics``; and
the histograms ``nv_llm_output_token_len`` / ``nv_llm_input_token_len`` (buckets 10 .. 1000 tokens).
None is speculative: a request's ``acceptance_rate``, ``total_draft_tokens`` and
``total_accepted_draft_tokens`` come back only as its perf outputs (``return_perf_metrics``), which
the gateway counts (:mod:`specpipe.openai.metrics`). Triton core's per-model series (label ``model``,
``version``; ``docs/user_guide/metrics.md`` in triton-inference-server/server @ dcc9123c) are in
:data:`TRITON_CORE_SERIES`.
"""

from __future__ import annotations

from specpipe.generation.spec_metrics import histogram_series

#: The TensorRT-LLM backend's series (module doc).
TRTLLM_BACKEND_SERIES = frozenset(
    {
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_runtime_memory_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_general_metrics",
        "nv_trt_llm_disaggregated_serving_metrics",
        *histogram_series("nv_llm_output_token_len"),
        *histogram_series("nv_llm_input_token_len"),
    }
)

#: Triton core's per-model counters and gauge (inference statistics; durations in microseconds).
TRITON_CORE_SERIES = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_pending_request_count",
    }
)
