"""Kubernetes manifests: strict validation against the Kubernetes object schemas (offline), GPUs =
TP x PP, health probes, Prometheus annotations, replicas, and bad input."""

import pytest
import yaml
from click.testing import CliRunner

from specpipe.cli import main
from specpipe.deploy.k8s import resource_name, write_k8s
from specpipe.errors import SpecpipeError
from specpipe.serve.trtllm import server_command
from specpipe.triton.repo_meta import read_meta
from specpipe.triton.repository import package_plan
from trtllm_deployments import plan_json

K8S_VERSION = "1.33.0"


@pytest.fixture(scope="module")
def tp4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k8s")
    repo = package_plan(plan_json(tmp, target="llama3-70b", draft="none", tp=4), "llama3.1_70b", tmp / "repos")
    result = CliRunner().invoke(main, ["deploy", "k8s", "llama3.1_70b", "--repo-dir", str(tmp / "repos"), "--replicas", "3",
                                       "--out-dir", str(tmp / "out")])
    assert result.exit_code == 0, result.output
    docs = {name: yaml.safe_load((tmp / "out" / name).read_text()) for name in ("deployment.yaml", "service.yaml")}
    return repo, docs


def test_manifests_validate_strictly_against_the_schemas(tp4):
    import kubernetes_validate

    _, docs = tp4
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(docs["deployment.yaml"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGets"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGets"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_deployment_gpus_probes_metrics_and_replicas(tp4):
    repo, docs = tp4
    deployment = docs["deployment.yaml"]
    assert deployment["metadata"]["name"] == "specpipe-llama3-1-70b" == resource_name("llama3.1_70b")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "8002",
                                              "prometheus.io/path": "/metrics"}
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 4}}
    assert container["command"] == server_command(read_meta(repo)) and container["command"][0] == "mpirun"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 1800
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/models": True, "/engines": True, "/dev/shm": False}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model-repository"]["hostPath"]["path"] == str(repo)
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert pod["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"]


def test_service_selects_the_pods(tp4):
    _, docs = tp4
    service = docs["service.yaml"]
    assert service["spec"]["selector"] == docs["deployment.yaml"]["spec"]["selector"]["matchLabels"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "http": (8000, "http"), "grpc": (8001, "grpc"), "metrics": (8002, "metrics")}


def test_bad_input(tmp_path, tp4):
    repo, _ = tp4
    with pytest.raises(SpecpipeError, match="no TensorRT-LLM repository at"):
        write_k8s(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(SpecpipeError, match="--replicas must be >= 1, got 0"):
        write_k8s(repo, tmp_path / "out", replicas=0)
    with pytest.raises(SpecpipeError, match="ships TensorRT-LLM 1.1.0, engine llama3-70b-none was built with 1.2.1"):
        write_k8s(repo, tmp_path / "out", container="nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3")
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(main, ["deploy", "k8s", "x", "--repo-dir", str(tmp_path), "--replicas", "0"])
    assert result.exit_code == 2 and "must be a positive integer, got 0" in result.output
