"""``specpipe serve``: options -> one :class:`ServeRequest`; SIGTERM stops the server like Ctrl-C."""

from __future__ import annotations

import signal

import click

from specpipe.build_request import RUNTIMES
from specpipe.cli.gateway import api_key_options
from specpipe.cli.options import PORT, repo_dir_option
from specpipe.openai import LOCAL_HOST


def _terminate(signum, frame):
    raise KeyboardInterrupt


@click.command()
@click.argument("name")
@repo_dir_option()
@click.option("--grpc-port", type=PORT, default=8001, show_default=True, help="Triton gRPC port.")
@click.option("--http-port", type=PORT, default=8000, show_default=True, help="Triton HTTP port.")
@click.option("--metrics-port", type=PORT, default=8002, show_default=True, help="Triton Prometheus metrics port.")
@click.option("--runtime", type=click.Choice(["auto", *RUNTIMES]), default="auto", show_default=True,
              help="The repository's runtime (auto: read from the repository).")
@click.option("--print", "print_only", is_flag=True, help="Print the launch command instead of running it.")
@click.option("--container", default=None, help="TensorRT-LLM runtimes: Triton TensorRT-LLM image (default: the engine's).")
@click.option("--gpus", default=None, help="TensorRT-LLM runtimes: GPU ids, TP x PP of them (default 0..TPxPP-1), e.g. 0,1,2,3.")
@click.option("--openai-port", type=PORT, default=None,
              help="Also serve the OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions, /metrics) on this port.")
@click.option("--openai-host", default=LOCAL_HOST, show_default=True,
              help="Address the OpenAI API binds; 0.0.0.0: every interface (give it an API key).")
@api_key_options
def serve(name, repo_dir, api_key, api_key_file, **options) -> None:
    """Start Triton on triton_repo/NAME and wait until it is ready; Ctrl-C stops it."""
    from specpipe.openai.auth import resolve_api_key
    from specpipe.serve import ServeRequest, serve as run_server

    request = ServeRequest(repo_dir / name, api_key=resolve_api_key(api_key, api_key_file), **options)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run_server(request)
    finally:
        signal.signal(signal.SIGTERM, previous)
