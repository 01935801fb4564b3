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
- engine flow, two engines (draft-target) on TP x PP > 1 GPUs: orchestrator mode, what
  ``launch_triton_server.py --multi-model --world_size=1`` does (TensorRT-LLM
  ``triton_backend/scripts/launch_triton_server.py`` @ 0a2e2c1, facts only): one rank,
  ``mpirun --allow-run-as-root -n 1 tritonserver ...`` with ``--pinned-memory-pool-byte-size=0
  --enable-peer-access=false`` and ``--cuda-memory-pool-byte-size=<gpu>:0`` per GPU, and the environment
  ``TRTLLM_ORCHESTRATOR=1``, ``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1`` (:func:`server_environment`); the
  backend then spawns each engine's workers on its ``gpu_device_ids``;
- LLM API flow: one ``tritonserver --model-repository=/models`` (auto-complete on: the model reads
  ``max_batch_size``/``decoupled`` from model.yaml); the LLM API starts its TP x PP workers itself.

Every launcher (``serve --print``/``serve``, the image's entry point used by ``docker/compose.yaml``, the
Kubernetes writer) takes both the command and the environment from here.

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
from specpipe.triton.repo_meta import LAUNCH_ORCHESTRATOR, launch_mode
from specpipe.trtllm import release

TRITONSERVER = "tritonserver"
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
SHM_SIZE = "16g"
DOCKERFILE = PACKAGE_DIR.parent.parent / "docker" / "Dockerfile"


def _server_argv(ports: dict[str, int]) -> list[str]:
    return [
        TRITONSERVER,
        f"--model-repository={CONTAINER_REPO}",
        f"--grpc-port={ports['grpc']}",
        f"--http-port={ports['http']}",
        f"--metrics-port={ports['metrics']}",
    ]


#: The environment of orchestrator mode (``launch_triton_server.py --multi-model`` without
#: ``--disable-spawn-processes``); read by the backend's ``TRITONBACKEND_Initialize`` and
#: ``ModelInstanceState::getParallelConfigFromParams``.
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def repository_launch_mode(meta: dict[str, Any]) -> str:
    """The launch mode of a repository (``single``, ``leader`` or ``orchestrator``).

    Raises:
        SpecpipeError: a repository written before launch modes were recorded whose two engines run on
            several GPUs: it was written for leader mode, in which the draft-target engines cannot start.
    """
    if "launch" in meta:
        return meta["launch"]
    mode = launch_mode(meta["runtime"], len(meta.get("rank_models", [])), int(meta["gpus"]))
    if mode == LAUNCH_ORCHESTRATOR:
        raise SpecpipeError(
            f"repository for {meta['engine']} runs two engines on {meta['gpus']} GPUs in leader mode, where every rank "
            f"above 0 exits; draft-target with TP x PP > 1 needs orchestrator mode (TRTLLM_ORCHESTRATOR=1, "
            f"gpu_device_ids per engine): repackage it with 'specpipe package'"
        )
    return mode


def server_environment(meta: dict[str, Any]) -> dict[str, str]:
    """Environment variables the server command needs (orchestrator mode only)."""
    return dict(ORCHESTRATOR_ENV) if repository_launch_mode(meta) == LAUNCH_ORCHESTRATOR else {}


def server_command(meta: dict[str, Any], ports: dict[str, int] | None = None) -> list[str]:
    """The command the container runs for a repository with metadata ``meta`` (``specpipe.json``);
    run it with :func:`server_environment`.

    Raises:
        SpecpipeError: see :func:`repository_launch_mode`.
    """
    ports = ports or CONTAINER_PORTS
    mode = repository_launch_mode(meta)
    if meta["runtime"] == "trtllm-llmapi":
        return _server_argv(ports)
    if mode == LAUNCH_ORCHESTRATOR:
        pools = [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(int(meta["gpus"]))]
        return [
            "mpirun",
            "--allow-run-as-root",
            "-n",
            "1",
            *_server_argv(ports),
            "--pinned-memory-pool-byte-size=0",
            "--enable-peer-access=false",
            *pools,
            "--disable-auto-complete-config",
            "--backend-config=python,shm-region-prefix-name=prefix0_",
        ]
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


def container_launch(
    repo_dir: Path,
    meta: dict[str, Any],
    *,
    container: str | None = None,
    gpus: str | None = None,
    ports: dict[str, int] | None = None,
) -> ContainerLaunch:
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
    build = [
        "docker",
        "build",
        "-f",
        str(DOCKERFILE),
        "--build-arg",
        f"BASE_IMAGE={container}",
        "-t",
        image,
        str(DOCKERFILE.parent.parent),
    ]
    run = [
        "docker",
        "run",
        "--rm",
        "--name",
        f"specpipe-{Path(repo_dir).name}",
        "--gpus",
        f'"device={",".join(str(i) for i in ids)}"',
        f"--shm-size={SHM_SIZE}",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
    ]
    for name in ("http", "grpc", "metrics"):
        run += ["-p", f"{host[name]}:{CONTAINER_PORTS[name]}"]
    for key, value in server_environment(meta).items():
        run += ["-e", f"{key}={value}"]
    run += [
        "-v",
        f"{Path(repo_dir).absolute()}:{CONTAINER_REPO}:ro",
        "-v",
        f"{meta['engines_root']}:{CONTAINER_ENGINES}:ro",
        image,
        *server_command(meta),
    ]
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
        raise SpecpipeError(
            "docker is not on PATH: install docker with the NVIDIA Container Toolkit, or use --print and run the command elsewhere"
        )
    return subprocess.run(launch.run_argv).returncode
