"""The gateway's Prometheus metrics: requests, tokens and speculative-decoding acceptance per deployment.

Exported on ``GET /metrics`` (Prometheus text format), every series labelled ``model`` (the
deployment's name):

- ``specpipe_requests_total``: completed requests (counter);
- ``specpipe_request_errors_total``: failed requests (counter);
- ``specpipe_output_tokens_total``, ``specpipe_input_tokens_total``: tokens (counters);
- ``specpipe_draft_tokens_total``, ``specpipe_accepted_draft_tokens_total``: draft tokens proposed
  and accepted (counters, from the ensemble's perf outputs);
- ``specpipe_acceptance_rate``: accepted / proposed draft tokens since start, in [0, 1] (gauge;
  absent until a draft token was proposed);
- ``specpipe_mean_accepted_length``: tokens per target decoding step after the first token, over
  requests since start (gauge; 1.0 without speculation): sum(F - 1 + A) / sum(F - 1) with F the target
  forwards and A the accepted drafts of each request, where the deployment returns F (the CPU runtime's
  ``target_forwards``: exact, requests ended by an end id or a stop word included); else estimated as
  sum(N - 1) / sum(N - 1 - A) from the N output tokens, which counts too few steps for a request whose
  end id or stop word was not sent.

The same counts under vLLM's names (:mod:`specpipe.generation.spec_metrics`, docs/metrics.md), label
``model_name`` (the deployment's name): ``specpipe:spec_decode_num_draft_tokens_total``,
``specpipe:spec_decode_num_accepted_tokens_total``, ``specpipe:generation_tokens_total`` and
``specpipe:prompt_tokens_total``. The gateway sees each request's totals only (the perf outputs
``total_draft_tokens`` / ``total_accepted_draft_tokens``, TensorRT-LLM's and the CPU model's), not its
steps: it has no drafts counter, no per-position counts and no latency histograms; on a TensorRT-LLM
deployment these are the only speculative series (its backend exports none: docs/metrics.md). All
count since the gateway started.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

from specpipe.generation import spec_metrics as names

#: The vLLM-named counters: exposition name -> the :class:`_Totals` field it reports.
VLLM_NAMED = {
    names.NUM_DRAFT_TOKENS: "draft_tokens",
    names.NUM_ACCEPTED_TOKENS: "accepted",
    names.GENERATION_TOKENS: "output_tokens",
    names.PROMPT_TOKENS: "input_tokens",
}
#: Every series name ``GET /metrics`` exposes.
EXPORTED_SERIES = frozenset(
    {
        "specpipe_requests_total",
        "specpipe_request_errors_total",
        "specpipe_output_tokens_total",
        "specpipe_input_tokens_total",
        "specpipe_draft_tokens_total",
        "specpipe_accepted_draft_tokens_total",
        "specpipe_acceptance_rate",
        "specpipe_mean_accepted_length",
        *VLLM_NAMED,
    }
)


@dataclass
class _Totals:
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    produced_after_first: int = 0
    steps: int = 0


class GatewayMetrics:
    """Running totals per model, exposed as a ``prometheus_client`` collector."""

    def __init__(self):
        self._totals: dict[str, _Totals] = defaultdict(_Totals)
        self._lock = threading.Lock()
        self._registry = None

    def record(self, model: str, perf: dict[str, float], error: bool = False) -> None:
        """Count one finished request with its perf outputs (token counts, draft counters)."""
        with self._lock:
            t = self._totals[model]
            if error:
                t.errors += 1
                return
            t.requests += 1
            out = int(perf.get("num_output_tokens", 0))
            accepted = int(perf.get("total_accepted_draft_tokens", 0))
            t.output_tokens += out
            t.input_tokens += int(perf.get("num_input_tokens", 0))
            t.draft_tokens += int(perf.get("total_draft_tokens", 0))
            t.accepted += accepted
            if "total_accepted_draft_tokens" not in perf:
                return
            if "target_forwards" in perf:
                decode_steps = int(perf["target_forwards"]) - 1
                t.produced_after_first += max(decode_steps, 0) + accepted
                t.steps += max(decode_steps, 0)
            elif out >= 2:
                t.produced_after_first += out - 1
                t.steps += out - 1 - accepted

    def acceptance(self, model: str) -> tuple[float | None, float | None]:
        """(acceptance rate, mean accepted length) of ``model`` so far; ``None`` when undefined."""
        with self._lock:
            t = self._totals.get(model) or _Totals()
            rate = t.accepted / t.draft_tokens if t.draft_tokens else None
            length = t.produced_after_first / t.steps if t.steps > 0 else None
        return rate, length

    def collect(self):
        """``prometheus_client`` collector protocol: the metric families described in the module doc."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families = {
            "requests": CounterMetricFamily("specpipe_requests", "Completed requests", labels=["model"]),
            "errors": CounterMetricFamily("specpipe_request_errors", "Failed requests", labels=["model"]),
            "output_tokens": CounterMetricFamily("specpipe_output_tokens", "Generated tokens", labels=["model"]),
            "input_tokens": CounterMetricFamily("specpipe_input_tokens", "Prompt tokens", labels=["model"]),
            "draft_tokens": CounterMetricFamily("specpipe_draft_tokens", "Draft tokens proposed", labels=["model"]),
            "accepted": CounterMetricFamily(
                "specpipe_accepted_draft_tokens", "Draft tokens accepted", labels=["model"]
            ),
        }
        rate = GaugeMetricFamily(
            "specpipe_acceptance_rate", "Accepted / proposed draft tokens since start", labels=["model"]
        )
        length = GaugeMetricFamily(
            "specpipe_mean_accepted_length",
            "Tokens per target decoding step after the first token, since start",
            labels=["model"],
        )
        with self._lock:
            snapshot = {model: _Totals(**vars(t)) for model, t in self._totals.items()}
        for model, t in sorted(snapshot.items()):
            for key, family in families.items():
                family.add_metric([model], getattr(t, key))
            if t.draft_tokens:
                rate.add_metric([model], t.accepted / t.draft_tokens)
            if t.steps > 0:
                length.add_metric([model], t.produced_after_first / t.steps)
        named = {
            name: CounterMetricFamily(
                name.removesuffix("_total"), f"{name} (vLLM: {names.VLLM_NAMES[name]})", labels=[names.MODEL_LABEL]
            )
            for name in VLLM_NAMED
        }
        for model, t in sorted(snapshot.items()):
            for name, family in named.items():
                family.add_metric([model], getattr(t, VLLM_NAMED[name]))
        yield from families.values()
        yield from named.values()
        yield rate
        yield length

    def render(self) -> bytes:
        """The Prometheus text exposition of these metrics."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self)
        return generate_latest(self._registry)
