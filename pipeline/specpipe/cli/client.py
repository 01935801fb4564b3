"""``specpipe generate`` and ``specpipe validate``: requests to a deployment over gRPC."""

from __future__ import annotations

import json
import sys

import click

from specpipe.cli.options import POSITIVE, SEED, TOKEN_COUNT


@click.command()
@click.argument("prompt")
@click.option("--url", default="localhost:8001", show_default=True, help="Triton gRPC endpoint HOST:PORT.")
@click.option(
    "--model", default="ensemble", show_default=True, help="Triton model to call (the deployment's ensemble)."
)
@click.option("--max-tokens", type=TOKEN_COUNT, default=128, show_default=True, help="New tokens to generate at most.")
@click.option("--stream/--no-stream", default=False, show_default=True, help="Print the text as it arrives.")
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=None,
    help="Sample at this temperature (0 or unset: greedy, unless --top-k/--top-p is given).",
)
@click.option(
    "--top-k", type=click.IntRange(0, 2**31 - 1), default=None, help="Sample from the k most likely tokens (0: all)."
)
@click.option(
    "--top-p",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Sample from the smallest set of tokens whose probabilities add up to p.",
)
@click.option("--seed", type=SEED, default=None, help="Random seed of the sampling (same seed, same text).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--stats", is_flag=True, help="Print acceptance figures after the text (stderr).")
def generate(prompt, url, model, max_tokens, stream, temperature, top_k, top_p, seed, chat, stats) -> None:
    """Send one prompt to a deployed ensemble over gRPC and print the text."""
    from specpipe.client.generate import GenerateJob
    from specpipe.client.generate import generate as run_generate
    from specpipe.client.request import GenerationRequest, sampling_fields

    sampling = sampling_fields(temperature, top_k, top_p, seed)
    if seed is not None and sampling["seed"] is None:
        click.echo(
            "(--seed has no effect: the request decodes greedily; give --temperature above 0 to sample)", err=True
        )
    job = GenerateJob(
        url=url,
        model=model,
        chat=chat,
        request=GenerationRequest(prompt=prompt, max_tokens=max_tokens, stream=stream, **sampling),
    )

    def echo(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = run_generate(job, on_text=echo)
    if not stream:
        sys.stdout.write(result.text)
    sys.stdout.write("\n")
    if not result.text.strip():
        hint = "" if chat else "; an instruction-tuned model usually needs --chat"
        click.echo(f"(no text: the model ended its answer at once{hint})", err=True)
    if stats:
        perf = result.perf
        click.echo(
            f"[{perf.get('num_output_tokens', '?')} tokens in {result.latency_s * 1000:.0f} ms, "
            f"TTFT {1000 * (result.ttft_s or 0):.0f} ms, acceptance rate {perf.get('acceptance_rate', 0):.2f}, "
            f"draft tokens accepted {perf.get('total_accepted_draft_tokens', 0)}/{perf.get('total_draft_tokens', 0)}]",
            err=True,
        )


@click.command()
@click.option("--url", default="localhost:8001", show_default=True, help="Deployment under test (gRPC HOST:PORT).")
@click.option(
    "--baseline-url",
    default=None,
    help="Baseline deployment (--draft none, gRPC HOST:PORT) to compare greedy outputs with.",
)
@click.option(
    "--model", default="ensemble", show_default=True, help="Triton model to call (the deployments' ensemble)."
)
@click.option("--max-tokens", type=POSITIVE, default=48, show_default=True, help="New tokens per validation request.")
@click.option("--json", "json_output", is_flag=True, help="Print the results as JSON.")
def validate(url, baseline_url, model, max_tokens, json_output) -> None:
    """Check a deployment: health, interface, streaming, greedy equivalence with a baseline."""
    from specpipe.client.validate import report_json, report_tables
    from specpipe.client.validate import validate as run_validation
    from specpipe.progress import out, result

    report = run_validation(url, baseline_url, model, max_tokens)
    if json_output:
        result(json.dumps(report_json(report), indent=2))
    else:
        for table in report_tables(report):
            out.print(table)
    sys.exit(0 if report.passed else 1)
