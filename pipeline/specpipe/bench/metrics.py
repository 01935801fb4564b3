"""Reading a server's Prometheus metrics: memory in use, and speculative-decoding counters.

Memory comes from Triton's metrics endpoint: ``nv_gpu_memory_used_bytes`` (one sample per GPU,
summed) when the server reports GPUs, else ``nv_cpu_memory_used_bytes`` (memory in use on the
server's machine, as Triton reports it). Both are in bytes.

Counters, for servers whose responses carry no draft counters (the difference of two scrapes, one
before and one after a load level), the first family found:

- vLLM (``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingProm`` @ vllm-project/vllm
  ee4ceaae5953d367d8edd2132fd86d6c42506e1e): counters ``vllm:spec_decode_num_drafts``,
  ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens`` and
  ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``, 0-based), exposed with the
  ``_total`` suffix Prometheus gives counters; output tokens ``vllm:generation_tokens``, requests
  ``vllm:request_success``;
- specpipe's OpenAI gateway: ``specpipe_draft_tokens_total``, ``specpipe_accepted_draft_tokens_total``,
  ``specpipe_output_tokens_total``, ``specpipe_requests_total`` (label ``model``; see
  :mod:`specpipe.openai.metrics`), read before its ``specpipe:`` series because only these count
  requests (which the mean accepted length needs);
- specpipe's CPU Triton model: vLLM's base names under the prefix ``specpipe:``
  (``specpipe:spec_decode_num_draft_tokens_total`` ..., label ``model_name``;
  :mod:`specpipe.generation.spec_metrics`), with drafts and per-position counts.

Every name is looked up with and without ``_total`` (exporters and parsers differ on the suffix).
TensorRT-LLM's Triton backend exports no draft counters: its ``nv_trt_llm_*`` families are request,
runtime-memory, KV-cache, batcher and general gauges (``inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc`` @ triton-inference-server/tensorrtllm_backend
27e4bfbd3acb05b9b41417d5256553592a31b505); its acceptance comes from the per-request perf outputs.
The per-position acceptance of draft position k is accepted tokens at k / draft proposals (vLLM's
definition); it is reported only where the server counts both.
"""

from __future__ import annotations

from collections import defaultdict

#: Counter names per exporter: (draft tokens, accepted draft tokens, output tokens, requests, draft
#: proposals, accepted tokens per position), ``None`` where the exporter has no such counter.
COUNTER_SETS = {
    "vllm": (
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    ),
    "specpipe": (
        "specpipe_draft_tokens",
        "specpipe_accepted_draft_tokens",
        "specpipe_output_tokens",
        "specpipe_requests",
        None,
        None,
    ),
    "specpipe-triton": (
        "specpipe:spec_decode_num_draft_tokens",
        "specpipe:spec_decode_num_accepted_tokens",
        "specpipe:generation_tokens",
        "specpipe:request_success",
        "specpipe:spec_decode_num_drafts",
        "specpipe:spec_decode_num_accepted_tokens_per_pos",
    ),
}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by sample name: ``[(labels, value), ...]``.

    Raises:
        ValueError: the text is not in the Prometheus text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return dict(samples)


def memory_used(samples: Samples) -> tuple[float, str] | None:
    """(bytes in use, ``"gpu"`` or ``"cpu"``) from Triton's metrics, or ``None`` when neither is there.

    A total of 0 counts as absent: Triton reports 0 until its first metrics poll after start-up.
    """
    for name, kind in (("nv_gpu_memory_used_bytes", "gpu"), ("nv_cpu_memory_used_bytes", "cpu")):
        total = sum(value for _, value in samples.get(name, []))
        if total > 0:
            return total, kind
    return None


def _matching(samples: Samples, name: str | None, model: str | None) -> list[tuple[dict[str, str], float]]:
    """The samples of counter ``name``, with or without ``_total``, labelled ``model`` (when labelled)."""
    if name is None:
        return []
    base = name.removesuffix("_total")
    found = samples.get(base + "_total") or samples.get(base) or []
    return [
        (labels, value)
        for labels, value in found
        if model is None or labels.get("model", labels.get("model_name", model)) == model
    ]


def _total(samples: Samples, name: str | None, model: str | None) -> float | None:
    matching = _matching(samples, name, model)
    return sum(value for _, value in matching) if matching else None


def _per_position(samples: Samples, name: str | None, model: str | None) -> dict[int, float]:
    positions: dict[int, float] = {}
    for labels, value in _matching(samples, name, model):
        if str(labels.get("position", "")).isdigit():
            k = int(labels["position"])
            positions[k] = positions.get(k, 0.0) + value
    return positions


def spec_counters(samples: Samples, model: str | None = None) -> dict | None:
    """The first known counter set present (module doc): ``{"source", "draft_tokens",
    "accepted_draft_tokens", "output_tokens", "requests", "drafts", "accepted_per_position"}``; values
    are running totals (``None`` where the exporter lacks the counter), ``accepted_per_position`` maps a
    0-based draft position to its accepted tokens (empty without that counter).

    Args:
        model: keep only samples labelled with this ``model`` (or ``model_name``), when labelled.
    """
    for source, (draft, accepted, output, requests, drafts, per_position) in COUNTER_SETS.items():
        d, a = _total(samples, draft, model), _total(samples, accepted, model)
        if d is not None and a is not None:
            return {
                "source": source,
                "draft_tokens": d,
                "accepted_draft_tokens": a,
                "output_tokens": _total(samples, output, model),
                "requests": _total(samples, requests, model),
                "drafts": _total(samples, drafts, model),
                "accepted_per_position": _per_position(samples, per_position, model),
            }
    return None


async def scrape(session, url: str, timeout_s: float = 5.0) -> Samples | None:
    """GET ``url`` with an ``aiohttp`` session and parse it; ``None`` on any failure (metrics are optional)."""
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status != 200:
                return None
            return parse_samples(await reply.text())
    except Exception:  # unreachable, timed out, not Prometheus text: the figure is left out
        return None
