"""``specpipe serve NAME --runtime vllm``: the docker command of the pinned vllm-openai image, its
readiness check on /health, and docker/compose.vllm.yaml running the same recorded command."""

import http.server
import json
import shlex
import subprocess
import sys
import threading

import pytest
import yaml
from click.testing import CliRunner
from compose_env import interpolate
from fake_programs import write_program
from repo_root import ROOT

from specpipe.cli import main
from specpipe.errors import SpecpipeError
from specpipe.serve.vllm import vllm_launch, wait_healthy
from specpipe.vllm import release
from specpipe.vllm.flagcheck import parse_serve_argv

DOCKER = ROOT / "docker"


@pytest.fixture
def engines(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = tmp_path / "engines"
    for args in (["--target", "llama3-8b", "--draft", "eagle"], ["--target", "llama3-70b", "--tp", "2", "--pp", "2"]):
        result = CliRunner().invoke(
            main, ["build", "--runtime", "vllm", "--engines-dir", str(root), "--gpu", "h100-80gb", *args]
        )
        assert result.exit_code == 0, result.output
    return root


def serve(engines, *args):
    return CliRunner().invoke(
        main, ["serve", *args, "--engines-dir", str(engines), "--repo-dir", str(engines.parent / "repo")]
    )


def test_print_shows_the_docker_command_of_the_pinned_image(engines, tmp_path):
    result = serve(engines, "llama3-8b-eagle", "--runtime", "vllm", "--print", "--http-port", "8100")
    assert result.exit_code == 0, result.output
    run, ready = result.stdout.strip().splitlines()
    argv = shlex.split(run)
    image = argv.index(release.IMAGE)
    assert argv[:image] == [
        "docker",
        "run",
        "--rm",
        "--name",
        "specpipe-llama3-8b-eagle",
        "--gpus",
        '"device=0"',
        "--ipc=host",
        "-p",
        "8100:8000",
        "-v",
        f"{tmp_path / 'hf'}:{release.CONTAINER_HF_HOME}",
        "-e",
        "HF_TOKEN",
        "--entrypoint",
        "vllm",
    ]
    served = ["vllm", *argv[image + 1 :]]
    parsed = parse_serve_argv(served)
    assert (parsed["--host"], parsed["--port"]) == ("0.0.0.0", 8000)
    assert parsed["--speculative-config"]["method"] == "eagle"
    recorded = json.loads((engines / "llama3-8b-eagle" / "manifest.json").read_text())["vllm"]["command"]
    assert served == recorded + ["--host", "0.0.0.0", "--port", "8000"]
    assert "curl -fsS http://localhost:8100/health" in ready


def test_auto_finds_the_vllm_engine_and_the_gpus_are_tp_times_pp(engines):
    result = serve(engines, "llama3-70b-none", "--print", "--gpus", "4,5,6,7")
    assert result.exit_code == 0, result.output
    assert '"device=4,5,6,7"' in shlex.split(result.stdout.splitlines()[0])
    wrong = serve(engines, "llama3-70b-none", "--print", "--gpus", "0,1")
    assert wrong.exit_code == 1 and "TP x PP = 4 GPUs" in wrong.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--container", "vllm/vllm-openai:v0.10.0"], "is not vLLM 0.34.0"),
        (["--openai-port", "9000"], "serves the OpenAI API itself"),
    ],
)
def test_launches_that_cannot_work_are_refused(engines, args, message):
    result = serve(engines, "llama3-8b-eagle", "--runtime", "vllm", "--print", *args)
    assert result.exit_code != 0 and message in result.stderr


def test_a_non_vllm_engine_is_refused(engines):
    manifest = engines / "llama3-8b-eagle" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["runtime"] = "trtllm-llmapi"
    manifest.write_text(json.dumps(data))
    result = serve(engines, "llama3-8b-eagle", "--runtime", "vllm", "--print")
    assert result.exit_code == 1 and "not a vLLM one" in result.stderr


def test_local_checkpoints_are_mounted_read_only(engines, tmp_path):
    manifest = engines / "llama3-8b-eagle" / "manifest.json"
    data = json.loads(manifest.read_text())
    command = data["vllm"]["command"]
    command[2] = str(tmp_path / "ckpt")
    manifest.write_text(json.dumps(data))
    argv = vllm_launch(engines / "llama3-8b-eagle").run_argv
    assert argv[argv.index(f"{tmp_path / 'ckpt'}:{tmp_path / 'ckpt'}:ro") - 1] == "-v"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_readiness_waits_for_health_and_fails_when_the_container_exits():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_healthy(f"http://127.0.0.1:{server.server_port}/health", alive, timeout_s=10, poll_s=0.1) < 5
    finally:
        alive.kill()
        alive.wait()
        server.shutdown()
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(SpecpipeError, match="exited with status 3"):
        wait_healthy("http://127.0.0.1:9/health", dead, timeout_s=5, poll_s=0.1)


def test_the_compose_file_validates_and_runs_the_recorded_command(engines, tmp_path):
    from compose_spec import PyCompose

    text = (DOCKER / "compose.vllm.yaml").read_text()
    with pytest.raises(KeyError, match="SPECPIPE_ENGINE"):
        interpolate(text, {})
    engine = engines / "llama3-8b-eagle"
    resolved = interpolate(text, {"SPECPIPE_ENGINE": str(engine), "SPECPIPE_HF_CACHE": "/hf", "SPECPIPE_GPUS": "2"})
    PyCompose.from_yaml(resolved)
    with pytest.raises(ValueError):
        PyCompose.from_yaml(resolved.replace("ipc: host", "ipcs: host"))
    service = yaml.safe_load(resolved)["services"]["vllm"]
    assert service["image"] == release.IMAGE
    assert service["ipc"] == "host" and service["environment"] == ["HF_TOKEN"]
    assert service["ports"] == ["8000:8000"]
    assert {(v["target"], v.get("read_only", False)) for v in service["volumes"]} == {
        ("/engine", True),
        (release.CONTAINER_HF_HOME, False),
    }
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "http://localhost:8000/health" in service["healthcheck"]["test"][-1]
    # the entry point, run here with a stand-in vllm that prints its argv, execs the command serve --print shows
    bin_dir = tmp_path / "bin"
    write_program(bin_dir, "vllm", f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    program, flag, code = service["entrypoint"]
    ran = subprocess.run(
        [sys.executable, flag, code.replace("/engine/", f"{engine}/")],
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=True,
    )
    shown = shlex.split(serve(engines, "llama3-8b-eagle", "--print").stdout.splitlines()[0])
    assert ["vllm", *json.loads(ran.stdout)] == ["vllm", *shown[shown.index(release.IMAGE) + 1 :]]
    assert program == "python3"
