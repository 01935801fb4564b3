"""``specpipe demo``: the main job on the embedded default model, end to end on CPU.

Builds SmolLM2-135M-Instruct as a baseline (``--draft none``) and with each speculative method,
packages a Triton repository for each, serves every repository with the real Triton server, validates
each speculative deployment against the baseline over gRPC, prints the results and stops the servers.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from specpipe.build_request import BuildRequest
from specpipe.progress import console

TARGET = "smollm2-135m"


def run_demo(drafts: list[str], *, engines_dir: Path, repo_dir: Path, base_port: int,
             bench_requests: int = 4, bench_out: Path = Path("bench-results/demo")) -> bool:
    """Run the whole pipeline; return True when every validation passed.

    Ports: deployment ``i`` (baseline first) uses HTTP ``base_port + 3i``, gRPC ``+1``, metrics ``+2``.
    With ``bench_requests`` > 0 the deployments are then benchmarked side by side (chat prompts,
    128 new tokens, concurrency 1) and the comparison table, JSON, CSV and plot are written to
    ``bench_out``.

    Raises:
        SpecpipeError: a build, packaging or server start failed (with the cause).
    """
    from rich.table import Table

    from specpipe.build_cpu import build_cpu
    from specpipe.client.validate import print_report, validate
    from specpipe.serve.local import LocalTritonServer
    from specpipe.triton.repository import package_engine

    names = ["none", *[d for d in drafts if d != "none"]]
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
            console.print(f"[green]✓[/green] Triton serving {draft}: gRPC {server.grpc_url}")
        baseline_url = servers["none"].grpc_url
        for draft, server in servers.items():
            console.rule(f"validate: {draft}")
            report = validate(server.grpc_url, None if draft == "none" else baseline_url)
            print_report(report)
            reports[draft] = report
        bench_rows = _bench(servers, bench_requests, bench_out) if bench_requests > 0 else {}
        console.rule("stopping servers")

    summary = Table(title=f"specpipe demo: {TARGET} on the CPU runtime (via Triton gRPC)",
                    caption="accept / acc.len: acceptance rate and mean accepted length (validation prompts, greedy); "
                            "tok/s, speed-up, TTFT p50: the benchmark (chat prompts, 128 tokens)")
    for column in ("deployment", "checks", "accept", "acc.len", "tok/s", "speed-up", "TTFT ms"):
        summary.add_column(column, justify="left" if column == "deployment" else "right", no_wrap=True)
    for draft, report in reports.items():
        figures = report.requests
        passed = sum(c.passed for c in report.checks)
        mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
        row = bench_rows.get("baseline" if draft == "none" else draft)
        summary.add_row(
            draft,
            f"{passed}/{len(report.checks)}" + ("" if report.passed else " [red]FAILED[/red]"),
            f"{mean([r.acceptance_rate for r in figures]):.2f}",
            f"{mean([r.mean_accepted_length for r in figures]):.2f}",
            *(_bench_cells(row) if row else ("-", "-", "-")),
        )
    console.print(summary)
    return all(r.passed for r in reports.values())


def _bench(servers: dict, requests: int, out_dir: Path) -> dict:
    """Baseline vs speculative on the running servers: prints the comparison table, writes the result
    files, returns the summary row of each deployment (see :func:`specpipe.bench.report.rows`)."""
    from rich.console import Console

    from specpipe.bench.command import execute
    from specpipe.bench.endpoints import Endpoint
    from specpipe.bench.prompts import load_prompts
    from specpipe.bench.report import comparison_table, rows, write_results
    from specpipe.bench.runner import BenchSettings

    console.rule("benchmark: baseline vs speculative")
    endpoints = [
        Endpoint("baseline" if draft == "none" else draft, "triton", server.grpc_url, "ensemble", server.metrics_url)
        for draft, server in servers.items()
    ]
    settings = BenchSettings(prompts="chat", concurrencies=(1,), max_tokens=128, num_requests=requests, chat=True)
    run = execute(endpoints, load_prompts("chat")[0], settings)
    Console(stderr=True, width=max(console.width, 180)).print(comparison_table(run))
    written = write_results(run, out_dir)
    console.print(f"benchmark results: {', '.join(str(p) for p in written.values())}")
    return {row["level"].deployment: row for row in rows(run)}


def _bench_cells(row: dict) -> tuple[str, str, str]:
    aggregate, speedup = row["aggregate"], row["speedup"]
    ttft = aggregate.ttft_ms.p50
    return (
        f"{aggregate.output_token_throughput:.1f}",
        "-" if speedup is None else f"{speedup:.2f}x",
        "-" if ttft is None else f"{ttft:.0f}",
    )
