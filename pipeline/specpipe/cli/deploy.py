"""``specpipe deploy``: manifests that run a packaged TensorRT-LLM deployment on a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from specpipe.cli.options import POSITIVE, repo_dir_option
from specpipe.progress import result


@click.group()
def deploy() -> None:
    """Manifests that run a packaged TensorRT-LLM deployment on a cluster."""


@deploy.command("k8s")
@click.argument("name")
@repo_dir_option()
@click.option("--out-dir", type=click.Path(path_type=Path), default=None, help="Output folder (default k8s/NAME).")
@click.option("--replicas", type=POSITIVE, default=1, show_default=True, help="Pods, each with TP x PP GPUs.")
@click.option("--container", default=None, help="Triton TensorRT-LLM image (default: the engine's).")
def deploy_k8s(name, repo_dir, out_dir, replicas, container) -> None:
    """Write a Kubernetes Deployment and Service for triton_repo/NAME."""
    from specpipe.deploy.k8s import write_k8s

    out = write_k8s(repo_dir / name, out_dir or Path("k8s") / name, replicas=replicas, container=container)
    result(f"wrote {out / 'deployment.yaml'} and {out / 'service.yaml'}")
