"""``specpipe demo``: the main job on the embedded default model, end to end on CPU.

Builds SmolLM2-135M-Instruct as a baseline (``--draft none``) and with each speculative method,
packages a Triton repository for each, serves every repository with the real Triton server, validates
each speculative deployment against the baseline over gRPC, prints the results and stops the servers.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.job import execute
from specpipe.bench.prompts import load_prompts
from specpipe.bench.report import comparison_table, rows, write_results
from specpipe.bench.runner import BenchSettings
from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.client.validate import report_tables, validate
from specpipe.progress import console, out
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

TARGET = "smollm2-135m"


@dataclass(frozen=True)
class DemoRequest:
    """What ``specpipe demo`` was asked to do.

    Attributes:
        drafts: speculative methods (draft presets) deployed beside the baseline.
        engines_dir, repo_dir: where engines and Triton repositories go.
        base_port: the first port used (3 per deployment).
        bench_requests: benchmark requests per deployment and concurrency (0 skips the benchmark).
        bench_concurrency: load levels (requests in flight); 1 and 4 show what load does to throughput
            and TTFT while keeping the demo short on 2 cores.
        bench_out: the benchmark's output folder.
    """

    drafts: tuple[str, ...] = ("ngram", "smollm2-draft", "medusa", "eagle")
    engines_dir: Path = Path("engines")
    repo_dir: Path = Path("triton_repo")
    base_port: int = 8101
    bench_requests: int = 4
    bench_concurrency: tuple[int, ...] = (1, 4)
    bench_out: Path = Path("bench-results/demo")


def run_demo(request: DemoRequest) -> bool:
    """Run the whole pipeline; return True when every validation passed.

    Ports: deployment ``i`` (baseline first) uses HTTP ``base_port + 3i``, gRPC ``+1``, metrics ``+2``.
    With ``bench_requests`` > 0 the deployments are then benchmarked side by side (chat prompts,
    128 new tokens, at each of ``bench_concurrency``) and the comparison table, JSON, CSV and plot are
    written to ``bench_out``. Each server's cold start (time to ready, model load times) is printed.

    Raises:
        SpecpipeError: a build, packaging or server start failed (with the cause).
    """
    engines_dir, repo_dir, base_port = Path(request.engines_dir), Path(request.repo_dir), request.base_port
    names = ["none", *[d for d in request.drafts if d != "none"]]
    repos = {}
    for draft in names:
        console.rule(f"build + package: {TARGET} / {draft}")
        engine = build_cpu(BuildRequest(target=TARGET, draft=draft, engines_dir=engines_dir))
        repos[draft] = package_engine(engine, repo_dir / engine.name)
        console.print(f"[green]✓[/green] Triton repository {repos[draft]}")

    reports = {}
    bench_rows: dict = {}
    with ExitStack() as stack:
        servers = {}
        for i, draft in enumerate(names):
            port = base_port + 3 * i
            server = LocalTritonServer(repos[draft], grpc_port=port + 1, http_port=port, metrics_port=port + 2)
            stack.enter_context(server)
            servers[draft] = server
        for draft, server in servers.items():
            with console.status(f"waiting for Triton ({draft}) to load its models"):
                server.wait_ready(timeout_s=300)
            cold = server.cold_start()
            console.print(f"[green]✓[/green] Triton serving {draft}: gRPC {server.grpc_url}"
                          + (f" ({cold.summary()}; servers load in parallel)" if cold else ""))
        baseline_url = servers["none"].grpc_url
        for draft, server in servers.items():
            console.rule(f"validate: {draft}")
            report = validate(server.grpc_url, None if draft == "none" else baseline_url)
            for table in report_tables(report):
                out.print(table)
            reports[draft] = report
        bench_rows = (_bench(servers, request.bench_requests, request.bench_concurrency, request.bench_out)
                      if request.bench_requests > 0 else {})
        console.rule("stopping servers")

    summary = Table(title=f"specpipe demo: {TARGET} on the CPU runtime (via Triton gRPC)",
                    caption="accept / acc.len: acceptance rate and mean accepted length (validation prompts, greedy); "
                            "tok/s, speed-up, TTFT p50: the benchmark (chat prompts, 128 tokens) at concurrency 1 / "
                            "the highest level")
    for column in ("deployment", "checks", "accept", "acc.len", "tok/s", "speed-up", "TTFT ms"):
        summary.add_column(column, justify="left" if column == "deployment" else "right", no_wrap=True)
    for draft, report in reports.items():
        figures = report.requests
        passed = sum(c.passed for c in report.checks)
        mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
        levels = bench_rows.get("baseline" if draft == "none" else draft)
        summary.add_row(
            draft,
            f"{passed}/{len(report.checks)}" + ("" if report.passed else " [red]FAILED[/red]"),
            f"{mean([r.acceptance_rate for r in figures]):.2f}",
            f"{mean([r.mean_accepted_length for r in figures]):.2f}",
            *(_bench_cells(levels) if levels else ("-", "-", "-")),
        )
    out.print(summary)
    return all(r.passed for r in reports.values())


def _bench(servers: dict, requests: int, concurrency: tuple[int, ...], out_dir: Path) -> dict:
    """Baseline vs speculative on the running servers: prints the comparison table, writes the result
    files, returns each deployment's summary rows by concurrency (see :func:`specpipe.bench.report.rows`)."""
    console.rule("benchmark: baseline vs speculative")
    endpoints = [
        Endpoint("baseline" if draft == "none" else draft, "triton", server.grpc_url, "ensemble", server.metrics_url)
        for draft, server in servers.items()
    ]
    settings = BenchSettings(prompts="chat", concurrencies=tuple(concurrency), max_tokens=128, num_requests=requests, chat=True)
    run = execute(endpoints, load_prompts("chat")[0], settings)
    Console(stderr=True, width=max(console.width, 180)).print(comparison_table(run))
    written = write_results(run, out_dir)
    console.print(f"benchmark results: {', '.join(str(p) for p in written.values())}")
    found: dict[str, list[dict]] = {}
    for row in rows(run):
        found.setdefault(row["level"].deployment, []).append(row)
    return found


def _bench_cells(levels: list[dict]) -> tuple[str, str, str]:
    """tok/s, speed-up and TTFT p50 at the lowest and the highest concurrency, ``a / b``."""
    ends = [levels[0], levels[-1]] if len(levels) > 1 else levels[:1]

    def cell(row: dict, what: str) -> str:
        aggregate, speedup = row["aggregate"], row["speedup"]
        if what == "tok/s":
            return "-" if aggregate.output_token_throughput is None else f"{aggregate.output_token_throughput:.1f}"
        if what == "speed-up":
            return "-" if speedup is None else f"{speedup:.2f}x"
        return "-" if aggregate.ttft_ms.p50 is None else f"{aggregate.ttft_ms.p50:.0f}"

    return tuple(" / ".join(cell(row, what) for row in ends) for what in ("tok/s", "speed-up", "TTFT"))
