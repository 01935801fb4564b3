"""Pre-flight checks of a TensorRT-LLM build: everything that can fail is checked before any step runs.

Only presets, local ``config.json``/safetensors headers and tokenizer files are read; no weights are
downloaded. Each failed check raises a :class:`~specpipe.errors.SpecpipeError` whose one-line message
names both sides and the fix. Checks that cannot run (offline) are reported as "not checked".

Sources: see :mod:`specpipe.trtllm.quant` (support matrices), :mod:`specpipe.tree` (trees),
:mod:`specpipe.speculative` (which method runs on which flow),
:mod:`specpipe.trtllm.memory` (memory plan); EAGLE limits from ``examples/eagle/convert_checkpoint.py``
@ 65b31db (``pp_size == 1``, ``max_draft_len <= 256``) and ``tensorrt_llm/builder.py`` ``build()``
(EAGLE ``max_batch_size <= 512``); lookahead's ``max_draft_len`` formula from
``examples/lookahead/README.md`` @ 83ab45a.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, PresetError, SpecpipeError
from specpipe.presets import Architecture
from specpipe.speculative import NGRAM_MATCH_DEFAULT, Method, Runtime, SpeculativeSettings, methods_for, spec_of
from specpipe.tree import Tree
from specpipe.trtllm import eagle_head
from specpipe.trtllm.gpus import GIB, Gpu, lookup_gpu
from specpipe.trtllm.memory import MemoryPlan, plan_memory
from specpipe.trtllm.quant import Scheme, check_support, engine_quantizations, resolve_scheme
from specpipe.trtllm.resolve import Draft, Target

ENGINE_METHODS = methods_for(Runtime.TRTLLM)
LLMAPI_METHODS = methods_for(Runtime.TRTLLM_LLMAPI)
EAGLE_MAX_BATCH = 512
EAGLE_MAX_DRAFT_LEN = 256
#: Draft tokens of the LLM API's EAGLE-3 chain when the preset names none (``llmapi_max_draft_len``).
LLMAPI_EAGLE_CHAIN = 3
#: The tree used when neither ``--choices`` nor the preset gives one (:data:`specpipe.tree.MC_SIM_7B_63`).
DEFAULT_TREE = "mc_sim_7b_63"
#: TensorRT-LLM's EAGLE ``max_non_leaves_per_layer`` when the preset names none.
EAGLE_NON_LEAVES_DEFAULT = 10


class ParallelismError(CompatibilityError):
    """Tensor/pipeline parallel sizes the model or method cannot use."""


#: (runtime, method) -> why TensorRT-LLM refuses pipeline parallelism (PP > 1) there, with its source.
#: Every refusal of ``--pp > 1`` reads this table (:func:`check_pipeline_parallel`); the fix is always TP.
PP_REFUSED: dict[tuple[Runtime, Method], str] = {
    (Runtime.TRTLLM, Method.EAGLE):
        "TensorRT-LLM's EAGLE converter asserts pp_size == 1 (examples/eagle/convert_checkpoint.py @ 65b31db)",
    (Runtime.TRTLLM_LLMAPI, Method.EAGLE):
        "EAGLE-3 does not support pipeline parallelism on the LLM API (docs/source/features/"
        "feature-combination-matrix.md @ 4d942aa; PyExecutor refuses a drafter in its PP loop)",
    (Runtime.TRTLLM_LLMAPI, Method.NGRAM):
        "the LLM API's PyExecutor raises NotImplementedError for a drafter with the pipeline-parallel executor loop "
        "(tensorrt_llm/_torch/pyexecutor/py_executor.py @ 9521caf)",
    (Runtime.TRTLLM_LLMAPI, Method.DRAFT_MODEL):
        "the LLM API's PyExecutor raises NotImplementedError for a drafter with the pipeline-parallel executor loop "
        "(tensorrt_llm/_torch/pyexecutor/py_executor.py @ 9521caf)",
}


def check_pipeline_parallel(runtime: Runtime | str, method: Method | str, pp: int) -> None:
    """Refuse ``pp > 1`` where :data:`PP_REFUSED` says TensorRT-LLM cannot run it.

    Raises:
        ParallelismError: naming the method, the runtime, the reason and the fix (PP 1, more TP).
    """
    why = PP_REFUSED.get((Runtime(runtime), Method(method)))
    if pp > 1 and why is not None:
        raise ParallelismError(
            f"--pp {pp} with {Method(method).value} on --runtime {Runtime(runtime).value}: {why}: "
            f"use --pp 1 and raise --tp instead"
        )


class MemoryPlanError(SpecpipeError):
    """The plan does not fit the GPU."""

    def __init__(self, message: str, plan: MemoryPlan):
        super().__init__(message)
        self.plan = plan


@dataclass
class Check:
    """One pre-flight check for the report: ``status`` is ``ok``, ``not checked`` or ``note``."""

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


def raise_if_unfit(result: PreflightResult) -> None:
    """Raise the memory failure found by :func:`run_preflight`, if any.

    Raises:
        MemoryPlanError: the plan does not fit the GPU; the message names both sides and fixes.
    """
    if result.memory_error:
        raise MemoryPlanError(result.memory_error, result.memory)


def lookahead_max_draft_len(w: int, n: int, g: int) -> int:
    """Draft tokens per step of lookahead (W, N, G): ``(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)``."""
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


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


def check_parallelism(name: str, arch: Architecture, tp: int, pp: int, method: str) -> None:
    """TP must divide the attention heads; KV heads must divide by TP (or TP by them); PP <= layers.

    Raises:
        ParallelismError: naming the sizes and the valid values.
    """
    if arch.num_attention_heads % tp:
        valid = [t for t in (1, 2, 4, 8, 16) if arch.num_attention_heads % t == 0]
        raise ParallelismError(
            f"--tp {tp} does not divide the {arch.num_attention_heads} attention heads of {name}: use --tp "
            f"{' or '.join(map(str, valid))}"
        )
    kv = arch.num_kv_heads
    if kv % tp and tp % kv:
        raise ParallelismError(f"--tp {tp} and the {kv} KV heads of {name} do not divide each other: use a --tp that divides {kv}")
    if pp > arch.num_layers:
        raise ParallelismError(f"--pp {pp} exceeds the {arch.num_layers} layers of {name}: use --pp <= {arch.num_layers}")


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
            for key, want in (("num_attention_heads", arch.num_attention_heads), ("intermediate_size", arch.intermediate_size),
                              ("num_key_value_heads", arch.num_kv_heads)):
                if key in cfg and int(cfg[key]) != want:
                    raise CompatibilityError(
                        f"EAGLE head {where} has {key} {cfg[key]}, target {target.name} has {want}: the head was made "
                        f"for another base model; use a head made for {target.name}"
                    )
        unknown = [n for n in (("hidden size", draft.hidden_size), ("vocabulary", draft.vocab_size)) if n[1] is None]
        checks.append(Check(f"{kind} vs target", "ok" if not unknown else "not checked",
                            f"hidden {draft.hidden_size}, vocabulary {draft.vocab_size} vs {arch.hidden_size}, {arch.vocab_size}"
                            if not unknown else f"{', '.join(u[0] for u in unknown)} unknown ({'; '.join(draft.notes)})"))
    elif weights == "model":
        if draft.vocab_size != arch.vocab_size:
            raise CompatibilityError(
                f"draft model {where} has vocabulary {draft.vocab_size} (config vocab_size), target {target.name} has "
                f"{arch.vocab_size}: draft-target decoding needs the same vocabulary; pick a draft from the target's family"
            )
        checks.append(Check("draft vocabulary (config)", "ok", f"{draft.vocab_size} = {arch.vocab_size}"))
    return checks


def resolve_speculative(request: BuildRequest, draft: Draft) -> SpeculativeSettings:
    """Speculative settings from the preset, ``--choices``, ``--lookahead`` and ``--max-draft-len``.

    Defaults: the registry's ``max_draft_len`` (:mod:`specpipe.speculative`), the preset's
    ``[speculative]`` table, :data:`DEFAULT_TREE`.

    Raises:
        PresetError: an option that means nothing for the method.
        CompatibilityError: ``max_draft_len`` smaller than the tree, a tree deeper than the EAGLE
            layers/Medusa heads, a lookahead ``max_draft_len`` that disagrees with (W, N, G), EAGLE limits.
    """
    method, settings = Method(draft.method), draft.preset.speculative
    spec = spec_of(method)
    base = SpeculativeSettings(method, flavour=draft.flavour)
    if request.choices is not None and not spec.has_tree:
        raise PresetError(f"--choices has no meaning with {method.value} (only EAGLE and Medusa use a tree): drop it")
    if request.lookahead is not None and method is not Method.LOOKAHEAD:
        raise PresetError(f"--lookahead has no meaning with {method.value}: drop it, or use --draft lookahead")
    if method is Method.NONE:
        if request.max_draft_len is not None:
            raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
        return base
    if method is Method.LOOKAHEAD:
        w, n, g = request.lookahead or (settings["window_size"], settings["ngram_size"], settings["verification_set_size"])
        need = lookahead_max_draft_len(w, n, g)
        if request.max_draft_len is not None and request.max_draft_len != need:
            raise CompatibilityError(
                f"--max-draft-len {request.max_draft_len} disagrees with lookahead (W, N, G) = ({w}, {n}, {g}), which "
                f"needs max_draft_len {need} = (N-2) + (W-1+G)*(N-1): drop --max-draft-len or change --lookahead"
            )
        return base.with_(max_draft_len=need, lookahead=(w, n, g))
    if not spec.has_tree:
        chain = base.with_(max_draft_len=request.max_draft_len or int(settings.get("max_draft_len", spec.max_draft_len)))
        if method is Method.NGRAM:
            chain = chain.with_(max_matching_ngram_size=int(settings.get("max_matching_ngram_size", NGRAM_MATCH_DEFAULT)))
        return chain
    if method is Method.EAGLE and request.runtime == Runtime.TRTLLM_LLMAPI.value and request.choices is None:
        # LLM API EAGLE-3: a linear chain of draft tokens unless a tree is given.
        return base.with_(max_draft_len=request.max_draft_len or int(settings.get("llmapi_max_draft_len", LLMAPI_EAGLE_CHAIN)))
    tree = Tree.parse(request.choices or settings.get("choices", DEFAULT_TREE))
    max_draft_len = request.max_draft_len if request.max_draft_len is not None else int(settings.get("max_draft_len", tree.nodes))
    tree.check(max_nodes=max_draft_len, what=spec.choices_key)
    if method is Method.EAGLE:
        if max_draft_len > EAGLE_MAX_DRAFT_LEN:
            raise CompatibilityError(f"--max-draft-len {max_draft_len} exceeds EAGLE's limit of {EAGLE_MAX_DRAFT_LEN} in TensorRT-LLM: use <= 256")
        return base.with_(max_draft_len=max_draft_len, tree=tree, num_eagle_layers=tree.depth,
                          max_non_leaves_per_layer=max(tree.max_non_leaves,
                                                       int(settings.get("max_non_leaves_per_layer", EAGLE_NON_LEAVES_DEFAULT))))
    heads = draft.num_heads or int(settings.get("num_medusa_heads", 4))
    layers = draft.num_layers or int(settings.get("num_medusa_layers", 1))
    tree.check(max_depth=heads, what=spec.choices_key, depth_limit="Medusa heads",
               fix_depth="use a tree at most {limit} deep with --choices, or heads with more levels")
    return base.with_(max_draft_len=max_draft_len, tree=tree, num_medusa_heads=heads, num_medusa_layers=layers)


def _memory(target: Target, draft: Draft, spec: SpeculativeSettings, scheme: Scheme, tp: int, pp: int, batch: int,
            seq: int, gpu: Gpu | None) -> MemoryPlan:
    return plan_memory(
        target=target.arch, scheme=scheme, tp=tp, pp=pp, batch=batch, max_seq_len=seq, method=spec.method.value,
        max_draft_len=spec.max_draft_len,
        num_eagle_layers=max(spec.num_eagle_layers or 0, 1) if spec.method is Method.EAGLE else 0,
        medusa=(spec.num_medusa_heads, spec.num_medusa_layers) if spec.method is Method.MEDUSA else None,
        draft_arch=draft.arch if spec.spec.weights == "model" else None, gpu=gpu,
    )


def suggest_fixes(target: Target, draft: Draft, spec: SpeculativeSettings, scheme: Scheme, request: BuildRequest, gpu: Gpu) -> list[str]:
    """Changes that make the plan fit ``gpu``, tried in order: more TP, a smaller scheme, smaller batch/length."""
    fixes: list[str] = []
    tp = request.tp * 2
    while tp <= 8:
        try:
            check_parallelism(target.name, target.arch, tp, request.pp, spec.method.value)
        except ParallelismError:
            break
        if _memory(target, draft, spec, scheme, tp, request.pp, request.max_batch_size, request.max_seq_len, gpu).fits:
            fixes.append(f"--tp {tp}")
            break
        tp *= 2
    for name in ("fp8", "int4-awq"):
        candidate = resolve_scheme(name)
        if candidate.weight_bytes >= scheme.weight_bytes or name not in engine_quantizations(spec.method):
            continue
        try:
            check_support(candidate, spec.method.value, gpu)
        except CompatibilityError:
            continue
        if _memory(target, draft, spec, candidate, request.tp, request.pp, request.max_batch_size, request.max_seq_len, gpu).fits:
            fixes.append(f"--quantization {name}")
            break
    batch = request.max_batch_size // 2
    while batch >= 1:
        if _memory(target, draft, spec, scheme, request.tp, request.pp, batch, request.max_seq_len, gpu).fits:
            fixes.append(f"--max-batch-size {batch}")
            break
        batch //= 2
    if spec.spec.weights is not None:
        fixes.append("another draft (e.g. --draft lookahead, which adds no weights)")
    return fixes


def run_preflight(request: BuildRequest, target: Target, draft: Draft) -> PreflightResult:
    """All checks in order; returns the resolved settings, memory plan and the check report.

    A plan that does not fit the GPU is returned with ``memory_error`` set (so a dry run can still
    print it); :func:`raise_if_unfit` raises it.

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
    checks.append(Check("quantization x method x GPU", "ok",
                        f"{scheme.name} with {draft.method} on {gpu.name + ' (SM ' + str(gpu.sm) + ')' if gpu else 'any GPU (no --gpu)'}"))
    check_pipeline_parallel(request.runtime, draft.method, request.pp)
    check_parallelism(target.name, target.arch, request.tp, request.pp, draft.method)
    if draft.arch is not None:
        check_parallelism(f"draft {draft.name}", draft.arch, request.tp, request.pp, "draft-model")
    checks.append(Check("parallelism", "ok", f"TP {request.tp} x PP {request.pp} = {request.tp * request.pp} GPUs"))
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
    checks.extend(check_heads_match(target, draft))
    if request.runtime == Runtime.TRTLLM.value and draft.method == Method.EAGLE:
        checks.append(Check("EAGLE head vs TensorRT-LLM's converter", *eagle_head.preflight(draft, target)))
    spec = resolve_speculative(request, draft)
    if spec.method is Method.EAGLE and request.max_batch_size > EAGLE_MAX_BATCH:
        raise CompatibilityError(f"--max-batch-size {request.max_batch_size} exceeds EAGLE's limit of {EAGLE_MAX_BATCH} in TensorRT-LLM: use <= 512")
    if spec.method is not Method.NONE:
        checks.append(Check("draft length vs tree/method", "ok", _describe(spec)))
    memory = _memory(target, draft, spec, scheme, request.tp, request.pp, request.max_batch_size, request.max_seq_len, gpu)
    memory_error = None
    if gpu is None:
        memory.notes.append("fit not checked: name the GPU with --gpu")
    elif not memory.fits:
        fixes = suggest_fixes(target, draft, spec, scheme, request, gpu)
        memory_error = (
            f"the plan needs {memory.total / GIB:.1f} GiB per GPU ({scheme.name}, TP {request.tp}, batch "
            f"{request.max_batch_size} x {request.max_seq_len} tokens), {gpu.name} has {gpu.memory_bytes / GIB:.1f} GiB "
            f"({memory.usable / GIB:.1f} usable): try {' or '.join(fixes)}"
        )
    checks.append(Check("memory plan", "ok" if memory.fits else ("not checked" if gpu is None else "failed"),
                        f"{memory.total / GIB:.1f} GiB per GPU" + (f" of {memory.usable / GIB:.1f} usable on {gpu.name}" if gpu else "")))
    return PreflightResult(scheme=scheme, speculative=spec, gpu=gpu, memory=memory, checks=checks, memory_error=memory_error)


def _describe(spec: SpeculativeSettings) -> str:
    if spec.method is Method.EAGLE and spec.tree is None:
        return f"linear chain of {spec.max_draft_len} draft tokens (LLM API EAGLE-3)"
    if spec.method is Method.EAGLE:
        return (f"eagle_choices depth {spec.tree.depth} = num_eagle_layers {spec.num_eagle_layers}, "
                f"{spec.tree.nodes} nodes <= max_draft_len {spec.max_draft_len}")
    if spec.method is Method.MEDUSA:
        return (f"medusa_choices depth {spec.tree.depth} <= {spec.num_medusa_heads} heads, "
                f"{spec.tree.nodes} nodes <= max_draft_len {spec.max_draft_len}")
    if spec.method is Method.LOOKAHEAD:
        w, n, g = spec.lookahead
        return f"(W, N, G) = ({w}, {n}, {g}) -> max_draft_len {spec.max_draft_len}"
    return f"max_draft_len {spec.max_draft_len}"
