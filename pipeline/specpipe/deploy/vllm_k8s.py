"""``specpipe deploy k8s NAME`` for a vLLM engine: a Deployment and a Service running its command.

There is no repository or engine to ship: each pod runs the manifest's ``vllm serve`` command (the one
``specpipe serve NAME --runtime vllm --print`` shows) in :data:`specpipe.vllm.release.IMAGE`, with
``nvidia.com/gpu`` = TP x PP, a memory-backed ``/dev/shm`` (the cluster's stand-in for ``--ipc=host``),
an ``emptyDir`` Hugging Face cache (weights are downloaded when a pod starts), ``HF_TOKEN`` from the
Secret ``hf-token`` (key ``token``; optional, for gated models), and readiness/liveness on ``/health``.
The Service exposes vLLM's one port, ``http`` 8000 (OpenAI API and ``/metrics``). Of the Triton options
only ``--replicas``, ``--node-selector`` and ``--container`` (another vllm-openai tag of the pinned
release) apply; the storage, image and gateway options are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specpipe.deploy.k8s import deployment_manifest, resource_name, service_manifest
from specpipe.deploy.options import DeployOptionError, K8sOptions
from specpipe.deploy.pod import scheduling
from specpipe.fsutil import write_dir_atomically
from specpipe.serve.vllm import CONTAINER_PORT, engine_command
from specpipe.vllm import release

HF_TOKEN_SECRET = ("hf-token", "token")
SHM_SIZE = "16Gi"


def _refuse_triton_options(options: K8sOptions) -> None:
    given = [
        flag
        for flag, value in (
            ("--pvc", options.pvc),
            ("--storage-size", options.storage_size),
            ("--storage-class", options.storage_class),
            ("--image", options.image),
            ("--host-path", options.host_path),
            ("--serving-image", options.serving_image),
            ("--gateway", options.gateway),
            ("--api-key-secret", options.api_key_secret),
            ("--expose-triton", options.expose_triton),
        )
        if value
    ]
    if given:
        raise DeployOptionError(
            f"{given[0]} is for Triton repositories; a vLLM engine ships nothing (the pods download the "
            f"weights) and serves its own OpenAI API: drop it"
        )


def vllm_container(argv: list[str], gpus: int, image: str) -> dict[str, Any]:
    """The pod's container: ``vllm`` with the recorded arguments plus ``--host 0.0.0.0 --port 8000``."""
    probe = {"httpGet": {"path": release.HEALTH_PATH, "port": "http"}, "periodSeconds": 10}
    secret, key = HF_TOKEN_SECRET
    return {
        "name": "vllm",
        "image": image,
        "command": [argv[0]],
        "args": [*argv[1:], "--host", "0.0.0.0", "--port", str(CONTAINER_PORT)],
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": release.CONTAINER_HF_HOME},
        ],
        "startupProbe": {**probe, "failureThreshold": 360},
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
    }


def write_vllm_k8s(engine_dir: Path, out_dir: Path, options: K8sOptions) -> Path:
    """Write ``deployment.yaml``, ``service.yaml`` and ``README.md`` for the vLLM engine at ``engine_dir``.

    Raises:
        ManifestError: not a vLLM engine (see :func:`specpipe.serve.vllm.engine_command`).
        DeployOptionError: a Triton-only option, a bad ``--node-selector``, an image of another vLLM release.
    """
    _refuse_triton_options(options)
    options.check()
    engine, argv, gpus = engine_command(Path(engine_dir))
    image = options.container or release.IMAGE
    if image.rsplit(":", 1)[-1] != f"v{release.VLLM_VERSION}":
        raise DeployOptionError(
            f"--container {image} is not vLLM {release.VLLM_VERSION}, the release the command was "
            f"checked against: use {release.IMAGE}"
        )
    name = resource_name(engine)
    pod = {
        "containers": [vllm_container(argv, gpus, image)],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "hf-cache", "emptyDir": {}},
        ],
        **scheduling(options),
    }
    deployment = deployment_manifest(name, pod, options)
    service = service_manifest(name, {"http": CONTAINER_PORT})
    secret, key = HF_TOKEN_SECRET
    readme = (
        f"# {name}: vLLM {release.VLLM_VERSION} serving {engine}\n\n"
        f"1. Gated model? `kubectl create secret generic {secret} --from-literal={key}=$HF_TOKEN`\n"
        f"2. `kubectl apply -f deployment.yaml -f service.yaml`\n"
        f"3. `kubectl port-forward svc/{name} {CONTAINER_PORT}:{CONTAINER_PORT}`; ready when "
        f"`curl -fsS http://localhost:{CONTAINER_PORT}{release.HEALTH_PATH}` answers; OpenAI API at "
        f"http://localhost:{CONTAINER_PORT}/v1 (model '{engine}').\n\n"
        f"Each of the {options.replicas} pod(s) takes {gpus} GPU(s) and downloads the weights when it starts.\n"
    )
    files = {
        "deployment.yaml": yaml.safe_dump(deployment, sort_keys=False),
        "service.yaml": yaml.safe_dump(service, sort_keys=False),
        "README.md": readme,
    }

    def fill(root: Path) -> None:
        for filename, text in files.items():
            (root / filename).write_text(text)

    return write_dir_atomically(out_dir, fill)
