"""``specpipe serve``: options -> one :class:`ServeRequest`; SIGTERM stops the server like Ctrl-C."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from specpipe.build_request import RUNTIMES
from specpipe.cli.gateway import api_key_options
from specpipe.cli.options import PORT, engines_dir_option, repo_dir_option
from specpipe.openai import LOCAL_HOST


def _terminate(signum, frame):
    raise KeyboardInterrupt


@click.command()
@click.argument("name")
@repo_dir_option()
@engines_dir_option()
@click.option("--grpc-port", type=PORT, default=8001, show_default=True, help="Triton gRPC port.")
@click.option(
    "--http-port",
    type=PORT,
    default=8000,
    show_default=True,
    help="Triton HTTP port (vLLM: the port of its OpenAI API, /health and /metrics).",
)
@click.option("--metrics-port", type=PORT, default=8002, show_default=True, help="Triton Prometheus metrics port.")
@click.option(
    "--runtime",
    type=click.Choice(["auto", *RUNTIMES]),
    default="auto",
    show_default=True,
    help="The repository's runtime (auto: read from the repository); vllm: run engines/NAME's vllm serve "
    "command in the pinned vllm/vllm-openai image (no Triton repository).",
)
@click.option("--print", "print_only", is_flag=True, help="Print the launch command instead of running it.")
@click.option(
    "--container",
    default=None,
    help="TensorRT-LLM runtimes: Triton TensorRT-LLM image (default: the engine's); vllm: the vllm-openai image.",
)
@click.option(
    "--gpus", default=None, help="TensorRT-LLM runtimes: GPU ids, TP x PP of them (default 0..TPxPP-1), e.g. 0,1,2,3."
)
@click.option(
    "--openai-port",
    type=PORT,
    default=None,
    help="Also serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions, /metrics) on this port.",
)
@click.option(
    "--openai-host",
    default=LOCAL_HOST,
    show_default=True,
    help="Address the OpenAI API binds; 0.0.0.0: every interface (give it an API key).",
)
@api_key_options
def serve(name, repo_dir, engines_dir, api_key, api_key_file, **options) -> None:
    """Start Triton on triton_repo/NAME (vLLM: engines/NAME's command) and wait until it is ready; Ctrl-C stops it."""
    from specpipe.openai.auth import resolve_api_key
    from specpipe.serve import ServeRequest
    from specpipe.serve import serve as run_server

    if _is_vllm(options["runtime"], repo_dir / name, engines_dir / name):
        from specpipe.serve.vllm import serve_vllm

        if options["openai_port"] is not None:
            raise click.BadParameter(
                "vLLM serves the OpenAI API itself, on --http-port: drop --openai-port", param_hint="--openai-port"
            )
        serve_vllm(
            engines_dir / name,
            print_only=options["print_only"],
            port=options["http_port"],
            gpus=options["gpus"],
            image=options["container"],
        )
        return

    request = ServeRequest(repo_dir / name, api_key=resolve_api_key(api_key, api_key_file), **options)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run_server(request)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _is_vllm(runtime: str, repo: Path, engine: Path) -> bool:
    """``--runtime vllm``, or ``auto`` with no repository and a vLLM engine of that name."""
    if runtime != "auto":
        return runtime == "vllm"
    if repo.exists() or not (engine / "manifest.json").is_file():
        return False
    try:
        return json.loads((engine / "manifest.json").read_text()).get("runtime") == "vllm"
    except (OSError, ValueError):
        return False
