"""``deploy k8s --image REGISTRY/NAME:TAG``: the serving image with the repository and engines baked in.

The output's ``Dockerfile`` starts FROM the serving image (``docker/Dockerfile``'s build on the
engine's Triton TensorRT-LLM container) and copies the repository to ``/models`` and every engine
path the repository names to ``/engines/REL`` (:mod:`specpipe.deploy.storage`), so the pod needs no
volume but ``/dev/shm``. The folders come in as named build contexts (``docker build
--build-context NAME=PATH`` with ``COPY --from=NAME``; Docker's build documentation,
``content/manuals/build/concepts/context.md``, "Named contexts"; BuildKit, Docker's default builder
since Docker 23), so nothing is copied to a staging folder first. ``build-image.sh`` builds the
serving image when it is missing locally, then builds and pushes the baked one; its host paths are
absolute, and it checks they exist before it builds anything.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from specpipe.deploy.storage import PodData
from specpipe.triton.deployment import CONTAINER_ENGINES, CONTAINER_REPO


def _contexts(data: PodData) -> list[tuple[str, Path, str, str]]:
    """(context name, host folder, source inside it, destination) for the repository and each engine path."""
    items = [("repository", data.repo_dir, ".", CONTAINER_REPO)]
    for i, rel in enumerate(data.paths):
        host = data.host_path(rel)
        if host.is_file():  # a file: its folder is the context, the file the source
            items.append((f"engines-{i}", host.parent, host.name, f"{CONTAINER_ENGINES}/{rel}"))
        else:
            items.append((f"engines-{i}", host, ".", f"{CONTAINER_ENGINES}/{rel}"))
    return items


def dockerfile(name: str, data: PodData, serving_image: str) -> str:
    """The baked image's Dockerfile (build it with :func:`build_script`)."""
    lines = [
        "# syntax=docker/dockerfile:1",
        f"# The serving image with {name}'s repository and engine files baked in (specpipe deploy k8s --image).",
        "# Build and push it with build-image.sh (named build contexts: BuildKit).",
        f"ARG SERVING_IMAGE={serving_image}",
        "FROM ${SERVING_IMAGE}",
    ]
    lines += [f"COPY --from={ctx} {source} {dest}" for ctx, _, source, dest in _contexts(data)]
    return "\n".join(lines) + "\n"


def build_script(image: str, data: PodData, serving_image: str, serving_build: list[str] | None) -> str:
    """``build-image.sh``: build the serving image if missing (``serving_build``, when it is a local
    build), build ``image`` from the output folder's Dockerfile, push it."""
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"# Build and push {image}: the serving image with the deployment's data baked in.",
        "set -eu",
        'here=$(cd "$(dirname "$0")" && pwd)',
        *data.check_script(),
    ]
    if serving_build:
        lines.append(f"docker image inspect {q(serving_image)} >/dev/null 2>&1 || {shlex.join(serving_build)}")
    build = ["docker", "build", "-f", '"$here/Dockerfile"', "--build-arg", q(f"SERVING_IMAGE={serving_image}")]
    for ctx, host, _, _ in _contexts(data):
        build += ["--build-context", q(f"{ctx}={host}")]
    lines.append(" ".join(build + ["-t", q(image), '"$here"']))
    lines.append(f"docker push {q(image)}")
    return "\n".join(lines) + "\n"
