"""Reading a server's Prometheus metrics: memory in use, and speculative-decoding counters.

Memory comes from Triton's metrics endpoint: ``nv_gpu_memory_used_bytes`` (one sample per GPU,
summed) when the server reports GPUs, else ``nv_cpu_memory_used_bytes`` (memory in use on the
server's machine, as Triton reports it). Both are in bytes.

Counters, for OpenAI-compatible servers whose responses carry no draft counters (the difference of
two scrapes, one before and one after a load level):

- specpipe's OpenAI gateway: ``specpipe_draft_tokens_total``, ``specpipe_accepted_draft_tokens_total``,
  ``specpipe_output_tokens_total``, ``specpipe_requests_total`` (label ``model``; see
  :mod:`specpipe.openai.metrics`);
- vLLM: ``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total``.
"""

from __future__ import annotations

from collections import defaultdict

#: Counter names per exporter: (draft tokens, accepted draft tokens, output tokens, requests).
COUNTER_SETS = {
    "specpipe": ("specpipe_draft_tokens_total", "specpipe_accepted_draft_tokens_total",
                 "specpipe_output_tokens_total", "specpipe_requests_total"),
    "vllm": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
             "vllm:generation_tokens_total", "vllm:request_success_total"),
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


def _total(samples: Samples, name: str, model: str | None) -> float | None:
    found = samples.get(name)
    if not found:
        return None
    matching = [value for labels, value in found if model is None or labels.get("model", labels.get("model_name", model)) == model]
    return sum(matching) if matching else None


def spec_counters(samples: Samples, model: str | None = None) -> dict[str, float | str] | None:
    """The first known counter set present: ``{"source", "draft_tokens", "accepted_draft_tokens",
    "output_tokens", "requests"}`` (values are running totals; the last two may be ``None``).

    Args:
        model: keep only samples labelled with this ``model`` (or ``model_name``), when labelled.
    """
    for source, (draft, accepted, output, requests) in COUNTER_SETS.items():
        d, a = _total(samples, draft, model), _total(samples, accepted, model)
        if d is not None and a is not None:
            return {"source": source, "draft_tokens": d, "accepted_draft_tokens": a,
                    "output_tokens": _total(samples, output, model), "requests": _total(samples, requests, model)}
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
