"""``README.md`` of a ``deploy k8s`` output folder: the steps, in order, for the variant written."""

from __future__ import annotations

from specpipe import __version__
from specpipe.deploy.claim import access_modes, loader_name
from specpipe.deploy.options import STORAGE_HOST_PATH, STORAGE_IMAGE, STORAGE_PVC, K8sOptions
from specpipe.deploy.storage import CLAIM_ENGINES, CLAIM_REPOSITORY, PodData
from specpipe.openai import CONTAINER_PORT
from specpipe.triton.deployment import CONTAINER_ENGINES, CONTAINER_REPO


def _image_steps(options: K8sOptions, image: str, serving: str) -> list[str]:
    if options.storage == STORAGE_IMAGE:
        return [
            f"`./build-image.sh` builds `{image}` FROM the serving image `{serving}` (the repository at "
            f"`{CONTAINER_REPO}`, the engine files under `{CONTAINER_ENGINES}`; named build contexts need BuildKit, "
            "Docker's default builder since Docker 23) and pushes it. The pods pull it: no volume to fill."
        ]
    if options.serving_image:
        return [f"The pods run `{serving}`: make sure the cluster can pull it."]
    registry = f"REGISTRY/{serving}"
    return [
        f"The pods run the serving image `{serving}`, a local build of `docker/Dockerfile` that a cluster cannot pull. "
        "Push it to a registry the cluster pulls from and write these manifests again with `--serving-image`:",
        "",
        f"    docker tag {serving} {registry} && docker push {registry}",
        f"    specpipe deploy k8s ... --serving-image {registry}",
    ]


def _data_steps(options: K8sOptions, data: PodData, name: str, claim: str, files: list[str]) -> list[str]:
    layout = [f"    {CLAIM_REPOSITORY}/   <- {data.repo_dir}   (the pods' {CONTAINER_REPO})"]
    layout += [
        f"    {CLAIM_ENGINES}/{rel}   <- {data.host_path(rel)}   (the pods' {CONTAINER_ENGINES}/{rel})"
        for rel in data.paths
    ]
    if options.storage == STORAGE_HOST_PATH:
        return [
            f"The pods mount `{data.repo_dir}` and `{data.engines_root}` from the node they run on (`hostPath`): every GPU "
            "node that may run them needs both at these paths."
        ]
    if options.storage != STORAGE_PVC:
        return []
    made = (
        "`pvc.yaml` defines the claim `{0}` ({1}, access mode {2}{3}); ".format(
            claim,
            "size measured on disk plus 20 %" if not options.storage_size else f"size {options.storage_size}",
            access_modes(options.replicas)[0],
            f", storage class {options.storage_class}"
            if options.storage_class
            else ", the cluster's default storage class",
        )
        if "pvc.yaml" in files
        else f"The existing claim `{claim}` must hold the data; "
    )
    steps = [
        made + f"`./load-data.sh` creates it if needed, starts the pod `{loader_name(name)}` that mounts "
        "it read-write, copies the data with `kubectl cp` and deletes the pod. The claim's layout:",
        "",
        *layout,
        "",
    ]
    if options.replicas > 1:
        steps += ["Several replicas read the claim from several nodes: its storage class must offer ReadWriteMany.", ""]
    steps += [
        "`kubectl cp` streams through the API server; for engines of many GB a Job that fetches them from your "
        "object store into the same layout does the same faster."
    ]
    return steps


def _key_steps(options: K8sOptions, gateway: bool) -> list[str]:
    if not gateway:
        return []
    if options.api_key_secret:
        triton = (
            "The Service keeps Triton's HTTP and gRPC ports (`--expose-triton`): they have no authentication, so "
            "anything that reaches them bypasses the key."
            if options.expose_triton
            else "The Service leaves out Triton's HTTP and gRPC ports, which have no authentication and would bypass the key "
            "(its metrics port 8002 stays for Prometheus); `--expose-triton` puts them back."
        )
        return [
            f"The gateway reads its API key from the Secret `{options.api_key_secret}`, key `{options.api_key_secret_key}`, "
            "mounted as a file (`--api-key-file`; never in the manifests or the environment). Create it (the key without "
            "a trailing newline; surrounding whitespace is stripped anyway, an empty key is refused):",
            "",
            "    python3 -c 'import secrets; print(secrets.token_urlsafe(32), end=\"\")' > api-key.txt",
            f"    kubectl create secret generic {options.api_key_secret} --from-file={options.api_key_secret_key}=api-key.txt",
            "",
            "Clients send it as `Authorization: Bearer KEY`; `/health` and `/metrics` stay open for probes and Prometheus.",
            "",
            triton,
        ]
    return [
        "The gateway runs without an API key: anything that reaches the Service can use it. Write the manifests again "
        "with `--api-key-secret NAME` to require one."
    ]


def readme(
    repo_name: str,
    name: str,
    options: K8sOptions,
    data: PodData,
    gateway: bool,
    claim: str,
    image: str,
    serving: str,
    files: list[str],
) -> str:
    """The README text (Markdown)."""
    sections = [
        ("Images", _image_steps(options, image, serving)),
        ("Data", _data_steps(options, data, name, claim, files)),
        ("API key", _key_steps(options, gateway)),
    ]
    lines = [
        f"# Kubernetes manifests for {repo_name}",
        "",
        f"Written by specpipe {__version__} (`specpipe deploy k8s {repo_name}`): {', '.join(f'`{f}`' for f in files + ['README.md'])}.",
        "",
    ]
    step = 0
    for title, body in sections:
        if body:
            step += 1
            lines += [f"## {step}. {title}", "", *body, ""]
    lines += [f"## {step + 1}. Apply", "", "    kubectl apply -f deployment.yaml -f service.yaml", ""]
    if gateway:
        lines += [
            f"The OpenAI-compatible API is the Service's `openai` port {CONTAINER_PORT}, model `{repo_name}`:",
            "",
            f"    kubectl port-forward svc/{name} {CONTAINER_PORT}:{CONTAINER_PORT}   # then http://localhost:{CONTAINER_PORT}/v1",
            "",
            f"Its own metrics are at `:{CONTAINER_PORT}/metrics` (the `prometheus.io/*` annotations name Triton's 8002).",
        ]
    else:
        lines += [f"Triton answers on the Service `{name}` (HTTP 8000, gRPC 8001, metrics 8002)."]
    lines += [
        "",
        "Updates stop an old pod before its replacement starts (`Recreate` for one replica, `maxSurge: 0` for "
        "several), so a rollout never waits for spare GPUs.",
    ]
    return "\n".join(lines) + "\n"
