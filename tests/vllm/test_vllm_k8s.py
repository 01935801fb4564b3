"""``specpipe deploy k8s NAME`` for a vLLM engine: manifests valid for Kubernetes that run the recorded
``vllm serve`` command on TP x PP GPUs, probed on /health."""

import pytest
import yaml
from click.testing import CliRunner

from specpipe.cli import main
from specpipe.vllm import release
from specpipe.vllm.flagcheck import parse_serve_argv

K8S_VERSION = "1.33.0"


@pytest.fixture
def engines(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "engines"
    result = CliRunner().invoke(
        main,
        [
            "build",
            "--runtime",
            "vllm",
            "--engines-dir",
            str(root),
            "--gpu",
            "h100-80gb",
            "--target",
            "llama3-70b",
            "--draft",
            "eagle",
            "--tp",
            "2",
            "--pp",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    return root


def deploy(engines, *args):
    out = engines.parent / "k8s"
    result = CliRunner().invoke(
        main,
        [
            "deploy",
            "k8s",
            "llama3-70b-eagle",
            "--engines-dir",
            str(engines),
            "--repo-dir",
            str(engines.parent / "repo"),
            "--out-dir",
            str(out),
            *args,
        ],
    )
    return result, out


def test_the_manifests_validate_and_run_the_recorded_command(engines):
    import kubernetes_validate

    result, out = deploy(engines, "--replicas", "2", "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "deployment.yaml", "service.yaml"]
    deployment = yaml.safe_load((out / "deployment.yaml").read_text())
    service = yaml.safe_load((out / "service.yaml").read_text())
    for doc in (deployment, service):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == release.IMAGE and deployment["spec"]["replicas"] == 2
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    parsed = parse_serve_argv(container["command"] + container["args"])
    assert (parsed["--tensor-parallel-size"], parsed["--pipeline-parallel-size"]) == (2, 2)
    assert parsed["--speculative-config"]["method"] == "eagle" and parsed["--port"] == 8000
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {v["name"]: v["emptyDir"] for v in pod["volumes"]}["shm"]["medium"] == "Memory"
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert [p["port"] for p in service["spec"]["ports"]] == [8000]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pvc", "data"], "--pvc is for Triton repositories"),
        (["--gateway"], "--gateway is for Triton repositories"),
        (["--container", "vllm/vllm-openai:v0.9.0"], "is not vLLM 0.34.0"),
        (["--node-selector", "no-equals"], "is not a node label"),
    ],
)
def test_options_that_do_not_apply_are_refused_and_nothing_is_written(engines, args, message):
    result, out = deploy(engines, *args)
    assert result.exit_code == 1 and message in result.stderr
    assert not out.exists()
