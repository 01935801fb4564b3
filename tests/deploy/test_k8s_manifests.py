"""Kubernetes manifests: strict validation against the Kubernetes object schemas (offline) for every
storage variant (claim defined or existing, baked image, hostPath) with and without the gateway,
GPUs = TP x PP, probes, Prometheus annotations, replicas, the claim's size, the API-key Secret
reference, scheduling, the data copies, and bad input."""

import os
import shlex

import pytest
import yaml
from click.testing import CliRunner
from trtllm_deployments import plan_json

from specpipe.cli import main
from specpipe.cli.gateway import gateway as gateway_command
from specpipe.deploy.k8s import resource_name, write_k8s
from specpipe.deploy.storage import pod_data
from specpipe.errors import SpecpipeError
from specpipe.serve.trtllm import server_command
from specpipe.triton.repo_meta import read_meta
from specpipe.triton.repository import package_plan

K8S_VERSION = "1.33.0"
ENGINE = "llama3-70b-none"
GiB = 2**30
VARIANTS = {
    "pvc": [],
    "pvc-existing": ["--pvc", "shared-models"],
    "image": ["--image", "registry.example.com/llm/llama70b:1"],
    "host-path": ["--host-path"],
}


@pytest.fixture(scope="module")
def tp4(tmp_path_factory):
    """A TP 4 engine-flow repository whose engine files are on disk: 5 GiB of target (sparse), a tokenizer."""
    tmp = tmp_path_factory.mktemp("k8s")
    repo = package_plan(plan_json(tmp, target="llama3-70b", draft="none", tp=4), "llama3.1_70b", tmp / "repos")
    engine = tmp / "engines" / ENGINE
    (engine / "target").mkdir(parents=True)
    (engine / "tokenizer").mkdir()
    with open(engine / "target" / "rank0.engine", "wb") as f:
        f.truncate(5 * GiB)
    (engine / "tokenizer" / "tokenizer.json").write_text("{}")
    return tmp, repo


def deploy(tp4, out: str, *extra: str):
    """``specpipe deploy k8s`` through the CLI: (output folder, {file: parsed YAML or text})."""
    tmp, _ = tp4
    result = CliRunner().invoke(
        main, ["deploy", "k8s", "llama3.1_70b", "--repo-dir", str(tmp / "repos"), "--out-dir", str(tmp / out), *extra]
    )
    assert result.exit_code == 0, result.output
    files = {
        p.name: (yaml.safe_load(p.read_text()) if p.suffix == ".yaml" else p.read_text()) for p in (tmp / out).iterdir()
    }
    return tmp / out, files


def pod(files):
    return files["deployment.yaml"]["spec"]["template"]["spec"]


def containers(files):
    return {c["name"]: c for c in pod(files)["containers"]}


@pytest.mark.parametrize("gateway", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_validates_strictly_against_the_schemas(tp4, variant, gateway):
    import kubernetes_validate

    extra = VARIANTS[variant] + ([] if gateway else ["--no-gateway"]) + ["--api-key-secret", "gw-key"] * gateway
    _, files = deploy(
        tp4, f"out-{variant}-{gateway}", "--replicas", "2", "--node-selector", "nvidia.com/gpu.present=true", *extra
    )
    manifests = {name: doc for name, doc in files.items() if name.endswith(".yaml")}
    expected = {"deployment.yaml", "service.yaml"} | {
        "pvc": {"pvc.yaml", "loader.yaml"},
        "pvc-existing": {"loader.yaml"},
    }.get(variant, set())
    assert set(manifests) == expected
    for doc in manifests.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert set(containers(files)) == ({"triton", "openai"} if gateway else {"triton"})
    if gateway:  # the Secret's default key, mounted as the file the gateway reads
        secret = {v["name"]: v for v in pod(files)["volumes"]}["api-key"]["secret"]
        assert secret == {"secretName": "gw-key", "items": [{"key": "api-key", "path": "api-key"}]}
    assert ("hostPath" in yaml.safe_dump(files["deployment.yaml"])) == (variant == "host-path")
    broken = yaml.safe_load(yaml.safe_dump(files["deployment.yaml"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGets"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGets"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.fixture(scope="module")
def default(tp4):
    return deploy(tp4, "out", "--replicas", "3")


def test_deployment_gpus_probes_metrics_and_replicas(tp4, default):
    _, repo = tp4
    _, files = default
    deployment = files["deployment.yaml"]
    assert deployment["metadata"]["name"] == "specpipe-llama3-1-70b" == resource_name("llama3.1_70b")
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8002",
        "prometheus.io/path": "/metrics",
    }
    triton = containers(files)["triton"]
    assert triton["resources"] == {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 4}}
    assert triton["command"] == server_command(read_meta(repo)) and triton["command"][0] == "mpirun"
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert triton["startupProbe"]["failureThreshold"] * triton["startupProbe"]["periodSeconds"] == 1800
    assert {p["name"]: p["containerPort"] for p in triton["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert template["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod(files)["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeSelector" not in pod(files)
    # 3 replicas: RWX claim, rolling one pod at a time without a surge pod (no spare GPUs needed)
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_default_is_a_claim_sized_from_the_data_on_disk(tp4, default):
    tmp, repo = tp4
    _, files = default
    claim = files["pvc.yaml"]
    assert claim["metadata"]["name"] == "specpipe-llama3-1-70b-data"
    repo_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(repo) for f in fs)
    expected = -(-int((5 * GiB + 2 + repo_bytes) * 1.2) // GiB)  # 6 GiB of data plus 20 %, rounded up
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{expected}Gi"}}}
    assert expected == 7
    volumes = {v["name"]: v for v in pod(files)["volumes"]}
    assert volumes["data"] == {
        "name": "data",
        "persistentVolumeClaim": {"claimName": "specpipe-llama3-1-70b-data", "readOnly": True},
    }
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    mounts = {
        m["mountPath"]: (m["name"], m.get("subPath"), m.get("readOnly", False))
        for m in containers(files)["triton"]["volumeMounts"]
    }
    assert mounts == {
        "/models": ("data", "repository", True),
        "/engines": ("data", "engines", True),
        "/dev/shm": ("dshm", None, False),
    }
    gateway_mounts = containers(files)["openai"]["volumeMounts"]
    assert gateway_mounts == [{"name": "data", "mountPath": "/engines", "readOnly": True, "subPath": "engines"}]
    assert "hostPath" not in yaml.safe_dump(files["deployment.yaml"])


def test_load_script_copies_exactly_what_the_repository_names(tp4, default):
    tmp, repo = tp4
    out, files = default
    assert pod_data(repo, tmp / "engines").paths == (f"{ENGINE}/target", f"{ENGINE}/tokenizer")
    commands = [shlex.split(line) for line in files["load-data.sh"].splitlines() if line.startswith("kubectl cp")]
    assert commands == [
        ["kubectl", "cp", str(repo), "specpipe-llama3-1-70b-loader:/data/repository"],
        [
            "kubectl",
            "cp",
            str(tmp / "engines" / ENGINE / "target"),
            f"specpipe-llama3-1-70b-loader:/data/engines/{ENGINE}/target",
        ],
        [
            "kubectl",
            "cp",
            str(tmp / "engines" / ENGINE / "tokenizer"),
            f"specpipe-llama3-1-70b-loader:/data/engines/{ENGINE}/tokenizer",
        ],
    ]
    assert os.access(out / "load-data.sh", os.X_OK)
    loader = files["loader.yaml"]["spec"]
    assert loader["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "specpipe-llama3-1-70b-data"}}]
    assert loader["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert files["loader.yaml"]["metadata"]["labels"] != files["deployment.yaml"]["spec"]["selector"]["matchLabels"]
    assert "./load-data.sh" in files["README.md"] and "kubectl cp" in files["README.md"]


def test_one_replica_claim_is_read_write_once_and_recreates(tp4):
    _, files = deploy(tp4, "out-one", "--storage-size", "300Gi", "--storage-class", "fast-ssd")
    assert files["pvc.yaml"]["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "300Gi"}},
        "storageClassName": "fast-ssd",
    }
    assert files["deployment.yaml"]["spec"]["strategy"] == {"type": "Recreate"}


def test_existing_claim_is_referenced_not_defined(tp4):
    _, files = deploy(tp4, "out-existing", "--pvc", "shared-models")
    assert "pvc.yaml" not in files and 'kubectl apply -f "$here/pvc.yaml"' not in files["load-data.sh"]
    assert pod(files)["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-models", "readOnly": True}
    assert files["loader.yaml"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-models"}


def test_api_key_comes_from_the_secret_and_the_gateway_is_a_sidecar(tp4):
    _, files = deploy(
        tp4,
        "out-key",
        "--api-key-secret",
        "llm-gateway",
        "--api-key-secret-key",
        "token",
        "--node-selector",
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "--node-selector",
        "pool=gpu",
    )
    sidecar = containers(files)["openai"]
    assert "env" not in sidecar  # the key is a mounted file, not in the environment
    assert {v["name"]: v for v in pod(files)["volumes"]}["api-key"]["secret"] == {
        "secretName": "llm-gateway",
        "items": [{"key": "token", "path": "api-key"}],
    }
    assert {"name": "api-key", "mountPath": "/var/run/secrets/specpipe", "readOnly": True} in sidecar["volumeMounts"]
    assert sidecar["image"] == containers(files)["triton"]["image"] == "specpipe-triton:0.1.0-26.04"
    assert sidecar["command"][:4] == ["python3", "-m", "specpipe.cli", "gateway"]
    parsed = gateway_command.make_context(
        "gateway", sidecar["command"][4:]
    ).params  # the real command takes these arguments
    assert (parsed["triton_url"], parsed["name"], parsed["host"], parsed["port"]) == (
        "localhost:8001",
        "llama3.1_70b",
        "0.0.0.0",
        9000,
    )
    assert parsed["api_key"] is None and str(parsed["api_key_file"]) == "/var/run/secrets/specpipe/api-key"
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/health", "port": "openai"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "openai"}
    assert sidecar["ports"] == [{"name": "openai", "containerPort": 9000, "protocol": "TCP"}]
    assert "resources" in sidecar and "nvidia.com/gpu" not in yaml.safe_dump(sidecar)
    service = files["service.yaml"]
    assert service["spec"]["selector"] == files["deployment.yaml"]["spec"]["selector"]["matchLabels"]
    # with a key, Triton's unauthenticated HTTP and gRPC ports stay out of the Service
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "metrics": (8002, "metrics"),
        "openai": (9000, "openai"),
    }
    assert pod(files)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "gpu"}
    assert files["loader.yaml"]["spec"]["nodeSelector"] == pod(files)["nodeSelector"]
    assert "kubectl create secret generic llm-gateway --from-file=token=api-key.txt" in files["README.md"]
    assert """print(secrets.token_urlsafe(32), end="")' > api-key.txt""" in files["README.md"]
    assert "`--expose-triton` puts them back" in files["README.md"]
    exposed = deploy(tp4, "out-key-exposed", "--api-key-secret", "llm-gateway", "--expose-triton")[1]["service.yaml"]
    assert [p["name"] for p in exposed["spec"]["ports"]] == ["http", "grpc", "metrics", "openai"]


def test_without_gateway_the_service_has_triton_ports_only(tp4):
    _, files = deploy(tp4, "out-nogw", "--no-gateway")
    assert list(containers(files)) == ["triton"]
    assert [p["name"] for p in files["service.yaml"]["spec"]["ports"]] == ["http", "grpc", "metrics"]


def test_image_variant_bakes_the_data_into_an_image_built_from_the_serving_image(tp4):
    tmp, repo = tp4
    out, files = deploy(
        tp4,
        "out-image",
        "--image",
        "registry.example.com/llm/llama70b:1",
        "--serving-image",
        "registry.example.com/llm/specpipe-triton:0.1.0-26.04",
    )
    assert {c["image"] for c in pod(files)["containers"]} == {"registry.example.com/llm/llama70b:1"}
    assert [v["name"] for v in pod(files)["volumes"]] == ["dshm"]
    assert "volumeMounts" not in containers(files)["openai"]
    assert files["Dockerfile"].splitlines()[3:] == [
        "ARG SERVING_IMAGE=registry.example.com/llm/specpipe-triton:0.1.0-26.04",
        "FROM ${SERVING_IMAGE}",
        "COPY --from=repository . /models",
        f"COPY --from=engines-0 . /engines/{ENGINE}/target",
        f"COPY --from=engines-1 . /engines/{ENGINE}/tokenizer",
    ]
    script = files["build-image.sh"].splitlines()
    build = shlex.split(next(line for line in script if line.startswith("docker build")).replace('"$here', '"HERE'))
    contexts = [build[i + 1] for i, a in enumerate(build) if a == "--build-context"]
    assert contexts == [
        f"repository={repo}",
        f"engines-0={tmp / 'engines' / ENGINE / 'target'}",
        f"engines-1={tmp / 'engines' / ENGINE / 'tokenizer'}",
    ]
    assert build[build.index("-t") + 1] == "registry.example.com/llm/llama70b:1" and build[-1] == "HERE"
    assert script[-1] == "docker push registry.example.com/llm/llama70b:1"
    assert not any("docker image inspect" in line for line in script)  # a pushed serving image is pulled, not built
    local = deploy(tp4, "out-image-local", "--image", "registry.example.com/llm/llama70b:1")[1]["build-image.sh"]
    assert "docker image inspect specpipe-triton:0.1.0-26.04 >/dev/null 2>&1 || docker build -f " in local


def test_host_path_variant_mounts_the_build_hosts_folders(tp4):
    tmp, repo = tp4
    _, files = deploy(tp4, "out-host", "--host-path")
    volumes = {v["name"]: v for v in pod(files)["volumes"]}
    assert volumes["model-repository"]["hostPath"] == {"path": str(repo), "type": "Directory"}
    assert volumes["engines"]["hostPath"] == {"path": str(tmp / "engines"), "type": "Directory"}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in containers(files)["triton"]["volumeMounts"]}
    assert mounts == {"/models": True, "/engines": True, "/dev/shm": False}


def test_llmapi_repository_copies_its_checkpoints_and_has_no_gateway(tmp_path):
    repo = package_plan(
        plan_json(tmp_path, runtime="trtllm-llmapi", target="llama3.1-8b", draft="eagle"), "api", tmp_path / "repos"
    )
    paths = pod_data(repo, tmp_path / "engines").paths
    assert len(paths) == 2 and all(p.startswith(".trtllm-work/download-") for p in paths)
    out = write_k8s(repo, tmp_path / "out", storage_size="40Gi")
    deployment = yaml.safe_load((out / "deployment.yaml").read_text())
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["triton"]
    with pytest.raises(SpecpipeError, match="LLM API repository api does not have: deploy it without --gateway"):
        write_k8s(repo, tmp_path / "out2", storage_size="40Gi", gateway=True)
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(replicas=0), "--replicas must be >= 1, got 0"),
        (dict(image="r.io/x:1", host_path=True), "--image and --host-path choose different storage"),
        (dict(host_path=True, storage_size="10Gi"), "--host-path and --storage-size choose different storage"),
        (dict(pvc="mine", storage_class="fast"), "--pvc mine names an existing one: drop them"),
        (dict(storage_size="ten"), "--storage-size 'ten' is not a storage quantity"),
        (dict(pvc="My_Claim"), "--pvc 'My_Claim' is not a Kubernetes object name"),
        (dict(api_key_secret="k", gateway=False), "--api-key-secret is the gateway's key, and --no-gateway"),
        (dict(node_selector=("gpu",)), "--node-selector 'gpu' is not a node label KEY=VALUE"),
        (dict(node_selector=("a=1", "a=2")), "--node-selector names a twice"),
        (dict(image="has space:1"), "--image 'has space:1' is not an image reference"),
        (
            dict(container="nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3"),
            "ships TensorRT-LLM 1.1.0, engine llama3-70b-none was built with 1.2.1",
        ),
    ],
)
def test_bad_options_are_refused_and_nothing_is_written(tp4, tmp_path, options, message):
    _, repo = tp4
    with pytest.raises(SpecpipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_k8s(repo, tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_bad_input(tmp_path, tp4):
    _, repo = tp4
    with pytest.raises(SpecpipeError, match="no TensorRT-LLM repository at"):
        write_k8s(tmp_path / "nope", tmp_path / "out")
    unbuilt = package_plan(plan_json(tmp_path, target="llama3-8b", draft="none"), "unbuilt", tmp_path / "repos")
    with pytest.raises(
        SpecpipeError, match=r"target is not on disk \(the engine is not built yet\).*give --storage-size"
    ):
        write_k8s(unbuilt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert (write_k8s(unbuilt, tmp_path / "out", storage_size="50Gi") / "pvc.yaml").is_file()
    result = CliRunner().invoke(main, ["deploy", "k8s", "x", "--repo-dir", str(tmp_path), "--replicas", "0"])
    assert result.exit_code == 2 and "must be a positive integer, got 0" in result.output
