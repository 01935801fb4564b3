"""The human-readable TensorRT-LLM build plan that dry runs print: settings, checks, steps, memory."""

from __future__ import annotations

import shlex
from typing import Any

from specpipe.trtllm import release
from specpipe.trtllm.gpus import GIB
from specpipe.trtllm.parallelism import n_gpus, render_parallel
from specpipe.trtllm.plan import Plan
from specpipe.trtllm.preflight import PreflightResult


def render_text(plan: Plan, docker_prefix: list[str] | None = None) -> str:
    """The human-readable plan: settings, checks, steps (exact command lines) and the memory table."""
    pre, req = plan.preflight, plan.request
    lines = [
        f"specpipe build plan: {plan.engine_name} ({plan.runtime}, TensorRT-LLM {release.TRTLLM_VERSION}, {release.CONTAINER_IMAGE})",
        f"  target   {plan.target.name}  [{_src(plan.target.source)}]",
        f"  draft    {plan.draft.name} ({plan.draft.method}{', ' + plan.draft.flavour if plan.draft.flavour else ''})"
        + (f"  [{_src(plan.draft.source)}]" if plan.draft.source else ""),
        f"  settings {pre.scheme.name}, {pre.parallel.sizes if pre.parallel else f'TP {req.tp} x PP {req.pp}'}"
        f"{'' if pre.parallel is None or pre.parallel.fits is not None else ', not fitted to a GPU'}"
        f", batch {req.max_batch_size}, input {req.max_input_len}, "
        f"seq {req.max_seq_len} tokens, "
        + ", ".join(f"{k}={v}" for k, v in pre.speculative.to_json().items() if k not in ("choices", "method")),
        f"  executor {plan.executor}"
        + (f" (each TensorRT-LLM step runs as: {shlex.join(docker_prefix)} ...)" if docker_prefix else ""),
        f"  output   {plan.engine_dir}",
        "",
        "checks:",
    ]
    lines += [f"  [{c.status}] {c.name}: {c.detail}" for c in pre.checks]
    lines += ["", "steps:"]
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"  {i}. {step.name} ({step.runs_in}): {step.description}")
        lines.append(f"     {shlex.join(step.argv)}")
    if not plan.steps:
        lines.append("  (none: local checkpoints, nothing to download)")
    lines += ["", render_memory(pre)]
    return "\n".join(lines)


def _src(source: dict[str, Any] | None) -> str:
    if not source:
        return "-"
    return f"{source['repo_id']}@{source.get('revision', 'main')}" if source["kind"] == "hf" else source["path"]


def render_memory(pre: PreflightResult) -> str:
    """The memory table per GPU (GiB; bytes in the JSON)."""
    m = pre.memory
    rows = [
        ("target weights", m.target_weights),
        ("draft weights", m.draft_weights),
        ("target KV cache", m.target_kv_cache),
        ("draft KV cache", m.draft_kv_cache),
        ("activations (est.)", m.activations),
        ("runtime overhead (est.)", m.runtime_overhead),
    ]
    lines = [f"memory per GPU ({n_gpus(m.tp * m.pp)}, {pre.scheme.name}):"]
    lines += [f"  {name:<24}{value / GIB:>9.2f} GiB" for name, value in rows]
    lines.append(f"  {'total':<24}{m.total / GIB:>9.2f} GiB")
    if m.gpu:
        verdict = "fits" if m.fits else "DOES NOT FIT"
        lines.append(f"  {m.gpu:<24}{m.gpu_memory / GIB:>9.2f} GiB ({m.usable / GIB:.2f} usable): {verdict}")
    lines += [f"  note: {n}" for n in m.notes]
    if pre.parallel is not None:
        lines += ["", render_parallel(pre.parallel, m.gpu)]
    return "\n".join(lines)
