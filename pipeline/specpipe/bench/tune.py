"""``specpipe tune NAME``: measure a CPU engine at several draft lengths and record the best one.

For each candidate setting the engine is rebuilt with that setting (``build_cpu``: the target's
weights are hard links, so a rebuild is cheap), packaged, served by its own Triton server, warmed up
and benchmarked at one concurrency with the same prompts; then the server is stopped. Candidates:

- linear methods (``ngram``, ``draft-model``): ``max_draft_len`` = each value of ``--max-draft-len``;
- tree methods (``eagle``, ``medusa``): for each value K, the engine's own tree cut to its first K
  nodes (``tree-K``, every node kept after its parent) and a single chain of depth K (``chain-K``;
  for Medusa no deeper than its heads).

The best candidate (highest output tokens/s) is written to ``ENGINES_DIR/NAME.tuned.json``
(:mod:`specpipe.tuned`), which the next ``specpipe build`` of that engine uses.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.table import Table

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.prompts import Prompt, load_prompts
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench
from specpipe.bench.stats import Aggregate, level_aggregate
from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.errors import SpecpipeError
from specpipe.manifest import read_manifest
from specpipe.progress import console, count_bars, warn
from specpipe.serve.local import LocalTritonServer
from specpipe.speculative import METHODS, Method, Runtime, SpeculativeSettings, entry_for, methods_for
from specpipe.tree import Tree
from specpipe.triton.repository import package_engine
from specpipe.tuned import tuned_path, write_tuned


@dataclass(frozen=True)
class TuneRequest:
    """What ``specpipe tune`` was asked to do.

    Attributes:
        name: the CPU engine ``engines_dir/NAME`` to tune.
        engines_dir: root of engine directories.
        prompts: a built-in set (``chat``, ``code``, ``summarize``) or a JSONL file of ``{"prompt": ...}``.
        lengths: draft lengths to try (tokens; tree methods: tree nodes / chain depth).
        concurrency: requests in flight while measuring.
        max_tokens: new tokens per request.
        num_requests: measured requests per setting.
        warmup: requests per setting before measuring.
        draft: the draft preset the engine was built from (``None``: from its manifest).
        chat: wrap prompts in the engine's chat template.
        keep: keep the candidates' engines, repositories and logs (``engines_dir/.tune-NAME``).
    """

    name: str
    engines_dir: Path = Path("engines")
    prompts: str = "chat"
    lengths: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    concurrency: int = 1
    max_tokens: int = 128
    num_requests: int = 8
    warmup: int = 1
    draft: str | None = None
    chat: bool = False
    keep: bool = False


@dataclass(frozen=True)
class Candidate:
    """One setting to measure: a label, draft tokens per step and (tree methods) the tree's paths."""

    label: str
    max_draft_len: int
    tree: Tree | None = None

    def setting(self) -> dict[str, Any]:
        """The build setting as recorded: ``{"max_draft_len": K}`` (+ ``"choices"``, a list of paths)."""
        setting: dict[str, Any] = {"max_draft_len": self.max_draft_len}
        if self.tree is not None:
            setting["choices"] = self.tree.to_list()
        return setting


#: The deepest tree each tree method can draft (``None``: as deep as the tree): Medusa one level per head.
TREE_DEPTH_LIMITS: dict[Method, Callable[[SpeculativeSettings], int | None]] = {
    Method.EAGLE: lambda speculative: None,
    Method.MEDUSA: lambda speculative: speculative.num_medusa_heads,
}


def candidates_for(speculative: SpeculativeSettings, lengths: tuple[int, ...]) -> list[Candidate]:
    """The candidates to measure for an engine with these speculative settings.

    Raises:
        SpecpipeError: a baseline engine (nothing to tune) or a method the CPU runtime does not run.
        MethodTableError: a tree method without an entry in :data:`TREE_DEPTH_LIMITS`.
    """
    method = speculative.method
    if method is Method.NONE:
        raise SpecpipeError(
            "this engine is a baseline (--draft none): it has no draft length to tune; tune a speculative engine"
        )
    if method not in methods_for(Runtime.CPU):
        tunable = ", ".join(m.value for m in methods_for(Runtime.CPU) if m is not Method.NONE)
        raise SpecpipeError(f"cannot tune method {method.value!r}: tune runs {tunable} engines of the CPU runtime")
    if not METHODS[method].has_tree:
        return [Candidate(f"k{k}", k) for k in lengths]
    max_depth = entry_for(TREE_DEPTH_LIMITS, method, "bench.tune.TREE_DEPTH_LIMITS")(speculative)
    found: list[Candidate] = []
    for k in lengths:
        options = []
        if speculative.tree is not None:
            cut = speculative.tree.truncate(k)
            options.append(Candidate(f"tree-{cut.nodes}", cut.nodes, cut))
        if max_depth is None or k <= int(max_depth):
            options.append(Candidate(f"chain-{k}", k, Tree(tuple((0,) * d for d in range(1, k + 1)))))
        for option in options:
            if all(option.tree != c.tree for c in found):
                found.append(option)
    return found


def free_port() -> int:
    """An unused TCP port on this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_builder(target: str, draft: str, name: str, work_dir: Path) -> Callable[[Candidate], Path]:
    """Builds each candidate with ``build_cpu`` into ``work_dir`` as ``NAME-tune-LABEL``."""

    def build(candidate: Candidate) -> Path:
        return build_cpu(
            BuildRequest(
                target=target,
                draft=draft,
                name=f"{name}-tune-{candidate.label}",
                engines_dir=work_dir,
                max_draft_len=candidate.max_draft_len,
                choices=candidate.tree,
            )
        )

    return build


def measure(
    engine_dir: Path, label: str, work_dir: Path, prompts: list[Prompt], settings: BenchSettings, progress=None
) -> Aggregate:
    """Package ``engine_dir``, serve it, benchmark it with ``settings`` (one concurrency), stop it.

    Raises:
        SpecpipeError: packaging or serving failed, or the server died during the benchmark.
    """
    repo = package_engine(engine_dir, work_dir / "repo" / Path(engine_dir).name)
    server = LocalTritonServer(
        repo,
        grpc_port=free_port(),
        http_port=free_port(),
        metrics_port=free_port(),
        log_path=work_dir / "logs" / f"{label}.log",
        ready_timeout_s=600,
    )
    run = BenchRun(settings=settings)
    with server:
        endpoint = Endpoint(label, "triton", server.grpc_url, "ensemble", server.metrics_url)
        asyncio.run(run_bench([endpoint], prompts, settings, run, progress))
    if run.incomplete or not run.levels:
        raise SpecpipeError("; ".join(run.reasons) or "nothing was measured")
    return level_aggregate(run.levels[0])


def point(candidate: Candidate, aggregate: Aggregate | None, error: str | None = None) -> dict[str, Any]:
    """One entry of the curve (JSON-ready)."""
    entry: dict[str, Any] = {"label": candidate.label, **candidate.setting(), "error": error}
    if aggregate is not None:
        entry.update(
            output_token_throughput=aggregate.output_token_throughput,
            acceptance_rate=aggregate.acceptance_rate,
            mean_accepted_length=aggregate.mean_accepted_length,
            ttft_ms_p50=aggregate.ttft_ms.p50,
            e2e_ms_p50=aggregate.e2e_ms.p50,
            completed=aggregate.completed,
            errors=aggregate.errors,
        )
    return entry


def best_of(curve: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The entry with the highest output tokens/s among those that completed every request."""
    usable = [p for p in curve if p.get("error") is None and p.get("output_token_throughput") and not p.get("errors")]
    return max(usable, key=lambda p: p["output_token_throughput"]) if usable else None


@dataclass
class TuneResult:
    """The measured curve, the best entry (``None`` if nothing could be measured) and the record's path."""

    name: str
    curve: list[dict[str, Any]]
    best: dict[str, Any] | None
    record: Path | None


def tune(
    request: TuneRequest, builder: Callable[[Candidate], Path] | None = None, show_progress: bool = True
) -> TuneResult:
    """Measure every candidate of engine ``request.engines_dir/request.name`` and record the best (see the module doc).

    Args:
        builder: builds a candidate's engine (default: :func:`cpu_builder`).

    Raises:
        SpecpipeError: no such engine, not a CPU engine, a baseline, bad prompts.
    """
    name, engines_dir = request.name, Path(request.engines_dir)
    prompts, label = load_prompts(request.prompts)
    settings = BenchSettings(
        prompts=label,
        concurrencies=(request.concurrency,),
        max_tokens=request.max_tokens,
        num_requests=request.num_requests,
        warmup=request.warmup,
        chat=request.chat,
    )
    manifest = read_manifest(engines_dir / name)
    if manifest.runtime is not Runtime.CPU:
        raise SpecpipeError(
            f"engine {name} is for the {manifest.runtime.value} runtime: tune measures CPU engines "
            f"(tune TensorRT-LLM deployments with specpipe bench, one deployment per setting)"
        )
    speculative = manifest.speculative
    candidates = candidates_for(speculative, request.lengths)
    target = manifest.target.preset
    draft = request.draft or (manifest.draft.preset if manifest.draft else None) or speculative.method.value
    work_dir = engines_dir / f".tune-{name}"
    if builder is None:
        if not target:
            raise SpecpipeError(
                f"engine {name} was not built from a target preset: rebuild it with 'specpipe build --target ...' to tune it"
            )
        builder = cpu_builder(target, draft, name, work_dir)
    curve: list[dict[str, Any]] = []
    try:
        for candidate in candidates:
            console.rule(f"{name}: {candidate.label} (max_draft_len={candidate.max_draft_len})")
            try:
                engine = builder(candidate)
                progress = count_bars(show_progress)
                try:
                    aggregate = measure(engine, candidate.label, work_dir, prompts, settings, progress)
                finally:
                    progress.stop()
                curve.append(point(candidate, aggregate))
            except SpecpipeError as exc:
                warn(f"{candidate.label} could not be measured: {str(exc).splitlines()[0]}")
                curve.append(point(candidate, None, str(exc).splitlines()[0]))
    finally:
        if not request.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    best = best_of(curve)
    record = None
    if best is not None:
        setting = {k: best[k] for k in ("max_draft_len", "choices") if k in best}
        record = write_tuned(
            tuned_path(engines_dir, name),
            target=target,
            draft=draft,
            method=speculative.method.value,
            best=setting,
            curve=curve,
            measured_with={
                "prompts": settings.prompts,
                "concurrency": request.concurrency,
                "max_tokens": settings.max_tokens,
                "num_requests": settings.requests_for(request.concurrency),
                "warmup": settings.warmup,
            },
        )
    return TuneResult(name=name, curve=curve, best=best, record=record)


def curve_table(result: TuneResult):
    """The rich table of the curve, best row marked."""
    table = Table(title=f"specpipe tune {result.name}: output tokens/s and acceptance per setting")
    for column in (
        "setting",
        "max_draft_len",
        "out tok/s",
        "accept.",
        "acc. len",
        "TTFT ms p50",
        "e2e ms p50",
        "ok/err",
        "",
    ):
        table.add_column(column, justify="left" if column in ("setting", "") else "right")
    fmt = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"  # noqa: E731
    for p in result.curve:
        mark = (
            "[green]best[/green]" if p is result.best else (f"[red]{p['error'][:60]}[/red]" if p.get("error") else "")
        )
        table.add_row(
            p["label"],
            str(p["max_draft_len"]),
            fmt(p.get("output_token_throughput")),
            fmt(p.get("acceptance_rate"), 2),
            fmt(p.get("mean_accepted_length"), 2),
            fmt(p.get("ttft_ms_p50"), 0),
            fmt(p.get("e2e_ms_p50"), 0),
            f"{p.get('completed', 0)}/{p.get('errors', 0)}" if p.get("error") is None else "-",
            mark,
        )
    return table
