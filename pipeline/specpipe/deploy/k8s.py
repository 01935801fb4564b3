"""``specpipe deploy k8s NAME``: a Kubernetes Deployment and Service for a TensorRT-LLM repository.

One pod serves one copy of the engine: it requests TP x PP GPUs (``nvidia.com/gpu``, the NVIDIA device
plugin's resource) and runs the serving image with the exact server command of
:func:`specpipe.serve.trtllm.server_command` (``mpirun`` with one rank per GPU when TP x PP > 1) in the
environment of :func:`specpipe.serve.trtllm.server_environment` (orchestrator mode for draft-target on several GPUs).
``--replicas`` copies scale out behind the Service. Probes use Triton's health endpoints
(``/v2/health/live``: the server process answers; ``/v2/health/ready``: every model loaded); a startup
probe gives engine loading up to 30 minutes before liveness applies. The metrics port (8002,
Prometheus text at ``/metrics``) is announced with the ``prometheus.io/*`` pod annotations that
annotation-based Prometheus scrape configurations read.

The repository and the engines root are mounted read-only from the node (``hostPath``): every GPU
node that may run the pod needs them at the same paths (or replace the two volumes with a shared
volume before applying). ``/dev/shm`` is a memory-backed volume for NCCL and the Python backend.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from specpipe.errors import SpecpipeError
from specpipe.serve.trtllm import CONTAINER_PORTS, SHM_SIZE, serving_image, server_command, server_environment
from specpipe.fsutil import write_dir_atomically
from specpipe.triton.deployment import CONTAINER_ENGINES, CONTAINER_REPO
from specpipe.triton.repo_meta import read_meta
from specpipe.trtllm import release

GPU_RESOURCE = "nvidia.com/gpu"
STARTUP_SECONDS = 1800
PROBE_PERIOD_S = 10


def resource_name(repo_name: str) -> str:
    """``specpipe-<name>`` as a DNS-1123 label (lower-case letters, digits, ``-``; at most 63 characters)."""
    text = re.sub(r"[^a-z0-9-]+", "-", f"specpipe-{repo_name}".lower())
    return re.sub(r"-+", "-", text)[:63].strip("-")


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "specpipe"}


def deployment_manifest(name: str, repo_dir: Path, meta: dict[str, Any], replicas: int, image: str) -> dict[str, Any]:
    """The ``apps/v1`` Deployment."""
    gpus = int(meta["gpus"])
    probe = lambda path, failures: {"httpGet": {"path": path, "port": "http"}, "periodSeconds": PROBE_PERIOD_S,
                                    "timeoutSeconds": 5, "failureThreshold": failures}
    container = {
        "name": "triton",
        "image": image,
        "command": server_command(meta),
        **({"env": [{"name": k, "value": v} for k, v in server_environment(meta).items()]}
           if server_environment(meta) else {}),
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in CONTAINER_PORTS.items()],
        "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
        "startupProbe": probe("/v2/health/live", STARTUP_SECONDS // PROBE_PERIOD_S),
        "livenessProbe": probe("/v2/health/live", 3),
        "readinessProbe": probe("/v2/health/ready", 3),
        "volumeMounts": [
            {"name": "model-repository", "mountPath": CONTAINER_REPO, "readOnly": True},
            {"name": "engines", "mountPath": CONTAINER_ENGINES, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _labels(name)},
            "template": {
                "metadata": {
                    "labels": _labels(name),
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(CONTAINER_PORTS["metrics"]),
                                    "prometheus.io/path": "/metrics"},
                },
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "model-repository", "hostPath": {"path": str(Path(repo_dir).absolute()), "type": "Directory"}},
                        {"name": "engines", "hostPath": {"path": str(meta["engines_root"]), "type": "Directory"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.upper().replace("G", "Gi")}},
                    ],
                },
            },
        },
    }


def service_manifest(name: str) -> dict[str, Any]:
    """The ``v1`` Service in front of the pods (HTTP, gRPC and metrics ports)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(name),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in CONTAINER_PORTS.items()],
        },
    }


def write_k8s(repo_dir: Path, out_dir: Path, *, replicas: int = 1, container: str | None = None) -> Path:
    """Write ``deployment.yaml`` and ``service.yaml`` for the repository at ``repo_dir`` into ``out_dir``.

    Raises:
        SpecpipeError: no TensorRT-LLM repository, ``replicas`` < 1, or a container of another or
            unknown TensorRT-LLM release.
    """
    repo_dir = Path(repo_dir)
    meta = read_meta(repo_dir) if repo_dir.is_dir() else None
    if meta is None:
        raise SpecpipeError(f"no TensorRT-LLM repository at {repo_dir}: run 'specpipe package NAME' for a --runtime trtllm engine first")
    if replicas < 1:
        raise SpecpipeError(f"--replicas must be >= 1, got {replicas}")
    container = container or meta["container_image"]
    release.check_container_for_engine(container, meta["tensorrt_llm"], meta["engine"])
    name = resource_name(repo_dir.name)
    docs = {"deployment.yaml": deployment_manifest(name, repo_dir, meta, replicas, serving_image(container)),
            "service.yaml": service_manifest(name)}

    def fill(root: Path) -> None:
        for filename, doc in docs.items():
            (root / filename).write_text(yaml.safe_dump(doc, sort_keys=False))

    return write_dir_atomically(out_dir, fill)
