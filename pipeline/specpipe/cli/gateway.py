"""``specpipe gateway``: the OpenAI-compatible gateway alone, in front of a Triton server elsewhere;
and the API-key options it shares with ``specpipe serve``."""

from __future__ import annotations

from pathlib import Path

import click

from specpipe.cli.options import PORT
from specpipe.openai import CONTAINER_PORT, LOCAL_HOST
from specpipe.openai.auth import API_KEY_ENV


def api_key_options(command):
    """``--api-key`` and ``--api-key-file``, passed on as ``api_key`` and ``api_key_file``.

    ``$SPECPIPE_API_KEY`` is read by :func:`specpipe.openai.auth.resolve_api_key`, not by click,
    which would take a variable set to nothing for no variable (and open the gateway)."""
    command = click.option(
        "--api-key-file",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="OpenAI API: read the key clients must send from this file (a mounted secret).",
    )(command)
    return click.option(
        "--api-key",
        default=None,
        help=f"OpenAI API: clients must send 'Authorization: Bearer KEY' (/health and /metrics stay open); "
        f"default ${API_KEY_ENV} (set but empty: refused). Prefer the variable or --api-key-file: "
        f"a flag shows in process lists.",
    )(command)


@click.command()
@click.option("--triton-url", default="localhost:8001", show_default=True, help="Triton's gRPC endpoint, HOST:PORT.")
@click.option("--name", required=True, help="The deployment's name (triton_repo/NAME): the model id the API serves.")
@click.option(
    "--host", default=LOCAL_HOST, show_default=True, help="Address to bind; 0.0.0.0: every interface (in a container)."
)
@click.option("--port", type=PORT, default=CONTAINER_PORT, show_default=True, help="HTTP port of the OpenAI API.")
@click.option(
    "--tokenizer-dir",
    default=None,
    help="The deployment's tokenizer (default: the path its preprocessing model names, as Triton sees it).",
)
@api_key_options
def gateway(triton_url, name, host, port, tokenizer_dir, api_key, api_key_file) -> None:
    """Serve the OpenAI-compatible API for a Triton deployment running elsewhere; Ctrl-C stops it."""
    from specpipe.openai.auth import resolve_api_key
    from specpipe.serve.gateway import GatewayRequest, run_gateway

    run_gateway(GatewayRequest(triton_url, name, port, host, resolve_api_key(api_key, api_key_file), tokenizer_dir))
