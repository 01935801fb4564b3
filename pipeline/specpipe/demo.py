"""``specpipe demo``: the main job on the embedded default model, end to end on CPU.

Builds SmolLM2-135M-Instruct as a baseline (``--draft none``) and with each speculative method,
packages a Triton repository for each, serves every repository with the real Triton server, validates
each speculative deployment against the baseline over gRPC, benchmarks them taking turns beside a
*control* (a second server of the baseline's repository), prints the results and stops the servers.
Speed-ups the control shows to be the machine's noise are printed as ``busy``
(:mod:`specpipe.bench.noise`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specpipe.bench.endpoints import Endpoint
from specpipe.bench.job import execute
from specpipe.bench.noise import BUSY, CONTROL
from specpipe.bench.prompts import load_prompts
from specpipe.bench.report import noise_report, rows, write_results
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.table import comparison_table, format_speedup
from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.client.validate import ValidationReport, report_tables, validate
from specpipe.progress import console, out
from specpipe.serve.local import LocalTritonServer
from specpipe.triton.repository import package_engine

TARGET = "smollm2-135m"
#: The benchmark name of the second server of the baseline's repository (the noise control).
CONTROL_NAME = "control"
BASELINE_NAME = "baseline"


@dataclass(frozen=True)
class DemoRequest:
    """What ``specpipe demo`` was asked to do.

    Attributes:
        drafts: speculative methods (draft presets) deployed beside the baseline.
        engines_dir, repo_dir: where engines and Triton repositories go.
        base_port: the first port used (3 per server: the deployments, then the control).
        bench_requests: benchmark requests per deployment and concurrency (0 skips the benchmark and the
            control). 8 lets concurrency 4 run in 2 rounds of one full batch each. Measured on 2 shared
            cores: the benchmark took 6.6 min (5.5 s a request at concurrency 1, 7.8 s a batch of 4);
            the former 4 requests, 5 deployments, no control: about 3 min.
        bench_concurrency: load levels (requests in flight); 1 and 4 show what load does to throughput
            and TTFT while keeping the demo short on 2 cores.
        bench_rounds: the deployments take turns, each level in up to this many rounds (a counted level
            has at most requests / concurrency rounds: 4 of 2 requests at concurrency 1, 2 of 4 at 4 by
            default), so a busy stretch of the machine falls on several deployments and on the control.
        bench_out: the benchmark's output folder.
    """

    drafts: tuple[str, ...] = ("ngram", "smollm2-draft", "medusa", "eagle")
    engines_dir: Path = Path("engines")
    repo_dir: Path = Path("triton_repo")
    base_port: int = 8101
    bench_requests: int = 8
    bench_concurrency: tuple[int, ...] = (1, 4)
    bench_rounds: int = 4
    bench_out: Path = Path("bench-results/demo")


def server_plan(request: DemoRequest) -> list[tuple[str, str, int]]:
    """The servers the demo starts: ``(server name, draft whose repository it serves, HTTP port)``.

    Server ``i`` uses HTTP ``base_port + 3i``, gRPC ``+1``, metrics ``+2``: the baseline (``none``) first,
    then each draft, then, when there is a benchmark, :data:`CONTROL_NAME` serving the baseline's repository.
    """
    names = ["none", *[d for d in dict.fromkeys(request.drafts) if d != "none"]]
    plan = [(name, name) for name in names] + ([(CONTROL_NAME, "none")] if request.bench_requests > 0 else [])
    return [(name, draft, request.base_port + 3 * i) for i, (name, draft) in enumerate(plan)]


def bench_name(server: str) -> str:
    """The benchmark's name for a demo server (``none`` is the baseline)."""
    return BASELINE_NAME if server == "none" else server


def bench_endpoints(servers: dict) -> list[Endpoint]:
    """One Triton endpoint per running server (anything with ``grpc_url`` and ``metrics_url``, by server
    name), in turn order: the baseline first and the control in the middle of the speculative ones, so
    that a busy stretch of at most a few turns always overlaps the baseline's or the control's."""
    named = [
        Endpoint(bench_name(name), "triton", server.grpc_url, "ensemble", server.metrics_url)
        for name, server in servers.items()
        if name != CONTROL_NAME
    ]
    if CONTROL_NAME in servers:
        control = servers[CONTROL_NAME]
        speculative = len(named) - 1
        named.insert(
            1 + (speculative + 1) // 2,
            Endpoint(CONTROL_NAME, "triton", control.grpc_url, "ensemble", control.metrics_url),
        )
    return named


def bench_settings(request: DemoRequest, with_control: bool = True) -> BenchSettings:
    """The benchmark of the demo: chat prompts, 128 new tokens, the deployments taking turns in rounds."""
    return BenchSettings(
        prompts="chat",
        concurrencies=tuple(request.bench_concurrency),
        max_tokens=128,
        num_requests=request.bench_requests,
        chat=True,
        baseline=BASELINE_NAME,
        rounds=request.bench_rounds,
        control=CONTROL_NAME if with_control else None,
    )


def run_demo(request: DemoRequest) -> bool:
    """Run the whole pipeline; return True when every validation passed.

    Ports: see :func:`server_plan`. With ``bench_requests`` > 0 the deployments and the control are then
    benchmarked taking turns (chat prompts, 128 new tokens, at each of ``bench_concurrency``), the
    comparison table, JSON, CSV and plot are written to ``bench_out``, and the closing summary shows a
    speed-up as ``busy`` where the control rule (:mod:`specpipe.bench.noise`) found the machine too busy,
    naming why. Each server's cold start (time to ready, model load times) is printed.

    Raises:
        SpecpipeError: a build, packaging or server start failed (with the cause).
    """
    engines_dir, repo_dir = Path(request.engines_dir), Path(request.repo_dir)
    plan = server_plan(request)
    repos = {}
    for _, draft, _ in plan:
        if draft in repos:
            continue
        console.rule(f"build + package: {TARGET} / {draft}")
        engine = build_cpu(BuildRequest(target=TARGET, draft=draft, engines_dir=engines_dir))
        repos[draft] = package_engine(engine, repo_dir / engine.name)
        console.print(f"[green]✓[/green] Triton repository {repos[draft]}")

    reports = {}
    run = None
    with ExitStack() as stack:
        servers = {}
        for name, draft, port in plan:
            server = LocalTritonServer(repos[draft], grpc_port=port + 1, http_port=port, metrics_port=port + 2)
            stack.enter_context(server)
            servers[name] = server
        for name, server in servers.items():
            with console.status(f"waiting for Triton ({name}) to load its models"):
                server.wait_ready(timeout_s=300)
            cold = server.cold_start()
            console.print(
                f"[green]✓[/green] Triton serving {name}: gRPC {server.grpc_url}"
                + (f" ({cold.summary()}; servers load in parallel)" if cold else "")
            )
        baseline_url = servers["none"].grpc_url
        for name, server in servers.items():
            if name == CONTROL_NAME:
                continue  # the baseline's own repository, validated as the baseline
            console.rule(f"validate: {name}")
            report = validate(server.grpc_url, None if name == "none" else baseline_url)
            for table in report_tables(report):
                out.print(table)
            reports[name] = report
        if request.bench_requests > 0:
            run = _bench(servers, request)
        console.rule("stopping servers")

    out.print(summary_table(reports, run))
    for line in busy_lines(run, request.bench_out):
        out.print(line)
    return all(r.passed for r in reports.values())


def _bench(servers: dict, request: DemoRequest) -> BenchRun:
    """Every deployment and the control, taking turns: prints the comparison table, writes the result files."""
    console.rule("benchmark: taking turns, with a control (the baseline again)")
    run = execute(bench_endpoints(servers), load_prompts("chat")[0], bench_settings(request, CONTROL_NAME in servers))
    Console(stderr=True, width=max(console.width, 180)).print(comparison_table(run))
    written = write_results(run, request.bench_out)
    console.print(f"benchmark results: {', '.join(str(p) for p in written.values())}")
    return run


def summary_table(reports: dict[str, ValidationReport], run: BenchRun | None) -> Table:
    """The closing table, one row per deployment (then the control), at most 80 columns wide.

    Args:
        reports: validation reports by server name (``none`` is the baseline).
        run: the benchmark (``None``: skipped). Its lowest and highest concurrency are shown one above
            the other in each benchmark cell; a speed-up is ``busy`` where the control rule found the
            machine too busy, ``~`` where it lies within the control's spread; the control's row shows
            its throughput over the baseline's.
    """
    by_deployment: dict[str, list[dict]] = {}
    for row in rows(run) if run is not None else []:
        by_deployment.setdefault(row["level"].deployment, []).append(row)
    ends = _ends(run)
    table = Table(
        title=f"specpipe demo: {TARGET} on the CPU runtime (via Triton gRPC)", caption=_summary_caption(run, ends)
    )
    for column in ("deployment", "checks", "accept", "acc.\nlen", "conc.", "tok/s", "speed-up", "TTFT\nms"):
        table.add_column(column, justify="left" if column == "deployment" else "right", no_wrap=column == "deployment")
    mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
    names = [*reports, *([CONTROL_NAME] if CONTROL_NAME in by_deployment else [])]
    for name in names:
        report = reports.get(name)
        validation = (
            ("-", "-", "-")
            if report is None
            else (
                f"{sum(c.passed for c in report.checks)}/{len(report.checks)}"
                + ("" if report.passed else "\n[red]FAILED[/red]"),
                f"{mean([r.acceptance_rate for r in report.requests]):.2f}",
                f"{mean([r.mean_accepted_length for r in report.requests]):.2f}",
            )
        )
        table.add_row(name, *validation, *_bench_cells(by_deployment.get(bench_name(name), []), ends))
    return table


def _ends(run: BenchRun | None) -> list[int]:
    """The lowest and the highest concurrency of ``run`` (one when a single level ran)."""
    if run is None or not run.settings.concurrencies:
        return []
    levels = sorted(set(run.settings.concurrencies))
    return [levels[0], levels[-1]] if len(levels) > 1 else levels


def _summary_caption(run: BenchRun | None, ends: list[int]) -> str:
    text = "accept / acc. len: acceptance rate and mean accepted length (validation prompts, greedy)"
    if run is None:
        return text
    return (
        text + f"; tok/s, speed-up, TTFT p50 at concurrency {' / '.join(map(str, ends))}: the benchmark (chat "
        "prompts, 128 tokens, deployments taking turns); control: the baseline served twice, its tok/s over "
        "the baseline's; ~: a speed-up within the control's spread; busy: not a result (the machine was too busy)"
    )


def _bench_cells(levels: list[dict], ends: list[int]) -> tuple[str, str, str, str]:
    """Concurrency, tok/s, speed-up and TTFT p50 at each of ``ends``, one line each."""
    if not levels:
        return ("-", "-", "-", "-")
    found = {row["level"].concurrency: row for row in levels}

    def cell(row: dict | None, what: str) -> str:
        if row is None:
            return "-"
        aggregate = row["aggregate"]
        if what == "tok/s":
            return "-" if aggregate.output_token_throughput is None else f"{aggregate.output_token_throughput:.1f}"
        if what == "speed-up":
            return format_speedup(row["speedup"], None if row["verdict"] == CONTROL else row["verdict"])
        return "-" if aggregate.ttft_ms.p50 is None else f"{aggregate.ttft_ms.p50:.0f}"

    return (
        "\n".join(map(str, ends)),
        *("\n".join(cell(found.get(c), what) for c in ends) for what in ("tok/s", "speed-up", "TTFT")),
    )


def busy_lines(run: BenchRun | None, bench_out: Path) -> list[str]:
    """What the control rule found, for the end of the demo's output: the busy (or unchecked) findings,
    each on a line, and where the raw figures went; one quiet line naming the control's ratios otherwise;
    nothing without a benchmark or a control."""
    if run is None or run.settings.control is None:
        return []
    noise = noise_report(run)
    ratios = ", ".join(
        f"{n.control_ratio:.2f}x at concurrency {c}"
        for c, n in sorted(noise.levels.items())
        if n.control_ratio is not None
    )
    if not noise.busy:
        quiet = f"control (the baseline served twice): {ratios or 'not measured'} the baseline's tok/s"
        return [quiet, *noise.messages()]
    shown = [f"[yellow]{line}[/yellow]" for line in noise.messages()]
    return [
        *shown,
        f"speed-ups marked {BUSY} are not results; the raw figures are in {Path(bench_out) / 'bench.json'} "
        f'(verdict "{BUSY}"); rerun on a quieter machine, or with more --bench-requests',
    ]
