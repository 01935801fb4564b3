"""``specpipe deploy k8s NAME``: Kubernetes manifests for a TensorRT-LLM repository.

One pod serves one copy of the engine (:mod:`specpipe.deploy.pod`: Triton with TP x PP GPUs, and
the OpenAI-compatible gateway as a sidecar for engine-flow repositories); ``--replicas`` copies
scale out behind the Service, which has Triton's metrics port, the gateway's ``openai`` port, and
Triton's HTTP and gRPC ports unless the gateway has an API key (Triton's ports have no
authentication: with a key they would bypass it; ``--expose-triton`` keeps them). Triton's metrics port (8002, Prometheus text at ``/metrics``) is announced with
the ``prometheus.io/*`` pod annotations that annotation-based Prometheus scrape configurations read.

Where the repository and the engines come from (the pod's paths stay ``/models`` and ``/engines``):

- a PersistentVolumeClaim (default; :mod:`specpipe.deploy.claim`): ``pvc.yaml`` defines one sized
  from the data on disk, or ``--pvc NAME`` uses an existing claim; ``load-data.sh`` fills it;
- ``--image REGISTRY/NAME:TAG``: an image with the data baked in (:mod:`specpipe.deploy.image`:
  ``Dockerfile`` and ``build-image.sh``);
- ``--host-path``: the build host's folders, mounted from every node at the same paths.

``README.md`` in the output folder lists the steps for the variant written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from specpipe.deploy import claim as claim_files
from specpipe.deploy import image as image_files
from specpipe.deploy.options import STORAGE_IMAGE, STORAGE_PVC, DeployOptionError, K8sOptions
from specpipe.deploy.pod import gateway_container, rollout_strategy, scheduling, triton_container, volumes
from specpipe.deploy.readme import readme
from specpipe.deploy.storage import check_size_fits, claim_size, pod_data
from specpipe.errors import SpecpipeError
from specpipe.fsutil import write_dir_atomically
from specpipe.openai import CONTAINER_PORT
from specpipe.progress import warn
from specpipe.serve.trtllm import CONTAINER_PORTS, container_launch, serving_image
from specpipe.triton.repo_meta import read_meta
from specpipe.trtllm import release


def resource_name(repo_name: str) -> str:
    """``specpipe-<name>`` as a DNS-1123 label (lower-case letters, digits, ``-``; at most 63 characters)."""
    text = re.sub(r"[^a-z0-9-]+", "-", f"specpipe-{repo_name}".lower())
    return re.sub(r"-+", "-", text)[:63].strip("-")


def labels(name: str) -> dict[str, str]:
    """The labels of every object of deployment ``name``; the Deployment and Service select on them."""
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "specpipe"}


def deployment_manifest(
    name: str, pod: dict[str, Any], options: K8sOptions, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """The ``apps/v1`` Deployment of ``options.replicas`` pods of spec ``pod`` (template ``annotations`` if
    any); its rollouts never need spare GPUs (:func:`specpipe.deploy.pod.rollout_strategy`)."""
    template = {"labels": labels(name), **({"annotations": annotations} if annotations else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "replicas": options.replicas,
            "strategy": rollout_strategy(options.replicas),
            "selector": {"matchLabels": labels(name)},
            "template": {"metadata": template, "spec": pod},
        },
    }


def service_manifest(name: str, ports: dict[str, int]) -> dict[str, Any]:
    """The ``v1`` ClusterIP Service in front of deployment ``name``'s pods, one TCP port per ``ports`` entry
    (the container port of that name)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": labels(name),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()],
        },
    }


def _service_ports(gateway: bool, triton: bool) -> dict[str, int]:
    """Triton's metrics port, its HTTP and gRPC ports when ``triton``, the gateway's ``openai`` port when
    ``gateway``."""
    ports = {n: p for n, p in CONTAINER_PORTS.items() if triton or n == "metrics"}
    ports.update({"openai": CONTAINER_PORT} if gateway else {})
    return ports


#: Where Prometheus's pod discovery finds Triton's metrics.
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(CONTAINER_PORTS["metrics"]),
    "prometheus.io/path": "/metrics",
}


def _wants_gateway(options: K8sOptions, meta: dict[str, Any], repo_name: str) -> bool:
    if meta["runtime"] == "trtllm":
        return options.gateway is not False
    if options.gateway or options.api_key_secret:
        raise DeployOptionError(
            f"the gateway talks to an ensemble and its preprocessing model, which the LLM API repository "
            f"{repo_name} does not have: deploy it without --gateway and --api-key-secret"
        )
    return False


def write_k8s(repo_dir: Path, out_dir: Path, options: K8sOptions | None = None, **fields) -> Path:
    """Write the manifests (and the files of the storage variant) for the repository at ``repo_dir``
    into ``out_dir``; ``fields`` are :class:`K8sOptions` fields when ``options`` is not given.

    Raises:
        SpecpipeError: no TensorRT-LLM repository, bad options (:meth:`K8sOptions.check`), a
            container of another or unknown TensorRT-LLM release, the gateway asked for an LLM API
            repository, or a claim to size whose engine is not on disk (pass ``storage_size``).
    """
    options = options or K8sOptions(**fields)
    repo_dir = Path(repo_dir).absolute()
    meta = read_meta(repo_dir) if repo_dir.is_dir() else None
    if meta is None:
        raise SpecpipeError(
            f"no TensorRT-LLM repository at {repo_dir}: run 'specpipe package NAME' for a --runtime trtllm engine first"
        )
    options.check()
    container = options.container or meta["container_image"]
    release.check_container_for_engine(container, meta["tensorrt_llm"], meta["engine"])
    name, storage = resource_name(repo_dir.name), options.storage
    gateway = _wants_gateway(options, meta, repo_dir.name)
    data = pod_data(repo_dir, Path(meta["engines_root"]))
    serving = options.serving_image or serving_image(container)
    image = options.image or serving
    claim = options.pvc or f"{name}-data"
    files: dict[str, str] = {}
    if storage == STORAGE_PVC and not options.pvc:
        if options.storage_size is not None:
            check_size_fits(options.storage_size, data)
        size = options.storage_size if options.storage_size is not None else claim_size(data)
        files["pvc.yaml"] = yaml.safe_dump(
            claim_files.claim_manifest(claim, size, options, labels(name)), sort_keys=False
        )
    if storage == STORAGE_PVC:
        loader = claim_files.loader_manifest(name, claim, serving, options, labels(name))
        files["loader.yaml"] = yaml.safe_dump(loader, sort_keys=False)
        files["load-data.sh"] = claim_files.load_script(name, data, defines_claim=not options.pvc)
    if storage == STORAGE_IMAGE:
        local_build = (
            None if options.serving_image else container_launch(repo_dir, meta, container=container).build_argv
        )
        files["Dockerfile"] = image_files.dockerfile(repo_dir.name, data, serving)
        files["build-image.sh"] = image_files.build_script(image, data, serving, local_build)
    containers = [triton_container(meta, image, storage)]
    if gateway:
        containers.append(gateway_container(repo_dir.name, image, storage, options))
    pod = {"containers": containers, "volumes": volumes(storage, repo_dir, meta, claim, options), **scheduling(options)}
    deployment = deployment_manifest(name, pod, options, SCRAPE_ANNOTATIONS)
    files["deployment.yaml"] = yaml.safe_dump(deployment, sort_keys=False)
    triton_ports = options.expose_triton or not (gateway and options.api_key_secret)
    files["service.yaml"] = yaml.safe_dump(
        service_manifest(name, _service_ports(gateway, triton_ports)), sort_keys=False
    )
    files["README.md"] = readme(repo_dir.name, name, options, data, gateway, claim, image, serving, sorted(files))

    def fill(root: Path) -> None:
        for filename, text in files.items():
            (root / filename).write_text(text)
            if filename.endswith(".sh"):
                (root / filename).chmod(0o755)

    written = write_dir_atomically(out_dir, fill)
    if not options.serving_image and storage != STORAGE_IMAGE:  # a baked image is pushed by build-image.sh
        warn(
            f"the pods run {serving}, a local tag a cluster cannot pull: push it and write the manifests again with "
            f"--serving-image REGISTRY/{serving} (steps: {written / 'README.md'})"
        )
    return written
