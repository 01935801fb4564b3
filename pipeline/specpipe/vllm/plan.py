"""``specpipe build --runtime vllm``: presets -> checks -> the ``vllm serve`` command, checked against vLLM.

vLLM builds nothing ahead of time: the plan is the command (``vllm serve MODEL ...`` with its
``--speculative-config``) and the checks behind it, all made before anything is downloaded. Order:
resolve target and draft (:mod:`specpipe.trtllm.resolve`, the same presets as TensorRT-LLM) -> refuse a
method or quantization vLLM lacks (:mod:`specpipe.vllm.settings`) -> heads/draft vocabulary against the
target (:func:`specpipe.trtllm.preflight.check_heads_match`) -> limits -> TP x PP -> argv, checked by
:func:`specpipe.vllm.flagcheck.parse_serve_argv`.

Parallelism: the same rules and ``--tp/--pp auto`` search as TensorRT-LLM
(:func:`specpipe.trtllm.parallelism.choose_parallelism`), with no pipeline-parallel refusal: vLLM
0.34.0 runs speculative decoding with PP > 1 for Llama (``LlamaModel.supports_aux_hidden_states_over_pp``
in ``vllm/model_executor/models/llama.py``, checked by ``verify_supports_aux_hidden_states_over_pp`` in
``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` of the wheel). Memory: the TensorRT-LLM plan
(:mod:`specpipe.trtllm.memory`: weights, the KV cache of ``--max-num-seqs`` sequences at
``--max-model-len``, activations) as the estimate; vLLM itself takes ``--gpu-memory-utilization`` (0.9)
of the GPU and fills what the weights leave with KV-cache blocks, so a plan that fits here leaves vLLM
room for every sequence at full length. The draft (EAGLE head, draft model) follows the target's TP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.build_common import is_engine_name
from specpipe.build_request import AUTO, BuildRequest
from specpipe.errors import PresetError
from specpipe.manifest import canonical_hash
from specpipe.presets import load_draft
from specpipe.speculative import Method, Runtime, SpeculativeSettings
from specpipe.trtllm.gpus import GIB, Gpu, lookup_gpu
from specpipe.trtllm.memory import MemoryPlan, plan_memory
from specpipe.trtllm.parallelism import (
    COMMON_GPUS,
    ParallelChoice,
    check_parallelism,
    choose_parallelism,
    on_common_gpus,
    render_parallel,
)
from specpipe.trtllm.preflight import Check, check_heads_match, check_sequence_lengths, parallel_check
from specpipe.trtllm.quant import resolve_scheme
from specpipe.trtllm.resolve import Draft, Target, resolve_draft, resolve_target
from specpipe.vllm import release, settings
from specpipe.vllm.flagcheck import parse_serve_argv

PLAN_FORMAT = "specpipe-vllm-plan/1"


@dataclass
class VllmPlan:
    """A vLLM deployment: what ``vllm serve`` is run with, and why.

    Attributes:
        engine_name, engine_dir: the name and ``engines/NAME`` (where the manifest goes).
        target, draft: the resolved presets. speculative: the chain vLLM drafts.
        quantization: specpipe's scheme name (``bf16``, ``fp8`` ...). parallel: TP x PP and how it was chosen.
        memory: the memory estimate per GPU (bytes). argv: ``vllm serve MODEL ...`` (no ``--host``/``--port``,
            which ``specpipe serve`` adds). speculative_config: the ``--speculative-config`` object or ``None``.
        checks: the report. memory_error: why the plan does not fit the GPU (with fixes), or ``None``.
    """

    request: BuildRequest
    engine_name: str
    engine_dir: Path
    target: Target
    draft: Draft
    speculative: SpeculativeSettings
    quantization: str
    parallel: ParallelChoice
    memory: MemoryPlan
    argv: list[str]
    speculative_config: dict[str, Any] | None
    checks: list[Check] = field(default_factory=list)
    memory_error: str | None = None

    @property
    def inputs_hash(self) -> str:
        return canonical_hash(
            {"runtime": Runtime.VLLM.value, "name": self.engine_name, "argv": self.argv, "release": release.summary()}
        )

    def as_dict(self) -> dict[str, Any]:
        """The ``--dry-run --json`` document."""
        req = self.request
        return {
            "format": PLAN_FORMAT,
            "runtime": Runtime.VLLM.value,
            "engine_name": self.engine_name,
            "engine_dir": str(self.engine_dir),
            "release": release.summary(),
            "inputs_hash": self.inputs_hash,
            "target": {"preset": self.target.name, "source": self.target.source},
            "draft": {
                "preset": self.draft.name,
                "method": Method(self.draft.method).value,
                "source": self.draft.source,
                "flavour": self.draft.flavour,
            },
            "speculative": self.speculative.to_json(),
            "speculative_config": self.speculative_config,
            "quantization": self.quantization,
            "parallel": self.parallel.as_dict(),
            "limits": {
                "max_batch_size": req.max_batch_size,
                "max_input_len": req.max_input_len,
                "max_seq_len": req.max_seq_len,
            },
            "memory": self.memory.as_dict(),
            "command": list(self.argv),
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks],
            "error": self.memory_error,
        }


def _argv(
    target: Target,
    plan_name: str,
    dtype: str,
    quantization: str | None,
    tp: int,
    pp: int,
    request: BuildRequest,
    spec_config: dict[str, Any] | None,
) -> list[str]:
    model, revision = settings.model_reference(target.source)
    argv = ["vllm", "serve", model, "--served-model-name", plan_name]
    if revision is not None:
        argv += ["--revision", revision]
    argv += ["--dtype", dtype]
    if quantization is not None:
        argv += ["--quantization", quantization]
    argv += [
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(pp),
        "--max-model-len",
        str(request.max_seq_len),
        "--max-num-seqs",
        str(request.max_batch_size),
    ]
    if spec_config is not None:
        argv += ["--speculative-config", json.dumps(spec_config, separators=(",", ":"))]
    return argv


def make_plan(request: BuildRequest) -> VllmPlan:
    """Resolve, check and plan a vLLM deployment; nothing is downloaded (configs come from presets, local
    checkpoints or the Hugging Face cache; the network only outside dry runs, as on TensorRT-LLM).

    Raises:
        PresetError: a bad name, an option that means nothing on vLLM (``--choices``, ``--lookahead``).
        CompatibilityError: a method or quantization vLLM lacks (naming the nearest), a head or draft made
            for another target, limits beyond the target, TP/PP the model cannot use.
        InvalidVllmCommandError: the command does not match vLLM's definitions (a specpipe defect).
    """
    if request.name is not None and not is_engine_name(request.name):
        raise PresetError(f"--name {request.name!r} must be a plain name (letters, digits, . _ -), no paths")
    target = resolve_target(request.target)
    if request.draft != "none":  # the preset's method, before its weights are looked for
        preset = load_draft(request.draft)
        settings.check_method(preset.name, preset.kind)
    draft = resolve_draft(request.draft, request.draft_model, target, allow_network=not request.dry_run)
    settings.check_method(draft.name, draft.method)
    scheme_name, quantization = settings.resolve_quantization(request.quantization, target)
    scheme = resolve_scheme(scheme_name, target.dtype)
    gpu = lookup_gpu(request.gpu) if request.gpu else None
    checks = [
        Check(
            "method on vLLM",
            "ok",
            f"{Method(draft.method).value} -> speculative_config.method "
            f"{settings.vllm_method(draft.method, draft.flavour)}",
        ),
        Check("quantization", "ok", f"{scheme_name} -> --quantization {quantization or '(none)'}"),
    ]
    checks += check_heads_match(target, draft)
    check_sequence_lengths(request, target)
    spec = settings.resolve_speculative(request, draft)
    models = [(target.name, target.arch, draft.method)]
    if draft.arch is not None:
        models.append((f"draft {draft.name}", draft.arch, Method.DRAFT_MODEL.value))
    for name, arch, method in models:
        check_parallelism(
            name, arch, 1 if request.tp == AUTO else request.tp, 1 if request.pp == AUTO else request.pp, method
        )

    def memory(tp: int, pp: int, on: Gpu | None = gpu) -> MemoryPlan:
        return plan_memory(
            target=target.arch,
            scheme=scheme,
            tp=tp,
            pp=pp,
            batch=request.max_batch_size,
            max_seq_len=request.max_seq_len,
            method=spec.method.value,
            max_draft_len=spec.max_draft_len,
            num_eagle_layers=spec.num_eagle_layers or 0,
            draft_arch=draft.arch if spec.spec.weights == "model" else None,
            gpu=on,
        )

    def choose(on: Gpu | None) -> ParallelChoice:
        return choose_parallelism(
            runtime=Runtime.VLLM.value,
            method=draft.method,
            models=models,
            tp=request.tp,
            pp=request.pp,
            gpu=on,
            gpus=request.gpus,
            plan=lambda tp, pp: memory(tp, pp, on),
        )

    parallel = choose(gpu)
    mem = memory(parallel.tp, parallel.pp)
    checks.append(
        parallel_check(parallel, request, lambda: on_common_gpus(choose, [lookup_gpu(g) for g in COMMON_GPUS]))
    )
    engine_name = request.engine_name(target.name, draft.name)
    if not is_engine_name(engine_name):
        raise PresetError(f"engine name {engine_name!r} is not a plain name: give one with --name")
    spec_config = settings.speculative_config(
        spec, draft, parallel.tp, lookup_min=request.ngram_lookup[1] if request.ngram_lookup else 1
    )
    dtype = settings.DTYPES.get(target.dtype, "bfloat16") if scheme_name != "fp16" else "float16"
    argv = _argv(target, engine_name, dtype, quantization, parallel.tp, parallel.pp, request, spec_config)
    parse_serve_argv(argv)
    checks.append(
        Check("vllm serve flags", "ok", f"every flag and speculative_config field is vLLM {release.VLLM_VERSION}'s")
    )
    error = None
    if gpu is not None and not mem.fits:
        error = (
            f"the plan needs {mem.total / GIB:.1f} GiB per GPU ({scheme_name}, TP {parallel.tp} x PP {parallel.pp}, "
            f"{request.max_batch_size} x {request.max_seq_len} tokens), {gpu.name} has {mem.usable / GIB:.1f} usable: "
            f"try more GPUs (--gpus), --quantization fp8, or a smaller --max-batch-size/--max-seq-len"
        )
    checks.append(
        Check(
            "memory plan",
            "not checked" if gpu is None else ("ok" if mem.fits else "failed"),
            f"{mem.total / GIB:.1f} GiB per GPU"
            + (f" of {mem.usable / GIB:.1f} usable on {gpu.name}" if gpu else " (name the GPU with --gpu)"),
        )
    )
    return VllmPlan(
        request,
        engine_name,
        request.engines_dir / engine_name,
        target,
        draft,
        spec,
        scheme_name,
        parallel,
        mem,
        argv,
        spec_config,
        checks,
        error,
    )


def render_text(plan: VllmPlan) -> str:
    """The plan as the terminal shows it: the release, checks, parallelism table and the command."""
    from shlex import join

    lines = [
        f"specpipe build plan: {plan.engine_name} (vllm, vLLM {release.VLLM_VERSION}, {release.IMAGE})",
        f"  target {plan.target.name}, draft {plan.draft.name} ({Method(plan.draft.method).value}), "
        f"quantization {plan.quantization}",
        "checks:",
    ]
    lines += [f"  [{c.status}] {c.name}: {c.detail}" for c in plan.checks]
    lines.append(render_parallel(plan.parallel, plan.request.gpu))
    if plan.speculative_config is not None:
        lines.append("speculative config: " + json.dumps(plan.speculative_config))
    lines += [
        "command (vLLM builds nothing ahead of time; `specpipe serve NAME --runtime vllm` runs it):",
        "  " + join(plan.argv),
    ]
    if plan.memory_error:
        lines.append(f"does not fit: {plan.memory_error}")
    return "\n".join(lines)
