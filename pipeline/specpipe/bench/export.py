"""Per-request records in perf_analyzer's profile export format, the file GenAI-Perf computes its metrics from.

One ``profile_export-<deployment>.json`` per deployment, shaped as perf_analyzer writes it with
``--profile-export-file`` and as GenAI-Perf's ``LLMProfileDataParser`` reads it (schema: the profile
data of ``genai-perf/tests/test_process_export_files.py`` and ``genai-perf/docs/files.md``,
``genai-perf`` @ triton-inference-server/perf_analyzer 7c6ae56568e154ceb4c7b708fd799592d12ec68e)::

    {"version": ..., "service_kind": "triton", "endpoint": ADDRESS,
     "experiments": [{"experiment": {"mode": "concurrency" | "request_rate", "value": N},
                      "requests": [{"timestamp": NS,
                                    "request_inputs": {"text_input": PROMPT, "max_tokens": N, "stream": true},
                                    "response_timestamps": [NS, ...],
                                    "response_outputs": [{"text_output": TEXT}, ...]}]}]}

Timestamps are integer nanoseconds since the Unix epoch: a request's ``timestamp`` is when it was
sent, each response timestamp when that streamed response arrived; when the final response carried
no text (the end-of-stream response), it is added with an empty ``text_output`` at the request's end,
so that the last timestamp minus ``timestamp`` is the request latency. GenAI-Perf derives TTFT (first
response - timestamp), ITL and output token counts (by tokenizing the ``text_output`` pieces) from
these, as it does for a Triton ``text_output`` stream. Only completed requests are exported. Every
deployment is written as ``service_kind`` ``triton`` with ``text_output`` pieces, since the records
keep the streamed text rather than each server's wire format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specpipe.bench.records import LevelResult, RequestRecord


def _request(record: RequestRecord, origin_ns: int, prompt: str, max_tokens: int) -> dict[str, Any]:
    sent = origin_ns + round(record.start_s * 1e9)
    times = [sent + round(t * 1e9) for t in record.chunk_times_s]
    outputs = [{"text_output": text} for text in record.chunk_texts]
    end = sent + round(record.latency_s * 1e9)
    if not times or end > times[-1]:
        times.append(end)
        outputs.append({"text_output": ""})
    return {
        "timestamp": sent,
        "request_inputs": {"text_input": prompt, "max_tokens": max_tokens, "stream": True},
        "response_timestamps": times,
        "response_outputs": outputs,
    }


def experiment(level: LevelResult, prompts: dict[str, str], max_tokens: int) -> dict[str, Any]:
    """One level as an experiment: ``mode`` ``request_rate`` (value: requests/s) or ``concurrency``."""
    mode = (
        ("request_rate", level.request_rate) if level.request_rate is not None else ("concurrency", level.concurrency)
    )
    origin = level.origin_unix_ns or 0
    return {
        "experiment": {"mode": mode[0], "value": mode[1]},
        "requests": [_request(r, origin, prompts.get(r.prompt_id, ""), max_tokens) for r in level.records if r.ok],
    }


def profile_export(run, deployment: dict[str, Any]) -> dict[str, Any]:
    """The profile export of one deployment of ``run`` (a :class:`~specpipe.bench.runner.BenchRun`)."""
    from specpipe import __version__

    levels = [level for level in run.levels if level.deployment == deployment["name"]]
    return {
        "version": f"specpipe {__version__}",
        "service_kind": "triton",
        "endpoint": deployment.get("address", ""),
        "experiments": [experiment(level, run.prompts, run.settings.max_tokens) for level in levels],
    }


def write_profile_exports(run, out_dir: Path) -> list[Path]:
    """Write ``profile_export-<deployment>.json`` for every deployment that has levels; returns the paths."""
    paths = []
    for deployment in run.deployments:
        if not any(level.deployment == deployment["name"] for level in run.levels):
            continue
        path = Path(out_dir) / f"profile_export-{deployment['name']}.json"
        path.write_text(json.dumps(profile_export(run, deployment), ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
