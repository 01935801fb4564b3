"""Docker's own failures told apart from the failures of the command it runs, one line each with the fix:
the one classifier for ``specpipe doctor --container`` and for the build's container steps
(:func:`specpipe.trtllm.executor.run_step`).

``docker run`` exits 125 when docker itself fails (daemon, pull, container creation), 126 when the
command cannot be invoked in the image and 127 when it is not found there; its error goes to stderr as
``docker: <message>.`` (``runStartContainerErr`` and ``reportError``, docker/cli
``cli/command/container/run.go`` @ 26da5bf025c8da9d4bf94e8c3d982f084578d093). The exit status alone
misleads: a refused socket, ``... connect: permission denied``, exits 126, and a daemon whose socket does
not exist, ``... connect: no such file or directory``, 127, so the message decides. Classes, with the
texts docker, the registries and the NVIDIA Container Toolkit print (as reported in moby/moby#36915,
NVIDIA/nvidia-docker#1352, NVIDIA/nvidia-container-toolkit#154, triton-inference-server/server#5747):

* daemon not reachable: ``Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the
  docker daemon running?``, ``failed to connect to the docker API at ...`` (newer clients);
* socket permission: ``permission denied while trying to connect to the Docker daemon socket at ...``
  (newer clients: ``... the docker API at ...``);
* no GPU runtime: ``could not select device driver "" with capabilities: [[gpu]]`` (``--gpus`` without
  the NVIDIA Container Toolkit);
* no usable driver: ``nvidia-container-cli: initialization error: load library failed:
  libnvidia-ml.so.1 ...``; a driver too old: ``nvidia-container-cli: requirement error: unsatisfied
  condition: cuda>=12.8, please update your driver ...``;
* cannot pull (status 125 only, as these words may appear in a tool's own output): ``pull access denied
  for ..., repository does not exist or may require 'docker login'``, ``manifest for ... not found:
  manifest unknown``, ``unauthorized: authentication required``, ``no matching manifest for linux/arm64``,
  ``toomanyrequests``, network (``dial tcp: lookup nvcr.io: no such host``, ``i/o timeout``), a full
  disk (``no space left on device``), ``invalid reference format``;
* command not in the image: ``exec: "python3": executable file not found in $PATH`` (status 127).

Any other status 125 to 127 is still docker's, said as such with its last message; other statuses are
the command's own (``None``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from specpipe.errors import SpecpipeError
from specpipe.trtllm import release

DOCKER_STATUSES = (125, 126, 127)
NOT_INSTALLED = (
    "docker not found: install docker and the NVIDIA Container Toolkit, or run inside the container with --local"
)
TAIL_LINES = 40
_QUOTE_CHARS = 200


class DockerError(SpecpipeError):
    """Docker could not run the container (not installed, no daemon, no GPU runtime, cannot pull, ...)."""


@dataclass(frozen=True)
class DockerFailure:
    """What went wrong in docker: ``kind`` (``daemon``, ``socket-permission``, ``gpu-runtime``, ``driver``,
    ``pull``, ``command``, ``docker``) and ``message``, one line with the cause, docker's words and the fix."""

    kind: str
    message: str


_ANY_STATUS = (
    (
        "socket-permission",
        re.compile(r"permission denied while trying to connect to the docker", re.I),
        "docker may not use its daemon's socket as this user ({quote}): add the user to the docker group "
        "('sudo usermod -aG docker $USER', then log in again) or run as root",
    ),
    (
        "daemon",
        re.compile(
            r"cannot connect to the docker daemon|failed to connect to the docker api"
            r"|is the docker daemon running|error during connect",
            re.I,
        ),
        "docker cannot reach its daemon ({quote}): start it ('sudo systemctl start docker') or point "
        "DOCKER_HOST at a running one",
    ),
    (
        "gpu-runtime",
        re.compile(r"could not select device driver .* with capabilities: \[\[gpu\]\]", re.I),
        "docker has no GPU runtime ({quote}): install the NVIDIA Container Toolkit, then run 'sudo nvidia-ctk "
        "runtime configure --runtime=docker' and 'sudo systemctl restart docker'",
    ),
    (
        "driver",
        re.compile(r"nvidia-container-cli: requirement error", re.I),
        "the NVIDIA driver of this machine is too old for the image {image} ({quote}): update the driver",
    ),
    (
        "driver",
        re.compile(r"nvidia-container-cli: .*error", re.I),
        "the NVIDIA Container Toolkit finds no usable NVIDIA driver here ({quote}): install the driver "
        "('nvidia-smi' must list the GPUs), then restart docker",
    ),
)
_DOCKER_STATUS_ONLY = (
    (
        "pull",
        re.compile(r"invalid reference format", re.I),
        "docker refuses the image reference {image!r} ({quote}): give [REGISTRY/]NAME[:TAG], e.g. {pinned}",
    ),
    (
        "pull",
        re.compile(r"no space left on device", re.I),
        "the disk holding docker's images is full ({quote}): free space ('docker system prune') and run again",
    ),
    (
        "pull",
        re.compile(r"no matching manifest for", re.I),
        "the image {image} is not built for this machine's platform ({quote}): use an image of this architecture",
    ),
    (
        "pull",
        re.compile(
            r"pull access denied|manifest unknown|repository does not exist|not found: manifest"
            r"|unauthorized|authentication required|denied: |toomanyrequests",
            re.I,
        ),
        "docker cannot pull {image} ({quote}): check the name and tag (the pinned image is {pinned}); "
        "for nvcr.io log in with an NGC API key ('docker login nvcr.io', user $oauthtoken)",
    ),
    (
        "pull",
        re.compile(
            r"dial tcp|no such host|i/o timeout|tls handshake timeout|client\.timeout exceeded"
            r"|connection refused|connection reset",
            re.I,
        ),
        "docker cannot reach the registry of {image} ({quote}): check the network and proxy of the docker "
        "daemon, or 'docker pull {image}' where it can and 'docker save'/'docker load' it here",
    ),
)
_COMMAND_MISSING = re.compile(r"executable file not found|no such file or directory", re.I)


def _quote(line: str) -> str:
    text = line.strip()
    for prefix in ("docker: ", "Error response from daemon: ", "ERROR: "):
        text = text.removeprefix(prefix)
    text = text.removesuffix(".").removesuffix(": unknown")
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def _matching_line(lines: list[str], pattern: re.Pattern) -> str | None:
    return next((line for line in reversed(lines) if pattern.search(line)), None)


def _last_docker_line(lines: list[str]) -> str:
    mine = [line for line in lines if line.strip() and not line.startswith("See 'docker")]
    return next((line for line in reversed(mine) if line.startswith("docker:")), mine[-1] if mine else "no message")


def diagnose(output: str, returncode: int, *, image: str, program: str) -> DockerFailure | None:
    """The docker failure that ``output`` (what ``docker run ... image program ...`` printed, stderr or
    the step's log) and ``returncode`` show, or ``None`` when docker ran and the command itself failed
    (or succeeded: ``returncode`` 0). See the module docstring for the classes and their texts."""
    if returncode == 0:
        return None
    lines = output.splitlines()
    facts = {"image": image, "pinned": release.CONTAINER_IMAGE}
    for kind, pattern, template in _ANY_STATUS:
        line = _matching_line(lines, pattern)
        if line is not None:
            return DockerFailure(kind, template.format(quote=_quote(line), **facts))
    if returncode not in DOCKER_STATUSES:
        return None
    for kind, pattern, template in _DOCKER_STATUS_ONLY:
        line = _matching_line(lines, pattern)
        if line is not None:
            return DockerFailure(kind, template.format(quote=_quote(line), **facts))
    last = _last_docker_line(lines)
    if returncode == 127 and _COMMAND_MISSING.search(output):
        return DockerFailure(
            "command",
            f"the image {image} has no {program!r} ({_quote(last)}): use the "
            f"TensorRT-LLM Triton image, {release.CONTAINER_IMAGE}",
        )
    if returncode == 126:
        return DockerFailure(
            "command",
            f"{program!r} cannot be run in the image {image} ({_quote(last)}): "
            f"use the TensorRT-LLM Triton image, {release.CONTAINER_IMAGE}",
        )
    return DockerFailure(
        "docker",
        f"docker could not run a container of {image} (exit status {returncode}: "
        f"{_quote(last)}): run 'docker run --rm {image} true' to see docker's problem",
    )


def diagnose_log(log_path: Path, returncode: int, *, image: str, program: str, skip: int = 1) -> str | None:
    """:func:`diagnose` of a step's log (its last :data:`TAIL_LINES` lines after the first ``skip``, the
    command); the one-line message, or ``None`` (also for a log that cannot be read)."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()[skip:]
    except OSError:
        return None
    failure = diagnose("\n".join(lines[-TAIL_LINES:]), returncode, image=image, program=program)
    return failure.message if failure else None


def run_teed(argv: list[str], sink: IO[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` with stdout passed through and stderr copied line by line to ``sink`` (default
    ``sys.stderr``) as it comes (docker's pull progress stays visible); returns the process with
    ``stderr`` holding the last :data:`TAIL_LINES` lines, for :func:`diagnose`.

    Raises:
        DockerError: ``argv[0]`` is ``docker`` and it is not installed (:data:`NOT_INSTALLED`).
        FileNotFoundError: another program that does not exist.
    """
    sink = sys.stderr if sink is None else sink
    try:
        process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, errors="replace")
    except FileNotFoundError as exc:
        if Path(argv[0]).name == "docker":
            raise DockerError(NOT_INSTALLED) from exc
        raise
    kept: deque[str] = deque(maxlen=TAIL_LINES)
    with process:
        for line in process.stderr:
            sink.write(line)
            sink.flush()
            kept.append(line)
    return subprocess.CompletedProcess(argv, process.returncode, None, "".join(kept))
