"""``specpipe bench`` and ``specpipe tune``: options -> one request -> one library call; the tables."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specpipe.cli.options import POSITIVE, SECONDS, PositiveIntList, engines_dir_option

PROMPTS_HELP = 'Built-in set (chat, code, summarize) or a JSONL file of {"prompt": ...}.'


class RateList(click.ParamType):
    """``0.5,1,2`` -> ``(0.5, 1.0, 2.0)``: finite request rates above 0, requests/s, duplicates dropped."""

    name = "R[,R...]"

    def convert(self, value, param, ctx) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        rates: list[float] = []
        for item in str(value).split(","):
            try:
                rate = float(item.strip())
            except ValueError:
                rate = 0.0
            if not 0 < rate < float("inf"):
                self.fail(
                    f"must list request rates above 0 (requests/s), e.g. 0.5,1,2; got {item.strip()!r}", param, ctx
                )
            if rate not in rates:
                rates.append(rate)
        return tuple(rates)


@click.command()
@click.option(
    "--url",
    "urls",
    multiple=True,
    required=True,
    help="Deployment NAME=HOST:PORT (Triton gRPC) or NAME=openai://HOST:PORT/v1 (OpenAI-compatible); repeat it. "
    "The one named 'baseline' is the reference for speed-ups.",
)
@click.option("--prompts", default="chat", show_default=True, help=PROMPTS_HELP)
@click.option(
    "--concurrency",
    type=PositiveIntList("1,2,4,8 (requests in flight)"),
    default="1,2,4,8",
    show_default=True,
    help="Requests in flight, one load level each.",
)
@click.option(
    "--request-rate",
    type=RateList(),
    default=(),
    show_default=False,
    help="Open loop instead of --concurrency: Poisson arrivals at each rate, requests/s (seeded by --seed), "
    "sent on schedule whatever is in flight; the table shows offered and achieved req/s.",
)
@click.option(
    "--max-concurrency",
    type=POSITIVE,
    default=None,
    help="With --request-rate: requests in flight at most (later arrivals wait for a free slot).",
)
@click.option("--max-tokens", type=POSITIVE, default=128, show_default=True, help="New tokens per request.")
@click.option(
    "--input-len",
    type=POSITIVE,
    default=None,
    help="Synthetic prompts of exactly N tokens (the deployment's tokenizer, or --tokenizer) instead of --prompts.",
)
@click.option(
    "--output-len",
    type=POSITIVE,
    default=None,
    help="New tokens per request (replaces --max-tokens); exactly N with --ignore-eos.",
)
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Generate every requested token whatever the end-of-sequence token "
    "(Triton: min_tokens = max tokens; OpenAI: ignore_eos + min_tokens).",
)
@click.option(
    "--temperature", type=click.FloatRange(min=0), default=None, help="Sample at this temperature (default: greedy)."
)
@click.option(
    "--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=None, help="Sample with this nucleus mass."
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Base seed: request i of a level samples with seed + i (recorded); also seeds --request-rate arrivals.",
)
@click.option(
    "--num-requests",
    type=POSITIVE,
    default=None,
    help="Requests per level (default 4 x concurrency, at least 8; --request-rate: 10 s of arrivals, at least 20).",
)
@click.option("--duration", type=SECONDS, default=None, help="Seconds per level, instead of --num-requests.")
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Requests per deployment before measuring (not recorded).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Output folder (default bench-results/<UTC time>)."
)
@click.option(
    "--chat",
    is_flag=True,
    help="Wrap prompts in the chat template (Triton: the deployment's tokenizer; OpenAI: /chat/completions).",
)
@click.option(
    "--metrics",
    "metrics",
    multiple=True,
    help="NAME=URL of a deployment's Prometheus metrics (default: gRPC port + 1), or NAME=none.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Tokenizer (folder or Hugging Face id) to count output tokens when the server does not.",
)
@click.option("--timeout", type=SECONDS, default=300.0, show_default=True, help="Per-request timeout, seconds.")
@click.option("--baseline", default="baseline", show_default=True, help="Name of the reference deployment.")
@click.option("--model", default="ensemble", show_default=True, help="Triton model to drive.")
@click.option(
    "--rounds",
    type=POSITIVE,
    default=1,
    show_default=True,
    help="Deployments take turns: each level's requests in this many rounds, every deployment running "
    "its share of a round before the next, so that a machine whose speed drifts slows them alike "
    "(1: one deployment after another; at most requests / concurrency rounds, so every round keeps "
    "the level's concurrency busy).",
)
def bench(urls, metrics, **options) -> None:
    """Benchmark deployments side by side: throughput, TTFT, ITL, latency, acceptance, memory; table + JSON, CSV, PNG."""
    from specpipe.bench.job import BenchRequest, run_benchmark
    from specpipe.bench.table import comparison_table
    from specpipe.progress import console, note, result_renderable, warn

    if options["num_requests"] is not None and options["duration"] is not None:
        raise click.UsageError("give --num-requests or --duration, not both")
    context = click.get_current_context()
    if (
        options["request_rate"]
        and context.get_parameter_source("concurrency") == click.core.ParameterSource.COMMANDLINE
    ):
        raise click.UsageError(
            "give --concurrency (closed loop) or --request-rate (open loop), not both; "
            "cap open-loop requests in flight with --max-concurrency"
        )
    if (
        options["output_len"] is not None
        and context.get_parameter_source("max_tokens") == click.core.ParameterSource.COMMANDLINE
    ):
        raise click.UsageError("give --max-tokens or --output-len, not both")
    outcome = run_benchmark(BenchRequest(urls=tuple(urls), metrics=tuple(metrics), **options))
    run = outcome.run
    result_renderable(comparison_table(run), width=200)
    note(f"wrote {', '.join(str(p) for p in outcome.paths.values())}")
    for level in run.levels:
        failed = [r for r in level.records if r.error]
        if failed:
            warn(
                f"{level.deployment} @ {level.concurrency}: {len(failed)} of {len(level.records)} "
                f"requests failed; first error: {failed[0].error.splitlines()[0][:200]}"
            )
    if run.incomplete:
        console.print(
            f"[red]the benchmark is incomplete[/red] ({'; '.join(run.reasons)}): partial results written to "
            f'{outcome.out_dir}, marked "incomplete": true',
            highlight=False,
        )
    sys.exit(1 if run.incomplete else 0)


@click.command()
@click.argument("name")
@click.option("--prompts", default="chat", show_default=True, help=PROMPTS_HELP)
@click.option(
    "--max-draft-len",
    "lengths",
    type=PositiveIntList("1,2,3,4,6,8"),
    default="1,2,3,4,6,8",
    show_default=True,
    help="Draft lengths to try, tokens (tree methods: tree nodes / chain depth).",
)
@click.option("--concurrency", type=POSITIVE, default=1, show_default=True, help="Requests in flight while measuring.")
@click.option("--max-tokens", type=POSITIVE, default=128, show_default=True, help="New tokens per request.")
@click.option("--num-requests", type=POSITIVE, default=8, show_default=True, help="Measured requests per setting.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Requests per setting before measuring."
)
@engines_dir_option()
@click.option("--draft", default=None, help="Draft preset the engine was built from (default: from its manifest).")
@click.option("--chat", is_flag=True, help="Wrap prompts in the engine's chat template.")
@click.option(
    "--keep", is_flag=True, help="Keep the candidates' engines, repositories and logs (ENGINES_DIR/.tune-NAME)."
)
def tune(**options) -> None:
    """Measure CPU engine NAME at each draft length, print the curve, record the best for the next build."""
    from specpipe.bench.tune import TuneRequest, curve_table
    from specpipe.bench.tune import tune as run_tune
    from specpipe.progress import console, done, result_renderable

    outcome = run_tune(TuneRequest(**options))
    result_renderable(curve_table(outcome), width=160)
    if outcome.best is None:
        console.print(
            f"[red]no setting of {outcome.name} could be measured[/red]: see the messages above", highlight=False
        )
        sys.exit(1)
    best = outcome.best
    done(
        f"best: {best['label']} (max_draft_len={best['max_draft_len']}, {best['output_token_throughput']:.1f} tokens/s); "
        f"recorded in {outcome.record}: the next 'specpipe build' of {outcome.name} uses it (delete the file to go back to the preset)"
    )
