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
        if bench_requests > 0:
            _bench(servers, bench_requests, bench_out)
        console.rule("stopping servers")

    summary = Table(title=f"specpipe demo: {TARGET} on the CPU runtime (greedy, via Triton gRPC)")
    for column in ("deployment", "checks", "acceptance rate", "mean accepted length", "tokens/s"):
        summary.add_column(column, justify="left" if column == "deployment" else "right")
    for draft, report in reports.items():
        figures = report.requests
        tokens = sum(r.output_tokens for r in figures)
        seconds = sum(r.latency_ms for r in figures) / 1000
        passed = sum(c.passed for c in report.checks)
        mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
        summary.add_row(
            draft,
            f"{passed}/{len(report.checks)}" + ("" if report.passed else " [red]FAILED[/red]"),
            f"{mean([r.acceptance_rate for r in figures]):.2f}",
            f"{mean([r.mean_accepted_length for r in figures]):.2f}",
            f"{tokens / seconds:.1f}" if seconds else "-",
        )
    console.print(summary)
    return all(r.passed for r in reports.values())


def _bench(servers: dict, requests: int, out_dir: Path) -> None:
    """Baseline vs speculative on the running servers: the comparison table and result files."""
    from specpipe.bench.command import execute
    from specpipe.bench.endpoints import Endpoint
    from specpipe.bench.prompts import load_prompts
    from specpipe.bench.report import comparison_table, write_results
    from specpipe.bench.runner import BenchSettings

    console.rule("benchmark: baseline vs speculative")
    endpoints = [
        Endpoint("baseline" if draft == "none" else draft, "triton", server.grpc_url, "ensemble", server.metrics_url)
        for draft, server in servers.items()
    ]
    settings = BenchSettings(prompts="chat", concurrencies=(1,), max_tokens=128, num_requests=requests, chat=True)
    run = execute(endpoints, load_prompts("chat")[0], settings)
    console.print(comparison_table(run))
    written = write_results(run, out_dir)
    console.print(f"benchmark results: {', '.join(str(p) for p in written.values())}")
