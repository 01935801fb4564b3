"""The pod of ``specpipe deploy k8s``: the Triton container, the gateway sidecar, volumes, scheduling.

**Triton** runs the exact command of :func:`specpipe.serve.trtllm.server_command` in the
environment of :func:`specpipe.serve.trtllm.server_environment` and requests TP x PP
``nvidia.com/gpu`` (the NVIDIA device plugin's resource). Probes use Triton's health endpoints
(``/v2/health/live``: the server process answers; ``/v2/health/ready``: every model loaded); a
startup probe gives engine loading up to 30 minutes before liveness applies.

**The gateway** (:mod:`specpipe.openai`) is a sidecar rather than a Deployment of its own: it loads
the tokenizer from the path the ``preprocessing`` model names (``/engines/NAME/tokenizer``), which
the sidecar sees through the same volume (or the same baked image); it talks gRPC to its own Triton
over ``localhost``, so no Service hop and no cross-pod traffic; it scales with the replicas; and its
readiness (``/health``: its Triton is ready) makes the pod take traffic only when the whole path
answers. Its liveness asks ``/metrics``, which the gateway answers by itself: a liveness on
``/health`` would restart the gateway for as long as Triton loads or reloads an engine. It runs
``python3 -m specpipe.cli gateway`` from the serving image (which has specpipe installed), binds
``0.0.0.0`` inside the pod, and reads its API key with ``--api-key-file`` from the Secret mounted as
a file (:data:`API_KEY_DIR`): no key is ever written into a manifest, nor put in the environment,
and a trailing newline in the Secret is stripped as for every key source
(:func:`specpipe.openai.auth.resolve_api_key`).

**Rollouts** never need more GPUs than the replicas hold (:func:`rollout_strategy`): an update stops
an old pod before it starts its replacement, since a surge pod would wait Pending for free GPUs.

**Scheduling**: ``--node-selector`` labels, and a toleration of the ``nvidia.com/gpu`` taint that
GPU node pools carry (``NoSchedule``), so the pods can land on tainted GPU nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpipe.deploy.options import STORAGE_HOST_PATH, STORAGE_IMAGE, STORAGE_PVC, K8sOptions
from specpipe.deploy.storage import CLAIM_ENGINES, CLAIM_REPOSITORY
from specpipe.openai import CONTAINER_HOST, CONTAINER_PORT
from specpipe.serve.trtllm import CONTAINER_PORTS, SHM_SIZE, server_command, server_environment
from specpipe.triton.deployment import CONTAINER_ENGINES, CONTAINER_REPO

GPU_RESOURCE = "nvidia.com/gpu"
STARTUP_SECONDS = 1800
PROBE_PERIOD_S = 10
#: The toleration of the taint GPU node pools put on their nodes.
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
#: The gateway's share of a node: tokenization and JSON, no GPU.
GATEWAY_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}}
#: Where the gateway sidecar mounts the API-key Secret (read-only); the key is the file ``api-key``.
API_KEY_DIR = "/var/run/secrets/specpipe"
API_KEY_FILE = f"{API_KEY_DIR}/api-key"


def rollout_strategy(replicas: int) -> dict[str, Any]:
    """The Deployment's ``strategy``: ``Recreate`` for one replica (also what a ``ReadWriteOnce``
    claim needs: :mod:`specpipe.deploy.claim`), else a rolling update that replaces one pod at a
    time with no surge pod (``maxSurge: 0``), so an update never waits for GPUs the cluster lacks."""
    if replicas == 1:
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def _probe(path: str, port: str, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": PROBE_PERIOD_S,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def triton_container(meta: dict[str, Any], image: str, storage: str) -> dict[str, Any]:
    """The Triton container: server command and environment, GPUs, ports, probes, mounts."""
    gpus = int(meta["gpus"])
    env = server_environment(meta)
    return {
        "name": "triton",
        "image": image,
        "command": server_command(meta),
        **({"env": [{"name": k, "value": v} for k, v in env.items()]} if env else {}),
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in CONTAINER_PORTS.items()],
        "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
        "startupProbe": _probe("/v2/health/live", "http", STARTUP_SECONDS // PROBE_PERIOD_S),
        "livenessProbe": _probe("/v2/health/live", "http", 3),
        "readinessProbe": _probe("/v2/health/ready", "http", 3),
        "volumeMounts": [*_data_mounts(storage, repository=True), {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def gateway_container(name: str, image: str, storage: str, options: K8sOptions) -> dict[str, Any]:
    """The gateway sidecar for deployment ``name`` (the model id it serves)."""
    command = [
        "python3",
        "-m",
        "specpipe.cli",
        "gateway",
        "--triton-url",
        f"localhost:{CONTAINER_PORTS['grpc']}",
        "--name",
        name,
        "--host",
        CONTAINER_HOST,
        "--port",
        str(CONTAINER_PORT),
    ]
    if options.api_key_secret:
        command += ["--api-key-file", API_KEY_FILE]
    container: dict[str, Any] = {"name": "openai", "image": image, "command": command}
    container.update(
        {
            "ports": [{"name": "openai", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
            "resources": GATEWAY_RESOURCES,
            "readinessProbe": _probe("/health", "openai", 3),
            "livenessProbe": _probe("/metrics", "openai", 3),
        }
    )
    mounts = _data_mounts(storage, repository=False)
    if options.api_key_secret:
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _data_mounts(storage: str, repository: bool) -> list[dict[str, Any]]:
    """Mounts of the repository (``/models``, Triton only) and the engines (``/engines``), read-only."""
    if storage == STORAGE_IMAGE:
        return []
    if storage == STORAGE_PVC:
        mounts = [("data", CONTAINER_REPO, CLAIM_REPOSITORY), ("data", CONTAINER_ENGINES, CLAIM_ENGINES)]
    else:
        mounts = [("model-repository", CONTAINER_REPO, None), ("engines", CONTAINER_ENGINES, None)]
    return [
        {"name": v, "mountPath": path, "readOnly": True, **({"subPath": sub} if sub else {})}
        for v, path, sub in mounts
        if repository or path != CONTAINER_REPO
    ]


def volumes(
    storage: str, repo_dir: Path, meta: dict[str, Any], claim: str | None, options: K8sOptions | None = None
) -> list[dict[str, Any]]:
    """The pod's volumes: the data (claim, host folders or none for a baked image), ``/dev/shm`` and
    the API-key Secret (its one key as the file ``api-key``) when ``options`` names one."""
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.upper().replace("G", "Gi")}}
    if storage == STORAGE_PVC:
        found = [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}, shm]
    elif storage == STORAGE_HOST_PATH:
        found = [
            {"name": "model-repository", "hostPath": {"path": str(Path(repo_dir).absolute()), "type": "Directory"}},
            {"name": "engines", "hostPath": {"path": str(Path(meta["engines_root"]).absolute()), "type": "Directory"}},
            shm,
        ]
    else:
        found = [shm]
    if options is not None and options.api_key_secret:
        found.append(
            {
                "name": "api-key",
                "secret": {
                    "secretName": options.api_key_secret,
                    "items": [{"key": options.api_key_secret_key, "path": API_KEY_FILE.rsplit("/", 1)[1]}],
                },
            }
        )
    return found


def scheduling(options: K8sOptions) -> dict[str, Any]:
    """``nodeSelector`` (when asked) and the GPU taint's toleration."""
    labels = options.node_labels()
    return {**({"nodeSelector": labels} if labels else {}), "tolerations": [dict(GPU_TOLERATION)]}
