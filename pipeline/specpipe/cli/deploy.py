"""``specpipe deploy``: manifests that run a packaged TensorRT-LLM deployment on a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from specpipe.cli.options import POSITIVE, engines_dir_option, repo_dir_option
from specpipe.progress import result


@click.group()
def deploy() -> None:
    """Manifests that run a packaged TensorRT-LLM deployment on a cluster."""


@deploy.command("k8s")
@click.argument("name")
@repo_dir_option()
@engines_dir_option()
@click.option("--out-dir", type=click.Path(path_type=Path), default=None, help="Output folder (default k8s/NAME).")
@click.option("--replicas", type=POSITIVE, default=1, show_default=True, help="Pods, each with TP x PP GPUs.")
@click.option("--container", default=None, help="Triton TensorRT-LLM image (default: the engine's).")
@click.option(
    "--pvc",
    default=None,
    metavar="CLAIM",
    help="Read the repository and engines from this existing PersistentVolumeClaim (default: a claim the output defines).",
)
@click.option(
    "--storage-size",
    default=None,
    metavar="SIZE",
    help="Size of the claim the output defines, a Kubernetes quantity such as 200Gi or 1.5Ti; at least the data "
    "on disk (default: measured on disk plus 20%).",
)
@click.option(
    "--storage-class", default=None, help="Storage class of the claim the output defines (default: the cluster's)."
)
@click.option(
    "--image",
    default=None,
    metavar="REGISTRY/NAME:TAG",
    help="Bake the repository and engines into this image instead of a claim (writes its Dockerfile and build-image.sh).",
)
@click.option(
    "--host-path", is_flag=True, help="Mount the build host's folders from every node (hostPath) instead of a claim."
)
@click.option(
    "--serving-image",
    default=None,
    metavar="REGISTRY/NAME:TAG",
    help="The pushed serving image of docker/Dockerfile (default: its local tag, which a cluster cannot pull).",
)
@click.option(
    "--gateway/--no-gateway",
    default=None,
    help="Run the OpenAI-compatible gateway as a sidecar (default: on for engine-flow repositories).",
)
@click.option(
    "--api-key-secret",
    default=None,
    metavar="SECRET",
    help="Existing Secret holding the gateway's API key (clients send 'Authorization: Bearer KEY').",
)
@click.option(
    "--api-key-secret-key", default="api-key", show_default=True, metavar="KEY", help="The key of that Secret."
)
@click.option(
    "--expose-triton",
    is_flag=True,
    help="Keep Triton's HTTP and gRPC ports in the Service when the gateway has an API key (they have no authentication).",
)
@click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="Node label the pods need (repeatable).")
def deploy_k8s(name, repo_dir, engines_dir, out_dir, **options) -> None:
    """Write Kubernetes manifests (Deployment, Service, storage) for triton_repo/NAME (vLLM: engines/NAME)."""
    from specpipe.deploy.k8s import write_k8s
    from specpipe.deploy.options import K8sOptions

    if not (repo_dir / name).exists() and (engines_dir / name / "manifest.json").is_file():
        from specpipe.deploy.vllm_k8s import write_vllm_k8s  # a vLLM engine has no repository

        out = write_vllm_k8s(engines_dir / name, out_dir or Path("k8s") / name, K8sOptions(**options))
    else:
        out = write_k8s(repo_dir / name, out_dir or Path("k8s") / name, K8sOptions(**options))
    result(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out} (steps: {out / 'README.md'})")
