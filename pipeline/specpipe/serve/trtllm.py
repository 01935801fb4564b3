"""Serve a TensorRT-LLM repository in its container: the exact command, version pairing, GPUs.

Inside the container (the serving image of ``docker/Dockerfile``: the pinned Triton TensorRT-LLM image
with specpipe installed) the repository is ``/models`` and the engines root ``/engines``, both
read-only (:mod:`specpipe.triton.deployment`). The server command follows TensorRT-LLM's
``triton_backend/scripts/launch_triton_server.py`` (tensorrtllm_backend ``scripts/launch_triton_server.py``
@ c2e65b8, facts only):

- engine flow, world size 1: ``tritonserver --model-repository=/models`` + ports +
  ``--disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix0_``;
- engine flow, world size W = TP x PP > 1: ``mpirun --allow-run-as-root`` with W programs separated by
  ``:``, each ``-n 1 tritonserver ...`` with its own ``shm-region-prefix-name=prefix<i>_``; ranks > 0
  add ``--model-control-mode=explicit`` and one ``--load-model=`` per engine model (they only run the
  engines; rank 0 serves the requests);
- LLM API flow: one ``tritonserver --model-repository=/models`` (auto-complete on: the model reads
  ``max_batch_size``/``decoupled`` from model.yaml); the LLM API starts its TP x PP workers itself.

The container runs only with a TensorRT-LLM release equal to the engine's
(:func:`specpipe.trtllm.release.check_container_for_engine`), on exactly TP x PP GPUs.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpipe import __version__
from specpipe.errors import SpecpipeError
from specpipe.paths import PACKAGE_DIR
from specpipe.triton.deployment import CONTAINER_ENGINES, CONTAINER_REPO
from specpipe.trtllm import release

TRITONSERVER = "tritonserver"
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
SHM_SIZE = "16g"
DOCKERFILE = PACKAGE_DIR.parent.parent / "docker" / "Dockerfile"


def _server_argv(ports: dict[str, int]) -> list[str]:
    return [TRITONSERVER, f"--model-repository={CONTAINER_REPO}", f"--grpc-port={ports['grpc']}",
            f"--http-port={ports['http']}", f"--metrics-port={ports['metrics']}"]


def server_command(meta: dict[str, Any], ports: dict[str, int] | None = None) -> list[str]:
    """The command the container runs for a repository with metadata ``meta`` (``specpipe.json``)."""
    ports = ports or CONTAINER_PORTS
    if meta["runtime"] == "trtllm-llmapi":
        return _server_argv(ports)
    world = int(meta["world_size"])
    ranks = []
    for rank in range(world):
        argv = _server_argv(ports)
        if rank > 0:
            argv += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in meta["rank_models"]]]
        argv += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        ranks.append(argv)
    if world == 1:
        return ranks[0]
    command = ["mpirun", "--allow-run-as-root"]
    for rank, argv in enumerate(ranks):
        command += (["-n", "1"] if rank == 0 else [":", "-n", "1"]) + argv
    return command


def serving_image(container: str) -> str:
    """Tag of the serving image built from ``docker/Dockerfile`` on ``container``."""
    triton = container.rsplit(":", 1)[-1].split("-", 1)[0]
    return f"specpipe-triton:{__version__}-{triton}"


def parse_gpus(text: str | None, count: int) -> list[int]:
    """GPU ids from ``--gpus`` (``0,1,2,3``); default ``0 .. count-1``.

    Raises:
        SpecpipeError: not a list of distinct non-negative integers, or not ``count`` of them.
    """
    if text is None:
        return list(range(count))
    try:
        ids = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise SpecpipeError(f"--gpus {text!r} is not a comma-separated list of GPU ids such as 0,1,2,3") from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise SpecpipeError(f"--gpus {text!r} must list distinct non-negative GPU ids, e.g. 0,1,2,3")
    if len(ids) != count:
        raise SpecpipeError(
            f"the engine runs on TP x PP = {count} GPUs but --gpus names {len(ids)} ({text}): give exactly {count} ids"
        )
    return ids


@dataclass
class ContainerLaunch:
    """How to serve a repository: the serving image build and the ``docker run`` command."""

    container: str
    image: str
    build_argv: list[str]
    run_argv: list[str]

    def shell_lines(self) -> list[str]:
        return [shlex.join(self.build_argv), shlex.join(self.run_argv)]


def container_launch(repo_dir: Path, meta: dict[str, Any], *, container: str | None = None, gpus: str | None = None,
                     ports: dict[str, int] | None = None) -> ContainerLaunch:
    """The launch of ``repo_dir`` (host ports ``ports``, default 8000/8001/8002).

    Raises:
        UnknownContainerError, ReleaseMismatchError: see :mod:`specpipe.trtllm.release`.
        SpecpipeError: bad ``gpus``.
    """
    container = container or meta["container_image"]
    release.check_container_for_engine(container, meta["tensorrt_llm"], meta["engine"])
    ids = parse_gpus(gpus, int(meta["gpus"]))
    host = ports or CONTAINER_PORTS
    image = serving_image(container)
    build = ["docker", "build", "-f", str(DOCKERFILE), "--build-arg", f"BASE_IMAGE={container}", "-t", image,
             str(DOCKERFILE.parent.parent)]
    run = ["docker", "run", "--rm", "--name", f"specpipe-{Path(repo_dir).name}",
           "--gpus", f'"device={",".join(str(i) for i in ids)}"', f"--shm-size={SHM_SIZE}",
           "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    for name in ("http", "grpc", "metrics"):
        run += ["-p", f"{host[name]}:{CONTAINER_PORTS[name]}"]
    run += ["-v", f"{Path(repo_dir).absolute()}:{CONTAINER_REPO}:ro", "-v", f"{meta['engines_root']}:{CONTAINER_ENGINES}:ro",
            image, *server_command(meta)]
    return ContainerLaunch(container, image, build, run)


def check_engine_built(meta: dict[str, Any]) -> None:
    """Raises :class:`SpecpipeError` when the engine the repository names was not built yet."""
    manifest = Path(meta["engines_root"]) / meta["engine"] / "manifest.json"
    if not manifest.is_file():
        raise SpecpipeError(
            f"engine {meta['engine']} is not built ({manifest} is missing; the repository was packaged from a plan): "
            f"run 'specpipe build' first"
        )


def run_container(launch: ContainerLaunch) -> int:
    """Run the container in the foreground until it exits (Ctrl-C stops it); returns its status.

    Raises:
        SpecpipeError: docker is not installed.
    """
    if shutil.which("docker") is None:
        raise SpecpipeError("docker is not on PATH: install docker with the NVIDIA Container Toolkit, or use --print and run the command elsewhere")
    return subprocess.run(launch.run_argv).returncode
