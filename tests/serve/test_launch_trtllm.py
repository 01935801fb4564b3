"""Container launch: the exact command for TP 1 and TP 4, version pairing, GPUs, the image's entry
point, the Dockerfile and the compose file (validated against the Compose specification)."""

import json
import re
import shlex

import pytest
import yaml
from click.testing import CliRunner
from compose_env import interpolate
from google.protobuf import text_format
from repo_root import ROOT
from tritonclient.grpc import model_config_pb2 as mc
from trtllm_deployments import plan_json

from specpipe.cli import main
from specpipe.deploy.k8s import write_k8s
from specpipe.errors import SpecpipeError
from specpipe.serve.container_entry import command as entry_command
from specpipe.serve.trtllm import container_launch, parse_gpus, server_command, server_environment
from specpipe.triton.repo_meta import read_meta
from specpipe.triton.repository import package_plan
from specpipe.trtllm import release

DOCKER = ROOT / "docker"


def packaged(tmp_path, name, runtime="trtllm", **kw):
    return package_plan(plan_json(tmp_path, f"{name}.json", runtime=runtime, **kw), name, tmp_path / "repos")


def printed(tmp_path, name, *extra):
    result = CliRunner().invoke(main, ["serve", name, "--repo-dir", str(tmp_path / "repos"), "--print", *extra])
    return result


def test_tp1_is_one_tritonserver(tmp_path):
    repo = packaged(tmp_path, "tp1", target="llama3-8b", draft="eagle")
    result = printed(tmp_path, "tp1")
    assert result.exit_code == 0, result.output
    build, run = [shlex.split(line) for line in result.output.strip().splitlines()]
    assert build[:2] == ["docker", "build"] and f"BASE_IMAGE={release.CONTAINER_IMAGE}" in build
    image = run[run.index("specpipe-triton:0.1.0-26.04")]
    inner = run[run.index(image) + 1 :]
    assert inner == [
        "tritonserver",
        "--model-repository=/models",
        "--grpc-port=8001",
        "--http-port=8000",
        "--metrics-port=8002",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
    ]
    assert run[run.index("--gpus") + 1] == '"device=0"'
    assert f"{repo}:/models:ro" in run and f"{tmp_path / 'engines'}:/engines:ro" in run
    assert ["-p", "8000:8000"] == run[run.index("8000:8000") - 1 : run.index("8000:8000") + 1]


def test_tp4_is_mpirun_with_one_rank_per_gpu(tmp_path):
    packaged(tmp_path, "tp4", target="llama3-70b", draft="none", tp=4)
    result = printed(tmp_path, "tp4", "--gpus", "4,5,6,7")
    assert result.exit_code == 0, result.output
    run = shlex.split(result.output.strip().splitlines()[1])
    inner = run[run.index("specpipe-triton:0.1.0-26.04") + 1 :]
    assert inner[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(inner[2:]).split(" : ")
    assert len(ranks) == 4 == read_meta(tmp_path / "repos" / "tp4")["world_size"]
    for i, rank in enumerate(ranks):
        argv = rank.split()
        assert argv[:3] == ["-n", "1", "tritonserver"]
        assert argv[-1] == f"--backend-config=python,shm-region-prefix-name=prefix{i}_"
        assert ("--model-control-mode=explicit" in argv) == (i > 0)
        assert ("--load-model=tensorrt_llm" in argv) == (i > 0)
    assert run[run.index("--gpus") + 1] == '"device=4,5,6,7"'


def _engine_params(repo, model):
    config = mc.ModelConfig()
    text_format.Parse((repo / model / "config.pbtxt").read_text(), config)
    return {k: v.string_value for k, v in config.parameters.items()}


def test_draft_target_tp4_launches_in_orchestrator_mode(tmp_path):
    """Issue 13 item 1, the reproduction: build --target llama3-70b --draft llama3-8b --gpu h100-80gb --tp 4
    -q fp8 --runtime trtllm --dry-run --json; package --from-plan; serve --print (library functions)."""
    repo = packaged(tmp_path, "dt", target="llama3-70b", draft="llama3-8b", gpu="h100-80gb", tp=4, quantization="fp8")
    meta = read_meta(repo)
    assert meta["launch"] == "orchestrator" and meta["world_size"] == 1 and meta["gpus"] == 4
    command = server_command(meta)
    assert command.count("tritonserver") == 1 and ":" not in command
    assert command[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver"]
    assert "--model-control-mode=explicit" not in command
    assert {"--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"} <= set(command)
    assert [a for a in command if a.startswith("--cuda-memory-pool-byte-size=")] == [
        f"--cuda-memory-pool-byte-size={g}:0" for g in range(4)
    ]
    assert server_environment(meta) == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        assert _engine_params(repo, model)["gpu_device_ids"] == "0,1,2,3"
    # serve --print: docker run carries the environment
    run = container_launch(repo, meta, gpus="4,5,6,7").run_argv
    assert ["-e", "TRTLLM_ORCHESTRATOR=1"] == run[
        run.index("TRTLLM_ORCHESTRATOR=1") - 1 : run.index("TRTLLM_ORCHESTRATOR=1") + 1
    ]
    assert "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1" in run and run[run.index("--gpus") + 1] == '"device=4,5,6,7"'
    assert run[run.index("specpipe-triton:0.1.0-26.04") + 1 :] == command
    # compose (the image's entry point) and Kubernetes get the same command and environment
    assert entry_command(repo) == command
    k8s = write_k8s(repo, tmp_path / "k8s", storage_size="100Gi")
    pod = yaml.safe_load((k8s / "deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]
    assert pod["command"] == command and pod["env"] == [
        {"name": "TRTLLM_ORCHESTRATOR", "value": "1"},
        {"name": "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES", "value": "1"},
    ]


def test_single_engine_and_tp1_stay_without_orchestrator(tmp_path):
    for name, kw in (
        ("dt1", dict(target="llama3.1-8b", draft="llama3.2-1b", gpu="h100-80gb")),
        ("tp4", dict(target="llama3-70b", draft="none", tp=4)),
    ):
        repo = packaged(tmp_path, name, **kw)
        meta = read_meta(repo)
        assert server_environment(meta) == {} and meta["launch"] == ("single" if name == "dt1" else "leader")
        assert "gpu_device_ids" not in _engine_params(repo, "tensorrt_llm")


def test_old_leader_mode_draft_target_repository_is_refused(tmp_path):
    repo = packaged(tmp_path, "dt", target="llama3.1-8b", draft="llama3.2-1b", tp=2, gpu="h100-80gb")
    meta = read_meta(repo)
    old = {k: v for k, v in meta.items() if k != "launch"} | {"world_size": 2}
    message = (
        "repository for llama3.1-8b-llama3.2-1b runs two engines on 2 GPUs in leader mode, where every rank above 0 "
        "exits; draft-target with TP x PP > 1 needs orchestrator mode (TRTLLM_ORCHESTRATOR=1, gpu_device_ids per "
        "engine): repackage it with 'specpipe package'"
    )
    with pytest.raises(SpecpipeError) as err:
        server_command(old)
    assert str(err.value) == message
    (repo / "specpipe.json").write_text(json.dumps(old))
    result = printed(tmp_path, "dt")
    assert result.exit_code == 1 and result.stderr.strip() == "error: " + message and result.stdout == ""


def test_llmapi_is_one_server_with_auto_complete(tmp_path):
    packaged(tmp_path, "api", runtime="trtllm-llmapi", target="llama3.1-8b", draft="eagle", tp=2)
    meta = read_meta(tmp_path / "repos" / "api")
    assert server_command(meta) == [
        "tritonserver",
        "--model-repository=/models",
        "--grpc-port=8001",
        "--http-port=8000",
        "--metrics-port=8002",
    ]
    assert meta["gpus"] == 2 and meta["world_size"] == 1
    run = shlex.split(printed(tmp_path, "api").output.strip().splitlines()[1])
    assert run[run.index("--gpus") + 1] == '"device=0,1"'


def test_container_release_must_match_the_engine(tmp_path):
    packaged(tmp_path, "e", target="llama3-8b", draft="lookahead")
    result = printed(tmp_path, "e", "--container", "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: container nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3 ships TensorRT-LLM "
        "1.2.0, engine llama3-8b-lookahead was built with 1.2.1: use "
        "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    )
    for tag, why in (
        ("nvcr.io/nvidia/tritonserver:27.01-trtllm-python-py3", "whose TensorRT-LLM release specpipe does not know"),
        ("myregistry/triton:latest", "is not a Triton TensorRT-LLM image"),
    ):
        result = printed(tmp_path, "e", "--container", tag)
        assert result.exit_code == 1 and why in result.stderr
    assert printed(tmp_path, "e", "--container", "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3").exit_code == 0


def test_gpus_must_be_tp_times_pp(tmp_path):
    packaged(tmp_path, "tp4", target="llama3-70b", draft="none", tp=4)
    result = printed(tmp_path, "tp4", "--gpus", "0,1")
    assert result.exit_code == 1
    assert "the engine runs on TP x PP = 4 GPUs but --gpus names 2 (0,1): give exactly 4 ids" in result.stderr
    with pytest.raises(SpecpipeError, match="distinct non-negative GPU ids"):
        parse_gpus("0,0", 2)
    assert parse_gpus(None, 3) == [0, 1, 2]


def test_serving_a_plan_before_the_build_is_refused(tmp_path):
    packaged(tmp_path, "e", target="llama3-8b", draft="eagle")
    result = CliRunner().invoke(main, ["serve", "e", "--repo-dir", str(tmp_path / "repos")])
    assert result.exit_code == 1 and "engine llama3-8b-eagle is not built" in result.stderr


def test_container_entry_runs_the_same_command(tmp_path):
    repo = packaged(tmp_path, "tp4", target="llama3-70b", draft="none", tp=4)
    assert entry_command(repo) == server_command(read_meta(repo))
    with pytest.raises(SpecpipeError, match="no specpipe TensorRT-LLM repository at"):
        entry_command(tmp_path)


def test_release_table_and_pin():
    assert release.container_trtllm_release(release.CONTAINER_IMAGE) == release.TRTLLM_VERSION
    assert [t for t, r in sorted(release.CONTAINER_RELEASES.items()) if r == "1.2.1"] == [
        "26.04",
        "26.05",
        "26.06",
        "26.07",
    ]
    assert release.container_trtllm_release("nvcr.io/nvidia/tritonserver:25.03-trtllm-python-py3") == "0.18.0"


def test_dockerfile_is_pinned_and_starts_the_entry_point():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1) == release.CONTAINER_IMAGE
    assert 'CMD ["python3", "-m", "specpipe.serve.container_entry"]' in text
    assert "pip install --no-cache-dir --no-deps ." in text and "/v2/health/ready" in text


def test_compose_file_validates_against_the_compose_specification(tmp_path):
    from compose_spec import PyCompose

    text = (DOCKER / "compose.yaml").read_text()
    with pytest.raises(KeyError, match="SPECPIPE_REPO"):
        interpolate(text, {})
    env = {
        "SPECPIPE_REPO": str(tmp_path / "repo"),
        "SPECPIPE_ENGINES": str(tmp_path / "engines"),
        "SPECPIPE_GPUS": "4",
        "SPECPIPE_NAME": "llama3-8b-eagle",
    }
    with pytest.raises(KeyError, match="SPECPIPE_NAME"):
        interpolate(text, {k: v for k, v in env.items() if k != "SPECPIPE_NAME"})
    resolved = interpolate(text, env)
    PyCompose.from_yaml(resolved)  # raises on anything outside the specification
    with pytest.raises(ValueError):
        PyCompose.from_yaml(resolved.replace("shm_size:", "shm_sizes:"))
    service = yaml.safe_load(resolved)["services"]["triton"]
    assert service["build"]["args"]["BASE_IMAGE"] == release.CONTAINER_IMAGE
    # Triton's unauthenticated ports on loopback only, unless the host address is given
    assert service["ports"] == ["127.0.0.1:8000:8000", "127.0.0.1:8001:8001", "127.0.0.1:8002:8002"]
    wide = yaml.safe_load(interpolate(text, {**env, "SPECPIPE_TRITON_HOST": "0.0.0.0", "SPECPIPE_HTTP_PORT": "18000"}))
    assert wide["services"]["triton"]["ports"][0] == "0.0.0.0:18000:8000"
    grafana = dict(item.split("=", 1) for item in yaml.safe_load(resolved)["services"]["grafana"]["environment"])
    assert grafana == {
        "GF_AUTH_ANONYMOUS_ENABLED": "true",
        "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
        "GF_AUTH_DISABLE_LOGIN_FORM": "true",
        "GF_AUTH_BASIC_ENABLED": "false",
    }  # no admin login to guess
    assert {(v["target"], v["read_only"]) for v in service["volumes"]} == {("/models", True), ("/engines", True)}
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device == {"driver": "nvidia", "count": 4, "capabilities": ["gpu"]}
    assert "http://localhost:8000/v2/health/ready" in service["healthcheck"]["test"][-1]
    assert service["shm_size"] == "16gb"


def test_compose_runs_the_gateway_beside_triton(tmp_path):
    from specpipe.cli.gateway import gateway
    from specpipe.openai import CONTAINER_HOST, CONTAINER_PORT
    from specpipe.openai.auth import API_KEY_ENV

    text = (DOCKER / "compose.yaml").read_text()
    services = yaml.safe_load(
        interpolate(text, {"SPECPIPE_REPO": "/r", "SPECPIPE_ENGINES": "/e", "SPECPIPE_NAME": "tiny"})
    )["services"]
    service = services["openai"]
    assert service["image"] == services["triton"]["image"]
    assert service["depends_on"] == {"triton": {"condition": "service_healthy"}}
    assert service["ports"] == [f"{CONTAINER_PORT}:{CONTAINER_PORT}"]
    assert service["environment"] == [API_KEY_ENV]  # passed through from the shell, never a value in the file
    assert service["volumes"] == [{"type": "bind", "source": "/e", "target": "/engines", "read_only": True}]
    assert service["command"][:4] == ["python3", "-m", "specpipe.cli", "gateway"]
    params = gateway.make_context("gateway", service["command"][4:]).params
    assert (params["triton_url"], params["name"], params["host"], params["port"]) == (
        "triton:8001",
        "tiny",
        CONTAINER_HOST,
        CONTAINER_PORT,
    )
    assert f"http://localhost:{CONTAINER_PORT}/health" in service["healthcheck"]["test"][-1]


def test_dockerfile_installs_what_the_gateway_imports():
    text = (DOCKER / "Dockerfile").read_text()
    assert "-c /tmp/installed.txt" in text and '"tritonclient[grpc]>=2.50"' in text
    assert 'python3 -c "import aiohttp, tritonclient.grpc.aio, specpipe.cli, specpipe.serve.gateway"' in text
