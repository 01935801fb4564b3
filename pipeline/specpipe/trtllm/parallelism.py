"""Tensor/pipeline parallel sizes: what a model and method allow, and ``--tp auto`` / ``--pp auto``.

Rules (every TP/PP size, chosen or given, passes them): TP divides the attention heads, TP and the KV
heads divide one another (TensorRT-LLM replicates KV heads when TP exceeds them), PP is at most the
layers, and PP > 1 only where :data:`PP_REFUSED` does not name the method.

``auto`` (:func:`choose_parallelism`) tries, in order: PP 1 with every TP that divides the attention heads,
smallest first, up to the GPUs available; then, when none fits and the method allows PP, every
TP x PP with PP >= 2 that the GPUs hold, fewest GPUs first and, among equal counts, less PP. It stops at
the first plan the memory plan (:mod:`specpipe.trtllm.memory`: weights, KV cache for the whole batch at
``max_seq_len``, activations) fits on the GPU. The GPUs available are ``--gpus``, else those
``nvidia-smi`` lists (:func:`specpipe.trtllm.environment.detect_gpus`), else a node of
:data:`NODE_GPUS`. Without a GPU to fit (no ``--gpu``, none detected) auto is the smallest valid size and
the choice is unchecked (``fits`` is ``None``): the plan says so, and what auto picks on
:data:`COMMON_GPUS` (:func:`on_common_gpus`). Every option tried is kept, with its per-GPU total and why it
was passed over, for the plan's table. Each size is labelled as given (``--tp N``/``--pp N``) or auto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specpipe.build_request import AUTO, GpuCount, ParallelSize
from specpipe.errors import CompatibilityError
from specpipe.presets import Architecture
from specpipe.speculative import Method, Runtime
from specpipe.trtllm.gpus import GIB, Gpu
from specpipe.trtllm.memory import MemoryPlan

#: GPUs assumed when none is detected and ``--gpus`` is not given: one HGX/DGX node.
NODE_GPUS = 8
#: The GPUs a plan made without a known GPU reports auto's choice on (:func:`on_common_gpus`).
COMMON_GPUS = ("h100-80gb", "h200-141gb", "b200")


def n_gpus(count: int) -> str:
    """``1 GPU``, ``8 GPUs``."""
    return f"{count} GPU{'' if count == 1 else 's'}"


class ParallelismError(CompatibilityError):
    """Tensor/pipeline parallel sizes the model or method cannot use."""


#: (runtime, method) -> why TensorRT-LLM refuses pipeline parallelism (PP > 1) there, with its source.
#: Every refusal of ``--pp > 1`` reads this table (:func:`check_pipeline_parallel`), and ``--pp auto``
#: never tries PP > 1 there; the fix is always TP.
PP_REFUSED: dict[tuple[Runtime, Method], str] = {
    (
        Runtime.TRTLLM,
        Method.EAGLE,
    ): "TensorRT-LLM's EAGLE converter asserts pp_size == 1 (examples/eagle/convert_checkpoint.py @ 65b31db)",
    (
        Runtime.TRTLLM_LLMAPI,
        Method.EAGLE,
    ): "EAGLE-3 does not support pipeline parallelism on the LLM API (docs/source/features/"
    "feature-combination-matrix.md @ 4d942aa; PyExecutor refuses a drafter in its PP loop)",
    (
        Runtime.TRTLLM_LLMAPI,
        Method.NGRAM,
    ): "the LLM API's PyExecutor raises NotImplementedError for a drafter with the pipeline-parallel executor loop "
    "(tensorrt_llm/_torch/pyexecutor/py_executor.py @ 9521caf)",
    (
        Runtime.TRTLLM_LLMAPI,
        Method.DRAFT_MODEL,
    ): "the LLM API's PyExecutor raises NotImplementedError for a drafter with the pipeline-parallel executor loop "
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
        raise ParallelismError(
            f"--tp {tp} and the {kv} KV heads of {name} do not divide each other: use a --tp that divides {kv}"
        )
    if pp > arch.num_layers:
        raise ParallelismError(
            f"--pp {pp} exceeds the {arch.num_layers} layers of {name}: use --pp <= {arch.num_layers}"
        )


@dataclass(frozen=True)
class Option:
    """One TP x PP tried: ``total`` bytes per GPU of its memory plan (``None``: not planned, the sizes are
    invalid), ``fits`` (``None``: no GPU to fit), ``why`` it was passed over (``None``: the one chosen)."""

    tp: int
    pp: int
    total: int | None
    fits: bool | None
    why: str | None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def as_dict(self) -> dict:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "gpus": self.gpus,
            "total": self.total,
            "fits": self.fits,
            "why": self.why,
        }


@dataclass
class ParallelChoice:
    """The TP x PP a plan uses and how it was reached.

    Attributes:
        tp, pp: the sizes (GPUs). chosen: ``auto`` (a size searched) or ``explicit`` (both given, or ``--tp``
            given and PP left at 1). tp_from, pp_from: per size, ``explicit`` (given) or ``auto``.
        available: the GPUs auto could use; ``available_from`` where that number came from.
        tried: every option evaluated, in order (the chosen one included). fits: whether the chosen
            option fits the GPU (``None``: no GPU named). notes: what the plan should say about the choice.
    """

    tp: int
    pp: int
    chosen: str
    available: int
    available_from: str
    tried: list[Option] = field(default_factory=list)
    fits: bool | None = None
    notes: list[str] = field(default_factory=list)
    tp_from: str = "auto"
    pp_from: str = "auto"

    @property
    def sizes(self) -> str:
        """``TP 4 x PP 1 (auto)``, ``TP 2 x PP 1 (given)``, ``TP 1 (auto) x PP 80 (given)``: each size labelled."""
        word = {"auto": "auto", "explicit": "given"}
        if self.tp_from == self.pp_from:
            return f"TP {self.tp} x PP {self.pp} ({word[self.tp_from]})"
        return f"TP {self.tp} ({word[self.tp_from]}) x PP {self.pp} ({word[self.pp_from]})"

    @property
    def beyond(self) -> bool:
        """The sizes need more GPUs than are available."""
        return self.tp * self.pp > self.available

    def as_dict(self) -> dict:
        """The plan's ``parallel`` block: ``tp``, ``pp``, ``gpus`` (= tp x pp) as before, plus the choice:
        ``chosen``, per size ``tp_from``/``pp_from`` (``explicit`` or ``auto``), ``checked`` (fitted to a GPU)."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "gpus": self.tp * self.pp,
            "chosen": self.chosen,
            "tp_from": self.tp_from,
            "pp_from": self.pp_from,
            "checked": self.fits is not None,
            "available": self.available,
            "available_from": self.available_from,
            "tried": [o.as_dict() for o in self.tried],
            "notes": list(self.notes),
        }


def available_gpus(gpus: GpuCount | None) -> GpuCount:
    """``gpus``, or a node of :data:`NODE_GPUS` (saying that it is assumed) when nothing was detected or given."""
    if gpus is not None:
        return gpus
    return GpuCount(NODE_GPUS, f"assumed, a node of {NODE_GPUS}: no GPU detected, give --gpus N")


def _problem(models: list[tuple[str, Architecture, str]], tp: int, pp: int) -> str | None:
    """Why TP x PP is invalid for one of ``models`` (the first clause of :func:`check_parallelism`'s message)."""
    for name, arch, method in models:
        try:
            check_parallelism(name, arch, tp, pp, method)
        except ParallelismError as error:
            return str(error).split(": use ")[0]
    return None


def _candidates(arch: Architecture, tp: ParallelSize, pp: ParallelSize, available: int, pp_allowed: bool):
    """Options in the order auto tries them (module docstring): PP 1 first, then PP >= 2 if allowed."""
    tps = [tp] if tp != AUTO else [t for t in range(1, max(available, 1) + 1) if arch.num_attention_heads % t == 0]
    first = [(t, pp if pp != AUTO else 1) for t in tps]
    yield from first
    if pp != AUTO or not pp_allowed:
        return
    more = [(t, p) for p in range(2, min(available, arch.num_layers) + 1) for t in tps if t * p <= available]
    yield from sorted(more, key=lambda option: (option[0] * option[1], option[1]))


def choose_parallelism(
    *,
    runtime: str,
    method: str,
    models: list[tuple[str, Architecture, str]],
    tp: ParallelSize,
    pp: ParallelSize,
    gpu: Gpu | None,
    gpus: GpuCount | None,
    plan: Callable[[int, int], MemoryPlan],
) -> ParallelChoice:
    """The TP x PP for a plan: both given -> checked as given; either ``auto`` -> searched (module docstring).

    Args:
        runtime, method: the flow and speculative method (PP refusals, :data:`PP_REFUSED`).
        models: ``(name, architecture, method)`` of the target and, for draft-target, the draft model; every
            size must suit each. tp, pp: the requested sizes, ints or :data:`~specpipe.build_request.AUTO`.
        gpu: the GPU to fit (``None``: nothing to fit). gpus: GPUs available (``None``: a node assumed).
        plan: the memory plan for ``(tp, pp)`` on ``gpu``.

    Raises:
        ParallelismError: a given size the model or method cannot use (before any search).
    """
    available = available_gpus(gpus)
    if pp != AUTO:
        check_pipeline_parallel(runtime, method, pp)
    if tp != AUTO or pp != AUTO:
        for name, arch, model_method in models:
            check_parallelism(name, arch, tp if tp != AUTO else 1, pp if pp != AUTO else 1, model_method)
    pp_allowed = (Runtime(runtime), Method(method)) not in PP_REFUSED
    choice = ParallelChoice(
        tp=1,
        pp=1,
        chosen="explicit" if AUTO not in (tp, pp) else "auto",
        available=available.count,
        available_from=available.source,
        tp_from="auto" if tp == AUTO else "explicit",
        pp_from="auto" if pp == AUTO else "explicit",
    )
    candidates = _candidates(models[0][1], tp, pp, available.count, pp_allowed)
    if choice.chosen == "explicit" or gpu is None:
        # nothing to search: the sizes given, or (no GPU to fit) the smallest valid ones
        choice.tp, choice.pp = (
            (tp, pp)
            if choice.chosen == "explicit"
            else next((t, p) for t, p in candidates if _problem(models, t, p) is None)
        )
        memory = plan(choice.tp, choice.pp)
        choice.fits = memory.fits
        choice.tried.append(
            Option(
                choice.tp, choice.pp, memory.total, memory.fits, None if memory.fits is not False else _too_big(memory)
            )
        )
    else:
        best: Option | None = None
        for t, p in candidates:
            problem = _problem(models, t, p)
            if problem is not None:
                choice.tried.append(Option(t, p, None, None, problem))
                continue
            memory = plan(t, p)
            option = Option(t, p, memory.total, memory.fits, None if memory.fits else _too_big(memory))
            choice.tried.append(option)
            if memory.fits:
                best = option
                break
            best = option if best is None or option.total < best.total else best
        # TP 1 x PP 1 (or the given size) is always valid, so some option was planned
        choice.tp, choice.pp, choice.fits = best.tp, best.pp, best.fits
    if tp != AUTO and all(o.pp == 1 for o in choice.tried):
        choice.chosen = "explicit"  # --tp given and no PP searched: the sizes are the ones asked for
    if gpu is None and choice.chosen == "auto":
        choice.notes.append(
            f"no GPU to fit (name it with --gpu): auto took the smallest valid size, TP {choice.tp} x PP {choice.pp}"
        )
    if not pp_allowed and pp == AUTO and choice.fits is False:
        choice.notes.append(f"PP > 1 not tried: {PP_REFUSED[(Runtime(runtime), Method(method))]}")
    return _note_count(choice, gpus)


def _note_count(choice: ParallelChoice, gpus: GpuCount | None) -> ParallelChoice:
    """Say so when the chosen sizes need more GPUs than were detected, given or assumed."""
    need = choice.tp * choice.pp
    if need > choice.available:
        choice.notes.append(
            f"TP {choice.tp} x PP {choice.pp} needs {n_gpus(need)}, {choice.available} available "
            f"({choice.available_from}): the engine can be built elsewhere, serving it needs {n_gpus(need)}"
        )
    return choice


def on_common_gpus(choose: Callable[[Gpu], ParallelChoice | None], gpus: list[Gpu]) -> str:
    """What auto picks on each of ``gpus`` (``choose(gpu)``: the choice planned for it, ``None`` where the
    settings do not run there), as ``with --gpu h100-80gb: TP 4 x PP 1; h200-141gb: TP 2 x PP 1``."""
    parts = []
    for gpu in gpus:
        choice = choose(gpu)
        if choice is None:
            parts.append(f"{gpu.name}: not supported")
        elif choice.fits:
            parts.append(f"{gpu.name}: TP {choice.tp} x PP {choice.pp}")
        else:
            parts.append(f"{gpu.name}: none fits {n_gpus(choice.available)}")
    return "with --gpu " + "; ".join(parts)


def _too_big(memory: MemoryPlan) -> str:
    return f"{memory.total / GIB:.1f} GiB > {memory.usable / GIB:.1f} usable"


def render_parallel(choice: ParallelChoice, gpu: str | None) -> str:
    """The table of the TP x PP options tried (GiB per GPU, fits, why passed over) and how the sizes were chosen."""
    how = (
        "as given (--tp/--pp)"
        if choice.chosen == "explicit"
        else f"auto: the smallest TP, then PP, that fits {gpu}"
        if gpu
        else "auto, not fitted to a GPU (no --gpu)"
    )
    if choice.chosen == "auto" and choice.tp_from != choice.pp_from:
        how += f" ({'TP' if choice.tp_from == 'explicit' else 'PP'} as given)"
    lines = [
        f"parallelism: TP {choice.tp} x PP {choice.pp}, {how}; {n_gpus(choice.available)} available ({choice.available_from}):",
        f"  {'TP':>4}{'PP':>4}{'GPUs':>6}{'GiB/GPU':>10}  {'fits':<5} why",
    ]
    for o in choice.tried:
        total = "-" if o.total is None else f"{o.total / GIB:.2f}"
        fits = "-" if o.fits is None else ("yes" if o.fits else "no")
        why = o.why or ("chosen" if (o.tp, o.pp) == (choice.tp, choice.pp) else "")
        if o.why and (o.tp, o.pp) == (choice.tp, choice.pp):
            why += " (the best tried)" if choice.chosen == "auto" else ""
        lines.append(f"  {o.tp:>4}{o.pp:>4}{o.gpus:>6}{total:>10}  {fits:<5} {why}")
    lines += [f"  note: {n}" for n in choice.notes]
    return "\n".join(lines)
