"""``specpipe demo``: the whole pipeline on the embedded default model."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specpipe.cli.options import PORT, PositiveIntList, engines_dir_option, repo_dir_option


@click.command()
@click.option(
    "--drafts",
    default="ngram,smollm2-draft,medusa,eagle",
    show_default=True,
    help="Speculative methods (draft presets) to deploy beside the baseline, comma-separated.",
)
@engines_dir_option()
@repo_dir_option()
@click.option(
    "--base-port",
    type=PORT,
    default=8101,
    show_default=True,
    help="First of the ports used (3 per server: each deployment, then the benchmark's control).",
)
@click.option(
    "--bench-requests",
    type=click.IntRange(min=0),
    default=8,
    show_default=True,
    help="Benchmark requests per deployment and concurrency (0 skips the benchmark and its control).",
)
@click.option(
    "--bench-concurrency",
    type=PositiveIntList("1,4 (requests in flight)"),
    default="1,4",
    show_default=True,
    help="Benchmark load levels, comma-separated.",
)
@click.option(
    "--bench-rounds",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="The deployments take turns, each level in up to this many rounds (at most requests / concurrency).",
)
@click.option(
    "--bench-out",
    type=click.Path(path_type=Path),
    default=Path("bench-results/demo"),
    show_default=True,
    help="Output folder of the benchmark's table, JSON, CSV and plot.",
)
def demo(drafts, **options) -> None:
    """The main job on the embedded default: build, package, serve, validate and benchmark SmolLM2 end to end.

    The benchmark runs a control beside the deployments (a second server of the baseline); where it shows
    the machine was too busy, the summary prints "busy" instead of the speed-ups."""
    from specpipe.demo import DemoRequest, run_demo

    ok = run_demo(DemoRequest(drafts=tuple(d for d in drafts.split(",") if d), **options))
    sys.exit(0 if ok else 1)
