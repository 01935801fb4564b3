"""The ``specpipe`` command line (click). Imports of heavy modules happen inside commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specpipe import __version__
from specpipe.build_request import RUNTIMES, BuildRequest
from specpipe.errors import SpecpipeError


class _Group(click.Group):
    """Turns :class:`SpecpipeError` into a one-line message and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpecpipeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


def _positive(ctx, param, value):
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be a positive integer, got {value}")
    return value


def _lookahead(ctx, param, value):
    if value is None:
        return None
    try:
        parts = tuple(int(v) for v in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) <= 0:
        raise click.BadParameter("expected W,N,G as three positive integers, e.g. 7,7,7")
    return parts


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="specpipe")
def main() -> None:
    """specpipe: build, package, serve, validate and benchmark speculative-decoding deployments."""


@main.command()
@click.option("--target", required=True, help="Target preset name (e.g. smollm2-135m, llama3-70b) or preset .toml path.")
@click.option("--draft", default="none", show_default=True, help="Draft preset: none, ngram, smollm2-draft, eagle, medusa, lookahead, a draft model preset, or a .toml path.")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="cpu", show_default=True)
@click.option("--name", default=None, help="Engine name (default: <target>-<draft>).")
@click.option("--engines-dir", type=click.Path(path_type=Path), default=Path("engines"), show_default=True)
@click.option("--max-draft-len", type=int, default=None, callback=_positive, help="Draft tokens per step (overrides the preset).")
@click.option("--draft-model", default=None, help="Local directory or Hugging Face id of the draft weights (heads or a causal LM).")
@click.option("--gpu", default=None, help="GPU for the memory plan (TensorRT-LLM runtimes), e.g. h100-80gb.")
@click.option("--tp", type=int, default=1, show_default=True, callback=_positive, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, callback=_positive, help="Pipeline-parallel size.")
@click.option("--quantization", "-q", default="auto", show_default=True, help="auto, bf16, fp16, fp8, int4-awq, int8-wo, int4-wo.")
@click.option("--max-batch-size", type=int, default=8, show_default=True, callback=_positive)
@click.option("--max-input-len", type=int, default=4096, show_default=True, callback=_positive)
@click.option("--max-seq-len", type=int, default=8192, show_default=True, callback=_positive)
@click.option("--lookahead", default=None, callback=_lookahead, help="Lookahead W,N,G (window, n-gram, verification set).")
@click.option("--choices", default=None, help="eagle_choices/medusa_choices tree as a list of paths, e.g. '[[0],[0,0],[1]]'.")
@click.option("--executor", type=click.Choice(["auto", "local", "docker"]), default="auto", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the plan and memory table; run and write nothing.")
@click.option("--json", "json_output", is_flag=True, help="With --dry-run: print one JSON document instead.")
@click.option("--force", is_flag=True, help="Rebuild even if nothing changed.")
def build(**kwargs) -> None:
    """Resolve presets, check compatibility, fetch and convert weights, and build an engine directory."""
    request = BuildRequest(**kwargs)
    if request.json_output and not request.dry_run:
        raise click.BadParameter("--json goes with --dry-run", param_hint="--json")
    if request.runtime == "cpu":
        from specpipe.build_cpu import build_cpu

        build_cpu(request)
    else:
        from specpipe.trtllm.build import build_trtllm

        build_trtllm(request)


@main.command()
@click.argument("name", required=False)
@click.option("--engines-dir", type=click.Path(path_type=Path), default=Path("engines"), show_default=True)
@click.option("--repo-dir", type=click.Path(path_type=Path), default=Path("triton_repo"), show_default=True)
@click.option("--from-plan", type=click.Path(path_type=Path, exists=True), default=None, help="Package a plan (build --dry-run --json) instead of a built engine.")
@click.option("--name", "plan_name", default=None, help="Repository name with --from-plan.")
def package(name, engines_dir, repo_dir, from_plan, plan_name) -> None:
    """Write the Triton model repository triton_repo/NAME/ for engine NAME (CPU, TensorRT-LLM engine or LLM API)."""
    from specpipe.triton.repository import package_engine, package_plan

    if from_plan is not None:
        out = package_plan(from_plan, plan_name or name, repo_dir)
    else:
        if not name:
            raise click.UsageError("give the engine NAME (or --from-plan PLAN.json --name NAME)")
        out = package_engine(engines_dir / name, repo_dir / name)
    click.echo(f"wrote Triton model repository {out}")


@main.command()
@click.argument("name")
@click.option("--repo-dir", type=click.Path(path_type=Path), default=Path("triton_repo"), show_default=True)
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True)
@click.option("--runtime", type=click.Choice(["auto", *RUNTIMES]), default="auto", show_default=True)
@click.option("--print", "print_only", is_flag=True, help="Print the launch command instead of running it.")
@click.option("--container", default=None, help="TensorRT-LLM runtimes: Triton TensorRT-LLM image (default: the engine's).")
@click.option("--gpus", default=None, help="TensorRT-LLM runtimes: GPU ids, TP x PP of them (default 0..TPxPP-1), e.g. 0,1,2,3.")
@click.option("--openai-port", type=int, default=None, help="Also serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions, /metrics) on this port.")
def serve(name, repo_dir, grpc_port, http_port, metrics_port, runtime, print_only, container, gpus, openai_port) -> None:
    """Start Triton on triton_repo/NAME and wait until it is ready; Ctrl-C stops it."""
    from specpipe.serve import serve_repository

    serve_repository(
        repo_dir / name,
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        runtime=runtime,
        print_only=print_only,
        container=container,
        gpus=gpus,
        openai_port=openai_port,
    )


@main.command()
@click.argument("prompt")
@click.option("--url", default="localhost:8001", show_default=True, help="Triton gRPC endpoint HOST:PORT.")
@click.option("--model", default="ensemble", show_default=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--stream/--no-stream", default=False, show_default=True)
@click.option("--temperature", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--stats", is_flag=True, help="Print acceptance figures after the text.")
def generate(prompt, url, model, max_tokens, stream, temperature, top_k, top_p, seed, chat, stats) -> None:
    """Send one prompt to a deployed ensemble over gRPC and print the text."""
    from specpipe.client.commands import generate_command

    generate_command(
        url=url, model=model, prompt=prompt, max_tokens=max_tokens, stream=stream,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, chat=chat, stats=stats,
    )


@main.command()
@click.option("--url", default="localhost:8001", show_default=True, help="Deployment under test (gRPC HOST:PORT).")
@click.option("--baseline-url", default=None, help="Baseline deployment (--draft none) to compare greedy outputs with.")
@click.option("--model", default="ensemble", show_default=True)
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--json", "json_output", is_flag=True, help="Print the results as JSON.")
def validate(url, baseline_url, model, max_tokens, json_output) -> None:
    """Check a deployment: health, interface, streaming, greedy equivalence with a baseline."""
    from specpipe.client.validate import validate_command

    ok = validate_command(url=url, baseline_url=baseline_url, model=model, max_tokens=max_tokens, json_output=json_output)
    sys.exit(0 if ok else 1)


@main.command()
@click.option("--drafts", default="ngram,smollm2-draft,medusa,eagle", show_default=True, help="Speculative methods to deploy beside the baseline.")
@click.option("--engines-dir", type=click.Path(path_type=Path), default=Path("engines"), show_default=True)
@click.option("--repo-dir", type=click.Path(path_type=Path), default=Path("triton_repo"), show_default=True)
@click.option("--base-port", type=int, default=8101, show_default=True, help="First of the ports used (3 per deployment).")
@click.option("--bench-requests", type=click.IntRange(min=0), default=4, show_default=True, help="Benchmark requests per deployment (0 skips the benchmark).")
@click.option("--bench-out", type=click.Path(path_type=Path), default=Path("bench-results/demo"), show_default=True)
def demo(drafts, engines_dir, repo_dir, base_port, bench_requests, bench_out) -> None:
    """The main job on the embedded default: build, package, serve, validate and benchmark SmolLM2 end to end."""
    from specpipe.demo import run_demo

    ok = run_demo([d for d in drafts.split(",") if d], engines_dir=engines_dir, repo_dir=repo_dir, base_port=base_port,
                  bench_requests=bench_requests, bench_out=bench_out)
    sys.exit(0 if ok else 1)


@main.command("train-draft")
@click.option("--target", required=True, help="Target preset (e.g. smollm2-135m) or preset .toml path.")
@click.option("--method", type=click.Choice(["eagle", "medusa", "draft-model"]), required=True, help="What to train.")
@click.option("--data", type=click.Path(path_type=Path), default=None, help="Extra data: a JSONL of prompts (the target answers them) or a text file/folder.")
@click.option("--budget", type=float, default=12.0, show_default=True, help="Training time budget, minutes (data preparation not counted).")
@click.option("--max-steps", type=int, default=None, callback=_positive, help="Exact number of optimizer steps (reproduces a recipe).")
@click.option("--schedule-steps", type=int, default=None, callback=_positive, help="Steps of the learning-rate schedule (default: fitted to the budget; recorded in recipe.json).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Output folder (default heads/<target>/<method>).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--num-prompts", type=int, default=None, help="Built-in self-distillation prompts to use (default 1200 of about 2000; 0 for none).")
@click.option("--stdlib-tokens", type=int, default=None, help="Tokens of standard-library text (default 60000, 0 for none).")
@click.option("--trtllm-layout/--no-trtllm-layout", default=True, show_default=True,
              help="Also write the full TensorRT-LLM converter layout (OUT/trtllm; includes copies of the target's embedding/lm_head).")
def train_draft(target, method, data, budget, max_steps, schedule_steps, out, seed, num_prompts, stdlib_tokens, trtllm_layout) -> None:
    """Train EAGLE/Medusa heads or distil the draft model against the frozen target, on CPU."""
    from specpipe.training.command import train_draft as run_training

    if budget <= 0:
        raise click.BadParameter(f"must be a positive number of minutes, got {budget:g}", param_hint="--budget")
    run_training(
        target, method, data=str(data) if data else None, budget_minutes=budget, out_dir=out, seed=seed,
        max_steps=max_steps, schedule_steps=schedule_steps, num_prompts=num_prompts, stdlib_tokens=stdlib_tokens, export_trtllm=trtllm_layout,
        command="specpipe " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("specpipe") else "",
    )


@main.group()
def deploy() -> None:
    """Manifests that run a packaged TensorRT-LLM deployment on a cluster."""


@deploy.command("k8s")
@click.argument("name")
@click.option("--repo-dir", type=click.Path(path_type=Path), default=Path("triton_repo"), show_default=True)
@click.option("--out-dir", type=click.Path(path_type=Path), default=None, help="Output folder (default k8s/NAME).")
@click.option("--replicas", type=int, default=1, show_default=True, callback=_positive, help="Pods, each with TP x PP GPUs.")
@click.option("--container", default=None, help="Triton TensorRT-LLM image (default: the engine's).")
def deploy_k8s(name, repo_dir, out_dir, replicas, container) -> None:
    """Write a Kubernetes Deployment and Service for triton_repo/NAME."""
    from specpipe.deploy.k8s import write_k8s

    out = write_k8s(repo_dir / name, out_dir or Path("k8s") / name, replicas=replicas, container=container)
    click.echo(f"wrote {out / 'deployment.yaml'} and {out / 'service.yaml'}")


@main.command()
@click.option("--url", "urls", multiple=True, required=True,
              help="Deployment NAME=HOST:PORT (Triton gRPC) or NAME=openai://HOST:PORT/v1 (OpenAI-compatible); repeat it. "
                   "The one named 'baseline' is the reference for speed-ups.")
@click.option("--prompts", default="chat", show_default=True, help="Built-in set (chat, code, summarize) or a JSONL file of {\"prompt\": ...}.")
@click.option("--concurrency", default="1,2,4,8", show_default=True, help="Requests in flight, one load level each.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="New tokens per request.")
@click.option("--num-requests", type=int, default=None, help="Requests per level (default 4 x concurrency, at least 8).")
@click.option("--duration", type=float, default=None, help="Seconds per level, instead of --num-requests.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Requests per deployment before measuring (not recorded).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Output folder (default bench-results/<UTC time>).")
@click.option("--chat", is_flag=True, help="Wrap prompts in the chat template (Triton: the deployment's tokenizer; OpenAI: /chat/completions).")
@click.option("--metrics", "metrics", multiple=True, help="NAME=URL of a deployment's Prometheus metrics (default: gRPC port + 1), or NAME=none.")
@click.option("--tokenizer", default=None, help="Tokenizer (folder or Hugging Face id) to count output tokens when the server does not.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Per-request timeout, seconds.")
@click.option("--baseline", default="baseline", show_default=True, help="Name of the reference deployment.")
@click.option("--model", default="ensemble", show_default=True, help="Triton model to drive.")
def bench(urls, prompts, concurrency, max_tokens, num_requests, duration, warmup, out, chat, metrics, tokenizer, timeout, baseline, model) -> None:
    """Benchmark deployments side by side: throughput, TTFT, ITL, latency, acceptance, memory; table + JSON, CSV, PNG."""
    from specpipe.bench.command import bench_command

    ok = bench_command(urls=list(urls), metrics=list(metrics), prompts=prompts, concurrency=concurrency, max_tokens=max_tokens,
                       num_requests=num_requests, duration=duration, warmup=warmup, out=out, chat=chat, timeout=timeout,
                       tokenizer=tokenizer, baseline=baseline, model=model)
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("name")
@click.option("--prompts", default="chat", show_default=True, help="Built-in set (chat, code, summarize) or a JSONL file of {\"prompt\": ...}.")
@click.option("--max-draft-len", default="1,2,3,4,6,8", show_default=True, help="Draft lengths to try (tree methods: tree nodes / chain depth).")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Requests in flight while measuring.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="New tokens per request.")
@click.option("--num-requests", type=int, default=8, show_default=True, help="Measured requests per setting.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Requests per setting before measuring.")
@click.option("--engines-dir", type=click.Path(path_type=Path), default=Path("engines"), show_default=True)
@click.option("--draft", default=None, help="Draft preset the engine was built from (default: from its manifest).")
@click.option("--chat", is_flag=True, help="Wrap prompts in the engine's chat template.")
@click.option("--keep", is_flag=True, help="Keep the candidates' engines, repositories and logs (ENGINES_DIR/.tune-NAME).")
def tune(name, prompts, max_draft_len, concurrency, max_tokens, num_requests, warmup, engines_dir, draft, chat, keep) -> None:
    """Measure CPU engine NAME at each draft length, print the curve, record the best for the next build."""
    from specpipe.bench.command import tune_command

    ok = tune_command(name=name, engines_dir=engines_dir, prompts=prompts, max_draft_len=max_draft_len, concurrency=concurrency,
                      max_tokens=max_tokens, num_requests=num_requests, warmup=warmup, draft=draft, keep=keep, chat=chat)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
