"""``deploy k8s`` on a PersistentVolumeClaim (the default): the claim, a loader pod, ``load-data.sh``.

The claim holds ``repository/`` (the pod's ``/models``) and ``engines/REL`` for every path the
repository names (``engines/`` is the pod's ``/engines``; :mod:`specpipe.deploy.storage`). The pods
mount it read-only. One replica: ``ReadWriteOnce`` (one node at a time; the Deployment then uses the
``Recreate`` strategy, since a rolling update's new pod could not attach a volume the old pod holds on
another node). Several replicas: ``ReadWriteMany``, which needs a storage class that offers it (NFS,
CephFS, a cloud file store).

``load-data.sh`` fills the claim from the build host with ``kubectl cp`` through a loader pod that
mounts the claim read-write (the serving image, which has ``tar``, idling), then deletes the pod;
re-running it replaces the copies. Every host path in it is absolute (it runs from any folder), and
it checks that they all exist before its first ``kubectl`` call.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any

from specpipe.deploy.options import K8sOptions
from specpipe.deploy.pod import scheduling
from specpipe.deploy.storage import CLAIM_ENGINES, CLAIM_REPOSITORY, PodData

LOADER_MOUNT = "/data"


def access_modes(replicas: int) -> list[str]:
    """``ReadWriteOnce`` for one replica, ``ReadWriteMany`` for several (pods on several nodes)."""
    return ["ReadWriteOnce"] if replicas == 1 else ["ReadWriteMany"]


def claim_manifest(claim: str, size: str, options: K8sOptions, labels: dict[str, str]) -> dict[str, Any]:
    """The ``v1`` PersistentVolumeClaim of ``size`` (a quantity such as ``17Gi``)."""
    spec: dict[str, Any] = {"accessModes": access_modes(options.replicas), "resources": {"requests": {"storage": size}}}
    if options.storage_class:
        spec["storageClassName"] = options.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "labels": labels},
        "spec": spec,
    }


def loader_name(name: str) -> str:
    """The loader pod's name (``NAME-loader``, at most 63 characters)."""
    return f"{name[:56].rstrip('-')}-loader"


def loader_manifest(name: str, claim: str, image: str, options: K8sOptions, labels: dict[str, str]) -> dict[str, Any]:
    """The ``v1`` Pod that mounts the claim read-write at :data:`LOADER_MOUNT` for ``kubectl cp``.

    It has the deployment's node selector and toleration, so that a zonal volume is created where
    the GPU pods can attach it; its labels differ from the Deployment's selector.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": loader_name(name), "labels": {**labels, "app.kubernetes.io/component": "loader"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "loader",
                    "image": image,
                    "command": ["sleep", "infinity"],
                    "volumeMounts": [{"name": "data", "mountPath": LOADER_MOUNT}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            **scheduling(options),
        },
    }


def load_script(name: str, data: PodData, defines_claim: bool) -> str:
    """``load-data.sh``: create the claim (when the output defines it), copy the repository and the
    engine paths onto it through the loader pod, delete the pod."""
    pod = loader_name(name)
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"# Copy {data.repo_dir.name}'s repository and engine files onto its claim (kubectl's current "
        "context and namespace).",
        "set -eu",
        'here=$(cd "$(dirname "$0")" && pwd)',
        *data.check_script(),
    ]
    if defines_claim:
        lines.append('kubectl apply -f "$here/pvc.yaml"')
    lines += ['kubectl apply -f "$here/loader.yaml"', f"kubectl wait --for=condition=Ready pod/{pod} --timeout=15m"]
    targets = [(data.repo_dir, f"{LOADER_MOUNT}/{CLAIM_REPOSITORY}")]
    targets += [(data.host_path(rel), f"{LOADER_MOUNT}/{CLAIM_ENGINES}/{rel}") for rel in data.paths]
    parents = sorted({str(PurePosixPath(dest).parent) for _, dest in targets})
    lines.append(f"kubectl exec {pod} -- rm -rf {' '.join(q(dest) for _, dest in targets)}")
    lines.append(f"kubectl exec {pod} -- mkdir -p {' '.join(q(p) for p in parents)}")
    lines += [f"kubectl cp {q(str(source))} {q(f'{pod}:{dest}')}" for source, dest in targets]
    lines += [
        f"kubectl delete pod {pod}",
        'echo "data loaded: kubectl apply -f $here/deployment.yaml -f $here/service.yaml"',
    ]
    return "\n".join(lines) + "\n"
