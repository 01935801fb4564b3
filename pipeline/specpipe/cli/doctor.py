"""``specpipe doctor``: the first-contact check of the pinned TensorRT-LLM, in a container image or here."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specpipe.trtllm import release
from specpipe.trtllm.doctor import doctor as run_doctor


@click.command()
@click.option(
    "--container",
    metavar="IMAGE",
    default=None,
    help=f"Run the check in this container image (docker), [REGISTRY/]NAME[:TAG][@DIGEST], e.g. the pinned "
    f"{release.CONTAINER_IMAGE}.",
)
@click.option("--local", is_flag=True, help="Run the check here (tensorrt_llm importable in this Python).")
@click.option(
    "--plan",
    "plan_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Also check a plan's commands and model.yaml: the JSON of 'specpipe build ... --dry-run --json'.",
)
@click.option(
    "--runtime",
    type=click.Choice(["trtllm", "trtllm-llmapi"]),
    default="trtllm",
    show_default=True,
    help="Without --plan: whose Triton backends must exist (trtllm: tensorrtllm and python).",
)
def doctor(container: str | None, local: bool, plan_file: Path | None, runtime: str) -> None:
    """Check the TensorRT-LLM a build would use: its version against the pin, every planned command against
    its own parsers, the LLM API model.yaml (the one 'specpipe package' writes) against its argument classes,
    the Triton backends. A container gets --gpus all when nvidia-smi shows a GPU here; a failed import says
    whether a driver library is missing (no GPU passed, no NVIDIA Container Toolkit) or the container is broken.
    When docker itself fails (not installed, no daemon or no access to its socket, no GPU runtime, no usable
    driver, cannot pull the image, no python3 in it) the last line says which, and the fix.

    Exit status 0 when every check passes, 1 otherwise.
    """
    if (container is None) == (not local):
        raise click.UsageError("give exactly one of --container IMAGE and --local")
    sys.exit(run_doctor(container=container, local=local, plan_file=plan_file, runtime=runtime))
