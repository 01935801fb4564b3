"""``specpipe tune NAME``: measure a CPU engine at several draft lengths and record the best one.

For each candidate setting the engine is rebuilt with that setting (``build_cpu``: the target's
weights are hard links, so a rebuild is cheap), packaged, served by its own Triton server, warmed up
and benchmarked at one concurrency with the same prompts; then the server is stopped. Candidates:

- linear methods (``ngram``, ``draft-model``): ``max_draft_len`` = each value of ``--max-draft-len``;
- tree methods (``eagle``, ``medusa``): for each value K, the engine's own tree cut to its first K
  nodes (``tree-K``, every node kept after its parent) and a single chain of depth K (``chain-K``;
  for Medusa no deeper than its heads).

The best candidate (highest output tokens/s) is written to ``ENGINES_DIR/NAME.tuned.json``
(:mod:`specpipe.bench.tuned`), which the next ``specpipe build`` of that engine uses.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specpipe.bench.prompts import Prompt
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.stats import Aggregate
from specpipe.errors import SpecpipeError

TREE_METHODS = ("eagle", "medusa")


@dataclass(frozen=True)
class Candidate:
    """One setting to measure: a label, draft tokens per step and (tree methods) the tree's paths."""

    label: str
    max_draft_len: int
    choices: tuple[tuple[int, ...], ...] | None = None

    def setting(self) -> dict[str, Any]:
        """The build setting as recorded: ``{"max_draft_len": K}`` (+ ``"choices"``)."""
        setting: dict[str, Any] = {"max_draft_len": self.max_draft_len}
        if self.choices is not None:
            setting["choices"] = [list(p) for p in self.choices]
        return setting


def parse_lengths(text: str) -> tuple[int, ...]:
    """``--max-draft-len`` candidates, ``"1,2,4"`` -> ``(1, 2, 4)``.

    Raises:
        SpecpipeError: an item that is not a positive integer.
    """
    from specpipe.bench.command import parse_positive_ints

    return parse_positive_ints(text, "--max-draft-len", "1,2,3,4,6,8")


def truncate_tree(paths: list[list[int]], nodes: int) -> tuple[tuple[int, ...], ...]:
    """The first ``nodes`` paths of ``paths`` whose parent is already kept (a valid tree)."""
    kept: list[tuple[int, ...]] = []
    for path in paths:
        path = tuple(path)
        if len(kept) == nodes:
            break
        if len(path) == 1 or path[:-1] in kept:
            kept.append(path)
    return tuple(kept)


def candidates_for(speculative: dict[str, Any], lengths: tuple[int, ...]) -> list[Candidate]:
    """The candidates to measure for an engine whose manifest has this ``speculative`` block.

    Raises:
        SpecpipeError: a baseline engine (nothing to tune) or an unknown method.
    """
    method = speculative.get("method")
    if method == "none":
        raise SpecpipeError("this engine is a baseline (--draft none): it has no draft length to tune; tune a speculative engine")
    if method in ("ngram", "draft-model"):
        return [Candidate(f"k{k}", k) for k in lengths]
    if method not in TREE_METHODS:
        raise SpecpipeError(f"cannot tune method {method!r}: tune runs ngram, draft-model, eagle and medusa engines of the CPU runtime")
    tree = speculative.get("choices") or []
    max_depth = speculative.get("num_medusa_heads") if method == "medusa" else None
    found: list[Candidate] = []
    for k in lengths:
        options = []
        if tree:
            cut = truncate_tree(tree, k)
            options.append(Candidate(f"tree-{len(cut)}", len(cut), cut))
        if max_depth is None or k <= int(max_depth):
            options.append(Candidate(f"chain-{k}", k, tuple(tuple([0] * d) for d in range(1, k + 1))))
        for option in options:
            if all(option.choices != c.choices for c in found):
                found.append(option)
    return found


def free_port() -> int:
    """An unused TCP port on this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_builder(target: str, draft: str, name: str, work_dir: Path) -> Callable[[Candidate], Path]:
    """Builds each candidate with ``build_cpu`` into ``work_dir`` as ``NAME-tune-LABEL``."""
    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest

    def build(candidate: Candidate) -> Path:
        choices = json.dumps(candidate.setting()["choices"]) if candidate.choices is not None else None
        return build_cpu(BuildRequest(target=target, draft=draft, name=f"{name}-tune-{candidate.label}", engines_dir=work_dir,
                                      max_draft_len=candidate.max_draft_len, choices=choices))

    return build


def measure(engine_dir: Path, label: str, work_dir: Path, prompts: list[Prompt], settings: BenchSettings, progress=None) -> Aggregate:
    """Package ``engine_dir``, serve it, benchmark it with ``settings`` (one concurrency), stop it.

    Raises:
        SpecpipeError: packaging or serving failed, or the server died during the benchmark.
    """
    from specpipe.bench.endpoints import Endpoint
    from specpipe.bench.runner import run_bench
    from specpipe.bench.stats import level_aggregate
    from specpipe.serve.local import LocalTritonServer
    from specpipe.triton.repository import package_engine

    repo = package_engine(engine_dir, work_dir / "repo" / Path(engine_dir).name)
    server = LocalTritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                               log_path=work_dir / "logs" / f"{label}.log", ready_timeout_s=600)
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
        entry.update(output_token_throughput=aggregate.output_token_throughput, acceptance_rate=aggregate.acceptance_rate,
                     mean_accepted_length=aggregate.mean_accepted_length, ttft_ms_p50=aggregate.ttft_ms.p50,
                     e2e_ms_p50=aggregate.e2e_ms.p50, completed=aggregate.completed, errors=aggregate.errors)
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


def tune_engine(name: str, engines_dir: Path, prompts: list[Prompt], settings: BenchSettings, lengths: tuple[int, ...],
                draft: str | None = None, builder: Callable[[Candidate], Path] | None = None, keep: bool = False,
                show_progress: bool = True) -> TuneResult:
    """Measure every candidate of engine ``engines_dir/name`` and record the best (see the module doc).

    Args:
        settings: benchmark settings with exactly one concurrency.
        draft: the draft preset the engine was built from (default: read from its manifest).
        builder: builds a candidate's engine (default: :func:`cpu_builder`).
        keep: keep the candidates' engines, repositories and logs in ``engines_dir/.tune-NAME``.

    Raises:
        SpecpipeError: no such engine, not a CPU engine, a baseline, or no candidate could be measured.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specpipe.bench.tuned import tuned_path, write_tuned
    from specpipe.manifest import read_manifest_json
    from specpipe.progress import console

    engines_dir = Path(engines_dir)
    manifest = read_manifest_json(engines_dir / name)
    if manifest.get("runtime") != "cpu":
        raise SpecpipeError(f"engine {name} is for the {manifest.get('runtime')} runtime: tune measures CPU engines "
                            f"(tune TensorRT-LLM deployments with specpipe bench, one deployment per setting)")
    speculative = manifest.get("speculative", {})
    candidates = candidates_for(speculative, lengths)
    target = (manifest.get("target") or {}).get("preset")
    draft = draft or (manifest.get("draft") or {}).get("preset") or speculative["method"]
    work_dir = engines_dir / f".tune-{name}"
    if builder is None:
        if not target:
            raise SpecpipeError(f"engine {name} was not built from a target preset: rebuild it with 'specpipe build --target ...' to tune it")
        builder = cpu_builder(target, draft, name, work_dir)
    curve: list[dict[str, Any]] = []
    try:
        for candidate in candidates:
            console.rule(f"{name}: {candidate.label} (max_draft_len={candidate.max_draft_len})")
            try:
                engine = builder(candidate)
                progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    console=console, disable=not show_progress)
                try:
                    aggregate = measure(engine, candidate.label, work_dir, prompts, settings, progress)
                finally:
                    progress.stop()
                curve.append(point(candidate, aggregate))
            except SpecpipeError as exc:
                console.print(f"[yellow]![/yellow] {candidate.label} could not be measured: {str(exc).splitlines()[0]}", highlight=False)
                curve.append(point(candidate, None, str(exc).splitlines()[0]))
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    best = best_of(curve)
    record = None
    if best is not None:
        setting = {k: best[k] for k in ("max_draft_len", "choices") if k in best}
        record = write_tuned(tuned_path(engines_dir, name), target=target, draft=draft, method=speculative["method"], best=setting,
                             curve=curve, measured_with={"prompts": settings.prompts, "concurrency": settings.concurrencies[0],
                                                         "max_tokens": settings.max_tokens, "num_requests": settings.requests_for(settings.concurrencies[0]),
                                                         "warmup": settings.warmup})
    return TuneResult(name=name, curve=curve, best=best, record=record)


def curve_table(result: TuneResult):
    """The rich table of the curve, best row marked."""
    from rich.table import Table

    table = Table(title=f"specpipe tune {result.name}: output tokens/s and acceptance per setting")
    for column in ("setting", "max_draft_len", "out tok/s", "accept.", "acc. len", "TTFT ms p50", "e2e ms p50", "ok/err", ""):
        table.add_column(column, justify="left" if column in ("setting", "") else "right")
    fmt = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"  # noqa: E731
    for p in result.curve:
        mark = "[green]best[/green]" if p is result.best else (f"[red]{p['error'][:60]}[/red]" if p.get("error") else "")
        table.add_row(p["label"], str(p["max_draft_len"]), fmt(p.get("output_token_throughput")), fmt(p.get("acceptance_rate"), 2),
                      fmt(p.get("mean_accepted_length"), 2), fmt(p.get("ttft_ms_p50"), 0), fmt(p.get("e2e_ms_p50"), 0),
                      f"{p.get('completed', 0)}/{p.get('errors', 0)}" if p.get("error") is None else "-", mark)
    return table
