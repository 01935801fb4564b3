"""Pre-flight checks of a TensorRT-LLM build: everything that can fail is checked before any step runs.

Only presets, local ``config.json``/safetensors headers and tokenizer files are read; no weights are
downloaded. Each failed check raises a :class:`~specpipe.errors.SpecpipeError` whose one-line message
names both sides and the fix. Checks that cannot run (offline) are reported as "not checked".

Sources: see :mod:`specpipe.trtllm.quant` (support matrices), :mod:`specpipe.trtllm.draft_settings`
(each method's settings, trees and their limits), :mod:`specpipe.speculative` (which method runs on which
flow), :mod:`specpipe.trtllm.memory` (memory plan), :mod:`specpipe.trtllm.parallelism` (TP/PP rules and
``--tp/--pp auto``); EAGLE's ``pp_size == 1`` from ``examples/eagle/convert_checkpoint.py`` @ 65b31db and
its ``max_batch_size <= 512`` from ``tensorrt_llm/builder.py`` ``build()``. Every method's
``max_draft_len`` must be below ``--max-seq-len``. The fixes a memory-fit failure names are re-planned
(:mod:`specpipe.trtllm.fit_fixes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specpipe.build_request import AUTO, BuildRequest
from specpipe.errors import CompatibilityError, SpecpipeError
from specpipe.speculative import Method, Runtime, SpeculativeSettings, methods_for, spec_of
from specpipe.trtllm import eagle_head
from specpipe.trtllm.draft_settings import describe, resolve_speculative
from specpipe.trtllm.fit_fixes import suggest_fixes
from specpipe.trtllm.gpus import GIB, Gpu, lookup_gpu
from specpipe.trtllm.memory import MemoryPlan, plan_memory
from specpipe.trtllm.parallelism import (
    COMMON_GPUS,
    ParallelChoice,
    ParallelismError,  # noqa: F401 (raised by the checks here; callers import it from this module)
    check_parallelism,
    check_pipeline_parallel,
    choose_parallelism,
    n_gpus,
    on_common_gpus,
)
from specpipe.trtllm.quant import Scheme, check_support, resolve_scheme
from specpipe.trtllm.resolve import Draft, Target

ENGINE_METHODS = methods_for(Runtime.TRTLLM)
LLMAPI_METHODS = methods_for(Runtime.TRTLLM_LLMAPI)
EAGLE_MAX_BATCH = 512


class MemoryPlanError(SpecpipeError):
    """The plan does not fit the GPU."""

    def __init__(self, message: str, plan: MemoryPlan):
        super().__init__(message)
        self.plan = plan


@dataclass
class Check:
    """One pre-flight check for the report: ``status`` is ``ok``, ``not checked``, ``note``, ``warning`` (a plan
    that builds but needs attention, e.g. more GPUs than are here) or ``failed``."""

    name: str
    status: str
    detail: str


@dataclass
class PreflightResult:
    scheme: Scheme
    speculative: SpeculativeSettings
    gpu: Gpu | None
    memory: MemoryPlan
    checks: list[Check] = field(default_factory=list)
    memory_error: str | None = None
    """Why the plan does not fit the GPU (with fixes), or ``None``; see :func:`raise_if_unfit`."""
    parallel: ParallelChoice | None = None
    """The TP x PP the plan uses and how it was chosen (set by :func:`run_preflight`)."""


def raise_if_unfit(result: PreflightResult) -> None:
    """Raise the memory failure found by :func:`run_preflight`, if any.

    Raises:
        MemoryPlanError: the plan does not fit the GPU; the message names both sides and fixes.
    """
    if result.memory_error:
        raise MemoryPlanError(result.memory_error, result.memory)


def check_runtime_method(runtime: str, draft: Draft) -> None:
    """Refuse methods/flavours the chosen TensorRT-LLM flow does not run.

    Raises:
        CompatibilityError: naming the method and the runtime that runs it.
    """
    if runtime == "trtllm":
        if draft.method not in ENGINE_METHODS:
            raise CompatibilityError(
                f"--draft {draft.name} ({draft.method}) has no TensorRT engine mode: use --runtime trtllm-llmapi "
                f"(NGram) or --runtime cpu, or one of the engine methods: eagle, medusa, lookahead, a draft model"
            )
        if draft.flavour == "eagle3":
            where = draft.source.get("repo_id") or draft.source.get("path") if draft.source else draft.name
            raise CompatibilityError(
                f"EAGLE-3 head {where} runs only on TensorRT-LLM's LLM API flow, the engine flow builds EAGLE-1/2 heads: "
                f"use --runtime trtllm-llmapi, or pass an EAGLE-1/2 head with --draft-model"
            )
    else:
        if draft.method not in LLMAPI_METHODS:
            raise CompatibilityError(
                f"--draft {draft.name} ({draft.method}) runs only on the TensorRT engine flow in TensorRT-LLM 1.2: "
                f"use --runtime trtllm"
            )
        if draft.flavour == "eagle1":
            raise CompatibilityError(
                "EAGLE-1/2 heads run only on the TensorRT engine flow (the LLM API's 'Eagle' decoding is EAGLE-3): "
                "use --runtime trtllm, or pass an EAGLE-3 head with --draft-model"
            )


def check_heads_match(target: Target, draft: Draft) -> list[Check]:
    """EAGLE/Medusa head width and vocabulary, and a draft model's vocabulary, against the target.

    Raises:
        CompatibilityError: a head or draft model made for another base model.
    """
    checks: list[Check] = []
    arch = target.arch
    where = (draft.source or {}).get("repo_id") or (draft.source or {}).get("path") or draft.name
    weights = spec_of(draft.method).weights
    if weights == "heads":
        kind = "EAGLE head" if draft.method == Method.EAGLE else "Medusa heads"
        if draft.hidden_size is not None and draft.hidden_size != arch.hidden_size:
            raise CompatibilityError(
                f"{kind} {where} has hidden size {draft.hidden_size}, target {target.name} has {arch.hidden_size}: "
                f"the heads were trained for another base model; use heads made for {target.name}"
            )
        if draft.vocab_size is not None and draft.vocab_size != arch.vocab_size:
            raise CompatibilityError(
                f"{kind} {where} has vocabulary {draft.vocab_size}, target {target.name} has {arch.vocab_size}: "
                f"the heads were trained for another base model; use heads made for {target.name}"
            )
        cfg = draft.checkpoint.config if draft.checkpoint else {}
        if draft.method == Method.EAGLE and draft.flavour == "eagle1":
            for key, want in (
                ("num_attention_heads", arch.num_attention_heads),
                ("intermediate_size", arch.intermediate_size),
                ("num_key_value_heads", arch.num_kv_heads),
            ):
                if key in cfg and int(cfg[key]) != want:
                    raise CompatibilityError(
                        f"EAGLE head {where} has {key} {cfg[key]}, target {target.name} has {want}: the head was made "
                        f"for another base model; use a head made for {target.name}"
                    )
        unknown = [n for n in (("hidden size", draft.hidden_size), ("vocabulary", draft.vocab_size)) if n[1] is None]
        checks.append(
            Check(
                f"{kind} vs target",
                "ok" if not unknown else "not checked",
                f"hidden {draft.hidden_size}, vocabulary {draft.vocab_size} vs {arch.hidden_size}, {arch.vocab_size}"
                if not unknown
                else f"{', '.join(u[0] for u in unknown)} unknown ({'; '.join(draft.notes)})",
            )
        )
    elif weights == "model":
        if draft.vocab_size != arch.vocab_size:
            raise CompatibilityError(
                f"draft model {where} has vocabulary {draft.vocab_size} (config vocab_size), target {target.name} has "
                f"{arch.vocab_size}: draft-target decoding needs the same vocabulary; pick a draft from the target's family"
            )
        checks.append(Check("draft vocabulary (config)", "ok", f"{draft.vocab_size} = {arch.vocab_size}"))
    return checks


def check_sequence_lengths(request: BuildRequest, target: Target) -> None:
    """Refuse ``--max-input-len`` above ``--max-seq-len``, and ``--max-seq-len`` above the target's positions.

    Raises:
        CompatibilityError: naming the flag and the value that fits.
    """
    if request.max_input_len > request.max_seq_len:
        raise CompatibilityError(
            f"--max-input-len {request.max_input_len} exceeds --max-seq-len {request.max_seq_len}: raise --max-seq-len "
            f"or lower --max-input-len"
        )
    if request.max_seq_len > target.arch.max_position_embeddings:
        raise CompatibilityError(
            f"--max-seq-len {request.max_seq_len} exceeds target {target.name}'s {target.arch.max_position_embeddings} "
            f"positions: use --max-seq-len <= {target.arch.max_position_embeddings}"
        )


def _memory(
    target: Target,
    draft: Draft,
    spec: SpeculativeSettings,
    scheme: Scheme,
    tp: int,
    pp: int,
    batch: int,
    seq: int,
    gpu: Gpu | None,
) -> MemoryPlan:
    return plan_memory(
        target=target.arch,
        scheme=scheme,
        tp=tp,
        pp=pp,
        batch=batch,
        max_seq_len=seq,
        method=spec.method.value,
        max_draft_len=spec.max_draft_len,
        num_eagle_layers=spec.num_eagle_layers or 0,
        medusa=(spec.num_medusa_heads, spec.num_medusa_layers) if spec.num_medusa_heads else None,
        draft_arch=draft.arch if spec.spec.weights == "model" else None,
        gpu=gpu,
    )


def _memory_error(
    target: Target,
    draft: Draft,
    scheme: Scheme,
    request: BuildRequest,
    gpu: Gpu,
    parallel: ParallelChoice,
    memory: MemoryPlan,
) -> str:
    """Why the plan does not fit ``gpu`` and the fixes that were re-planned and fit (one line,
    :func:`specpipe.trtllm.fit_fixes.suggest_fixes`); for an automatic choice, the best option tried."""

    def replan(changed: BuildRequest, other: Draft):
        return run_preflight(changed, target, other, suggest=False)

    found = suggest_fixes(target, draft, scheme, request, parallel, replan)
    fixes = (
        "try " + " or ".join(found)
        if found
        else "no single change of GPUs, TP, quantization, batch size or draft fits: use a GPU with more memory"
    )
    limits = f"batch {request.max_batch_size} x {request.max_seq_len} tokens"
    has = f"{gpu.name} has {gpu.memory_bytes / GIB:.1f} GiB ({memory.usable / GIB:.1f} usable)"
    if parallel.chosen == "explicit":
        return (
            f"the plan needs {memory.total / GIB:.1f} GiB per GPU ({scheme.name}, TP {parallel.tp}, {limits}), "
            f"{has}: {fixes}"
        )
    return (
        f"no TP x PP fits {gpu.name} within the {n_gpus(parallel.available)} available ({parallel.available_from}): "
        f"the best tried, TP {parallel.tp} x PP {parallel.pp}, needs {memory.total / GIB:.1f} GiB per GPU "
        f"({scheme.name}, {limits}), {has}: {fixes}"
    )


def parallel_check(parallel: ParallelChoice, request: BuildRequest, hint: Callable[[], str]) -> Check:
    """The ``parallelism`` check: ``ok`` only when the sizes were fitted to a known GPU and the GPUs
    available hold them; ``not checked`` without a GPU (why, and auto's choice on common GPUs); ``warning``
    for sizes beyond the GPUs available; ``failed`` when nothing fits."""
    where = "" if parallel.chosen == "explicit" else f" of {n_gpus(parallel.available)} ({parallel.available_from})"
    detail = f"{parallel.sizes} = {n_gpus(parallel.tp * parallel.pp)}{where}"
    if parallel.fits is None:
        why = request.gpu_unknown or "no GPU named"
        return Check(
            "parallelism", "not checked", f"{detail}; not fitted to a GPU: {why}; {hint()} (name it with --gpu)"
        )
    if parallel.fits is False:
        return Check("parallelism", "failed", detail)
    if parallel.beyond:
        return Check(
            "parallelism",
            "warning",
            f"{detail}: needs {n_gpus(parallel.tp * parallel.pp)}, "
            f"{parallel.available} available; serving needs a machine with "
            f"{n_gpus(parallel.tp * parallel.pp)}",
        )
    return Check("parallelism", "ok", detail)


def run_preflight(request: BuildRequest, target: Target, draft: Draft, *, suggest: bool = True) -> PreflightResult:
    """All checks in order; returns the resolved settings, parallel sizes, memory plan and the check report.

    ``request.tp`` / ``request.pp`` may be :data:`~specpipe.build_request.AUTO`: the sizes are chosen by
    :func:`specpipe.trtllm.parallelism.choose_parallelism` (``PreflightResult.parallel``); given sizes are
    checked before anything else that needs the speculative settings.
    A plan that does not fit the GPU is returned with ``memory_error`` set (so a dry run can still
    print it); :func:`raise_if_unfit` raises it. ``suggest``: name the fixes that fit (re-planning each).

    Raises:
        SpecpipeError (subclasses): the first failed check, before any step runs.
    """
    checks: list[Check] = []
    check_runtime_method(request.runtime, draft)
    gpu = lookup_gpu(request.gpu) if request.gpu else None
    scheme = resolve_scheme(request.quantization, target.dtype)
    if request.runtime == "trtllm":
        check_support(scheme, draft.method, gpu)
    elif scheme.quantized:
        raise CompatibilityError(
            f"--quantization {scheme.name} on --runtime trtllm-llmapi: this stage plans no quantization step for the "
            f"LLM API flow; use bf16/fp16, or --runtime trtllm"
        )
    checks.append(
        Check(
            "quantization x method x GPU",
            "ok",
            f"{scheme.name} with {draft.method} on {gpu.name + ' (SM ' + str(gpu.sm) + ')' if gpu else 'any GPU (no --gpu)'}",
        )
    )
    models = [(target.name, target.arch, draft.method)]
    if draft.arch is not None:
        models.append((f"draft {draft.name}", draft.arch, "draft-model"))
    if request.pp != AUTO:
        check_pipeline_parallel(request.runtime, draft.method, request.pp)
    for name, arch, method in models:
        check_parallelism(
            name, arch, 1 if request.tp == AUTO else request.tp, 1 if request.pp == AUTO else request.pp, method
        )
    check_sequence_lengths(request, target)
    checks.extend(check_heads_match(target, draft))
    if request.runtime == Runtime.TRTLLM.value and draft.method == Method.EAGLE:
        checks.append(Check("EAGLE head vs TensorRT-LLM's converter", *eagle_head.preflight(draft, target)))
    spec = resolve_speculative(request, draft)
    if spec.method is Method.EAGLE and request.max_batch_size > EAGLE_MAX_BATCH:
        raise CompatibilityError(
            f"--max-batch-size {request.max_batch_size} exceeds EAGLE's limit of {EAGLE_MAX_BATCH} in TensorRT-LLM: use <= 512"
        )
    if spec.method is not Method.NONE:
        checks.append(Check("draft length vs tree/method", "ok", describe(spec)))

    if spec.method is not Method.NONE and spec.max_draft_len >= request.max_seq_len:
        raise CompatibilityError(
            f"max_draft_len {spec.max_draft_len}{f' of lookahead (W, N, G) = {spec.lookahead}' if spec.lookahead else ''} "
            f"does not fit the engine: a step's draft tokens must "
            f"be fewer than --max-seq-len {request.max_seq_len} tokens: lower the draft length"
            + (" (smaller --lookahead W,N,G)" if spec.lookahead else " (--max-draft-len)")
            + " or raise --max-seq-len"
        )

    def choose(on: Gpu | None) -> ParallelChoice:
        def plan(tp: int, pp: int) -> MemoryPlan:
            return _memory(target, draft, spec, scheme, tp, pp, request.max_batch_size, request.max_seq_len, on)

        return choose_parallelism(
            runtime=request.runtime,
            method=draft.method,
            models=models,
            tp=request.tp,
            pp=request.pp,
            gpu=on,
            gpus=request.gpus,
            plan=plan,
        )

    def supported(on: Gpu) -> ParallelChoice | None:
        try:
            check_support(scheme, draft.method, on) if request.runtime == Runtime.TRTLLM.value else None
        except CompatibilityError:
            return None
        return choose(on)

    parallel = choose(gpu)
    checks.append(
        parallel_check(parallel, request, lambda: on_common_gpus(supported, [lookup_gpu(g) for g in COMMON_GPUS]))
    )
    memory = _memory(
        target, draft, spec, scheme, parallel.tp, parallel.pp, request.max_batch_size, request.max_seq_len, gpu
    )
    memory_error = None
    if gpu is None:
        memory.notes.append("fit not checked: name the GPU with --gpu")
    elif not memory.fits:
        memory_error = (
            _memory_error(target, draft, scheme, request, gpu, parallel, memory) if suggest else "does not fit"
        )
    checks.append(
        Check(
            "memory plan",
            "ok" if memory.fits else ("not checked" if gpu is None else "failed"),
            f"{memory.total / GIB:.1f} GiB per GPU (TP {parallel.tp} x PP {parallel.pp})"
            + (f" of {memory.usable / GIB:.1f} usable on {gpu.name}" if gpu else ": name the GPU with --gpu"),
        )
    )
    return PreflightResult(
        scheme=scheme,
        speculative=spec,
        gpu=gpu,
        memory=memory,
        checks=checks,
        memory_error=memory_error,
        parallel=parallel,
    )
