"""Serve a vLLM engine (``specpipe build --runtime vllm``) in the pinned ``vllm/vllm-openai`` image.

There is no Triton repository: the container runs the manifest's ``vllm serve`` command, which
serves vLLM's own OpenAI-compatible API (``/v1/...``, ``/metrics``) and ``/health`` (200 once the engine
has loaded) on one port. The launch (:func:`vllm_launch`) is::

    docker run --rm --name specpipe-NAME --gpus '"device=IDS"' --ipc=host -p PORT:8000
        -v HF_CACHE:/root/.cache/huggingface -e HF_TOKEN [-v DIR:DIR:ro per local checkpoint]
        --entrypoint vllm vllm/vllm-openai:vX serve MODEL ... --host 0.0.0.0 --port 8000

``--ipc=host``: vLLM's tensor-parallel workers share memory through ``/dev/shm`` (the image's documented
way to run); ``HF_TOKEN`` is passed by name, so its value never appears on the command line; the host's
Hugging Face cache (``HF_HOME``, default ``~/.cache/huggingface``) is mounted where the image's vLLM looks,
so weights are downloaded once. ``--entrypoint vllm ... serve`` makes the command independent of the
image's default entry point. The GPUs are exactly TP x PP of them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specpipe.errors import ManifestError, SpecpipeError
from specpipe.manifest import read_manifest
from specpipe.progress import out
from specpipe.serve.trtllm import parse_gpus
from specpipe.speculative import Runtime
from specpipe.vllm import release
from specpipe.vllm.flagcheck import parse_serve_argv

CONTAINER_PORT = release.DEFAULT_PORT
#: Seconds to wait for ``/health`` (first starts download the weights).
READY_TIMEOUT_S = 3600.0


@dataclass
class VllmLaunch:
    """How to serve a vLLM engine: the ``docker run`` argv, the host port and the readiness URL."""

    name: str
    image: str
    run_argv: list[str]
    port: int

    @property
    def health_url(self) -> str:
        return f"http://localhost:{self.port}{release.HEALTH_PATH}"

    def shell_lines(self) -> list[str]:
        return [
            shlex.join(self.run_argv),
            f"# ready when: curl -fsS {self.health_url}  (OpenAI API: "
            f"http://localhost:{self.port}/v1, model '{self.name}')",
        ]


def hf_cache_dir() -> Path:
    """The host's Hugging Face cache (``HF_HOME`` as set now, else huggingface_hub's default, ``~/.cache/huggingface``)."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    from huggingface_hub import constants  # heavy optional import, only where a launch is made

    return Path(constants.HF_HOME)


def engine_command(engine_dir: Path) -> tuple[str, list[str], int]:
    """``(name, vllm serve argv, GPUs)`` recorded in ``engine_dir``'s manifest.

    Raises:
        ManifestError: no manifest, another specpipe version, not a vLLM engine, or no ``vllm`` block.
    """
    manifest = read_manifest(engine_dir)
    if manifest.runtime is not Runtime.VLLM:
        raise ManifestError(
            f"{engine_dir} is a '{manifest.runtime.value}' engine, not a vLLM one: package it and serve it "
            f"without --runtime vllm, or rebuild it with 'specpipe build --runtime vllm'"
        )
    if not manifest.vllm or "command" not in manifest.vllm or not manifest.parallel:
        raise ManifestError(
            f"{engine_dir}/manifest.json lacks its vllm command: rebuild with 'specpipe build --runtime vllm --force'"
        )
    return manifest.name, list(manifest.vllm["command"]), int(manifest.parallel["tp"]) * int(manifest.parallel["pp"])


def _local_mounts(argv: list[str]) -> list[str]:
    """Read-only mounts for the local checkpoints the command names (the target, a draft in the speculative config)."""
    parsed = parse_serve_argv(argv)
    paths = [parsed["model"], (parsed.get("--speculative-config") or {}).get("model")]
    mounts: list[str] = []
    for path in paths:
        if path and Path(path).is_absolute():
            mounts += ["-v", f"{path}:{path}:ro"]
    return mounts


def vllm_launch(
    engine_dir: Path, *, port: int = CONTAINER_PORT, gpus: str | None = None, image: str | None = None
) -> VllmLaunch:
    """The ``docker run`` of the engine at ``engine_dir`` on host ``port``, GPUs ``gpus`` (default 0..TPxPP-1).

    Raises:
        ManifestError: see :func:`engine_command`. SpecpipeError: bad ``gpus``, or an image of another vLLM release.
        InvalidVllmCommandError: the recorded command no longer matches vLLM's definitions.
    """
    name, argv, count = engine_command(Path(engine_dir))
    image = image or release.IMAGE
    if image.rsplit(":", 1)[-1] != f"v{release.VLLM_VERSION}":
        raise SpecpipeError(
            f"image {image} is not vLLM {release.VLLM_VERSION}, the release the command was checked against: "
            f"use {release.IMAGE}"
        )
    ids = parse_gpus(gpus, count)
    serve_argv = argv + ["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
    parse_serve_argv(serve_argv)
    run = [
        "docker",
        "run",
        "--rm",
        "--name",
        f"specpipe-{name}",
        "--gpus",
        f'"device={",".join(map(str, ids))}"',
        "--ipc=host",
        "-p",
        f"{port}:{CONTAINER_PORT}",
        "-v",
        f"{hf_cache_dir()}:{release.CONTAINER_HF_HOME}",
        "-e",
        "HF_TOKEN",
        *_local_mounts(argv),
        "--entrypoint",
        serve_argv[0],
        image,
        *serve_argv[1:],
    ]
    return VllmLaunch(name, image, run, port)


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 2.0) -> float:
    """Poll ``url`` until it answers 200; returns the seconds waited.

    Raises:
        SpecpipeError: the container exited first, or ``timeout_s`` passed.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if process.poll() is not None:
            raise SpecpipeError(
                f"the vLLM container exited with status {process.returncode} before {url} answered: "
                f"see its output above"
            )
        try:
            with urllib.request.urlopen(url, timeout=poll_s) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(poll_s)
    raise SpecpipeError(f"{url} did not answer within {timeout_s:.0f} s: see the container's output above")


def serve_vllm(
    engine_dir: Path,
    *,
    print_only: bool = False,
    port: int = CONTAINER_PORT,
    gpus: str | None = None,
    image: str | None = None,
) -> None:
    """Print (``print_only``) or run the vLLM container of ``engine_dir`` until Ctrl-C, reporting when ``/health`` is up.

    Raises:
        SpecpipeError: see :func:`vllm_launch`; docker missing; the container exits or never becomes healthy.
    """
    launch = vllm_launch(engine_dir, port=port, gpus=gpus, image=image)
    if print_only:
        for line in launch.shell_lines():
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    if shutil.which("docker") is None:
        raise SpecpipeError(
            "docker is not on PATH: install docker with the NVIDIA Container Toolkit, or use --print "
            "and run the command elsewhere"
        )
    process = subprocess.Popen(launch.run_argv)
    try:
        waited = wait_healthy(launch.health_url, process)
        out.print(
            f"vLLM is serving {launch.name} on http://localhost:{port}/v1 (ready after {waited:.0f} s); "
            f"Ctrl-C stops it",
            markup=False,
            highlight=False,
        )
        code = process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
        return
    if code != 0:
        raise SpecpipeError(f"the vLLM container exited with status {code}: see its output above")
