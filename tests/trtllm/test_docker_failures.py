"""Docker's own failures, one line each with the fix, for ``specpipe doctor --container`` and the build's
container steps; image references checked before they reach ``docker run``.

The fake docker prints the messages docker, the registries and the NVIDIA Container Toolkit print (as
reported in public issues: moby/moby#36915, NVIDIA/nvidia-docker#1352, NVIDIA/nvidia-container-toolkit#154,
triton-inference-server/server#5747) and exits with the status docker/cli's ``runStartContainerErr`` gives them.
"""

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_programs import write_program

from specpipe.cli import main
from specpipe.trtllm import docker_errors, doctor, image_reference, release
from specpipe.trtllm.executor import Executor, StepFailedError, run_step
from specpipe.trtllm.plan import WORK_DIRNAME, Step

IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
RUN_HELP = "See 'docker run --help'."
OCI = (
    "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime "
    "create failed: runc create failed: unable to start container process: "
)

#: (case, docker's stderr, its exit status, the kind, words the one line must hold)
FAILURES = [
    (
        "no image",
        f"Unable to find image '{IMAGE}' locally\ndocker: Error response from daemon: manifest for {IMAGE} not "
        f"found: manifest unknown: manifest unknown.\n{RUN_HELP}",
        125,
        "pull",
        [f"docker cannot pull {IMAGE}", "manifest unknown", "docker login nvcr.io"],
    ),
    (
        "pull denied",
        "Unable to find image 'ndtar:latest' locally\ndocker: Error response from daemon: pull access denied for "
        "ndtar, repository does not exist or may require 'docker login': denied: requested access to the resource "
        f"is denied.\n{RUN_HELP}",
        125,
        "pull",
        ["docker cannot pull", "pull access denied for ndtar"],
    ),
    (
        "no network",
        f"Unable to find image '{IMAGE}' locally\ndocker: Error response from daemon: Get \"https://nvcr.io/v2/\": "
        f"dial tcp: lookup nvcr.io: no such host.\n{RUN_HELP}",
        125,
        "pull",
        ["cannot reach the registry", "lookup nvcr.io: no such host", "docker save"],
    ),
    (
        "no daemon",
        "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?."
        f"\n{RUN_HELP}",
        125,
        "daemon",
        ["docker cannot reach its daemon", "sudo systemctl start docker"],
    ),
    (
        "no daemon socket (newer docker)",
        "docker: failed to connect to the docker API at unix:///var/run/docker.sock; check if "
        "the path is correct and if the daemon is running: dial unix /var/run/docker.sock: "
        f"connect: no such file or directory\n{RUN_HELP}",
        127,
        "daemon",
        ["docker cannot reach its daemon"],
    ),
    (
        "socket permission",
        "docker: permission denied while trying to connect to the Docker daemon socket at "
        'unix:///var/run/docker.sock: Head "http://%2Fvar%2Frun%2Fdocker.sock/_ping": dial unix '
        f"/var/run/docker.sock: connect: permission denied.\n{RUN_HELP}",
        126,
        "socket-permission",
        ["may not use its daemon's socket", "usermod -aG docker"],
    ),
    (
        "no GPU runtime",
        'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
        f"\n{RUN_HELP}",
        125,
        "gpu-runtime",
        ["docker has no GPU runtime", "NVIDIA Container Toolkit", "nvidia-ctk runtime configure --runtime=docker"],
    ),
    (
        "no driver",
        OCI + "error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: "
        "Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization error: load library failed: "
        "libnvidia-ml.so.1: cannot open shared object file: no such file or directory: unknown.",
        127,
        "driver",
        ["finds no usable NVIDIA driver", "libnvidia-ml.so.1"],
    ),
    (
        "old driver",
        OCI + "error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: "
        "Auto-detected mode as 'legacy'\nnvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0,"
        " please update your driver to a newer version, or use an earlier cuda container: unknown.",
        125,
        "driver",
        ["driver of this machine is too old", "cuda>=13.0"],
    ),
    (
        "no python3",
        OCI + 'exec: "python3": executable file not found in $PATH: unknown.',
        127,
        "command",
        ["has no 'python3'", release.CONTAINER_IMAGE],
    ),
    (
        "docker, unknown",
        "docker: Error response from daemon: conflict: something docker has not said before.\n" + RUN_HELP,
        125,
        "docker",
        ["docker could not run a container of", "exit status 125", "conflict: something docker has not said"],
    ),
]


@pytest.mark.parametrize("case,stderr,status,kind,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_each_docker_failure_is_one_line_with_its_cause_and_fix(case, stderr, status, kind, words):
    failure = docker_errors.diagnose(stderr, status, image=IMAGE, program="python3")
    assert failure is not None and failure.kind == kind
    assert "\n" not in failure.message and "See 'docker" not in failure.message
    for word in words:
        assert word in failure.message, (word, failure.message)


@pytest.mark.parametrize(
    "output,status",
    [
        ("[FAILED] tensorrt_llm 1.2.1: the container has 1.1.0\n", 1),  # the check ran and failed
        ("Unable to find image 'x:1' locally\n1: Pulling from x\nTraceback ...\nValueError: unauthorized token\n", 1),
        ("all checks passed\n", 0),
    ],
)
def test_a_failure_of_the_command_itself_is_not_docker_s(output, status):
    assert docker_errors.diagnose(output, status, image=IMAGE, program="python3") is None


FAKE_DOCKER = """#!{python}
import os, sys
sys.stderr.write(os.environ["FAKE_DOCKER_STDERR"] + "\\n")
sys.exit(int(os.environ["FAKE_DOCKER_STATUS"]))
"""


@pytest.fixture
def failing_docker(tmp_path, monkeypatch):
    """A docker on PATH that prints ``stderr`` and exits ``status`` (set by the returned function)."""
    bin_dir = tmp_path / "bin"
    write_program(bin_dir, "docker", FAKE_DOCKER.format(python=sys.executable))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def fail(stderr: str, status: int) -> None:
        monkeypatch.setenv("FAKE_DOCKER_STDERR", stderr)
        monkeypatch.setenv("FAKE_DOCKER_STATUS", str(status))

    return fail


@pytest.mark.parametrize("case,stderr,status,kind,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_doctor_ends_a_docker_failure_with_one_error_line_and_status_1(
    failing_docker, case, stderr, status, kind, words
):
    failing_docker(stderr, status)
    result = CliRunner().invoke(main, ["doctor", "--container", IMAGE])
    assert result.exit_code == 1, result.output
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: ") and all(word in last for word in words), last
    assert "Traceback" not in result.output


def test_docker_s_own_lines_are_shown_as_they_come_before_the_diagnosis(failing_docker):
    failing_docker(FAILURES[0][1], 125)
    result = CliRunner().invoke(main, ["doctor", "--container", IMAGE])
    lines = result.stderr.splitlines()
    assert lines[0] == f"Unable to find image '{IMAGE}' locally" and lines[-1].startswith("error: docker cannot pull")


def test_doctor_without_docker_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = CliRunner().invoke(main, ["doctor", "--container", IMAGE])
    assert result.exit_code == 1
    assert result.stderr == (
        "error: docker not found: install docker and the NVIDIA Container Toolkit, or run inside the "
        "container with --local\n"
    )


def test_a_failed_check_in_a_container_is_status_1_without_a_docker_diagnosis(failing_docker):
    failing_docker("", 2)  # first_contact.py's status for an unreadable document
    result = CliRunner().invoke(main, ["doctor", "--container", IMAGE])
    assert result.exit_code == 1 and "error:" not in result.stderr


@pytest.mark.parametrize(
    "value,words",
    [
        ("--privileged", "starts with '-' and would be read as a docker flag"),
        ("", "the container image is empty"),
        ("   ", "the container image is empty"),
        ("nvcr.io/NVIDIA/tritonserver:26.04", "(the name must be lower case)"),
        ("nvcr.io/nvidia/tritonserver:26.04 --privileged", "is not a container image reference"),
        ("nvcr.io/nvidia/tritonserver:", "is not a container image reference"),
        ("tritonserver@sha256:abc", "is not a container image reference"),
        ("a/" * 130 + "b", "longer than 255 characters"),
    ],
)
def test_a_container_that_is_not_an_image_reference_never_reaches_docker(failing_docker, tmp_path, value, words):
    failing_docker("docker was run", 0)
    result = CliRunner().invoke(main, ["doctor", "--container", value])
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.output
    assert result.stderr.startswith("error: ") and words in result.stderr
    assert "docker was run" not in result.output
    assert f"e.g. {release.CONTAINER_IMAGE}" in result.stderr


@pytest.mark.parametrize(
    "image",
    [
        IMAGE,
        release.CONTAINER_IMAGE,
        "ubuntu",
        "library/ubuntu:24.04",
        "localhost:5000/team/trt_llm-image:v1.2-rc.1",
        "[::1]:5000/img:tag",
        "registry.example.com/a/b/c@sha256:" + "a" * 64,
        "img:tag@sha256:" + "0" * 64,
        "my-registry.io/nvidia__x/a-b--c.d",
        "e28007e9030b",
    ],
)
def test_image_references_of_docker_s_grammar_pass(image):
    assert image_reference.check(image) == image


FIRST_STEP_ARGV = [
    "python3",
    "/w/first-contact/first_contact.py",
    "--input",
    "/w/first-contact/x.json",
    "--report",
    "r",
]


@pytest.mark.parametrize("index", [0, 6, 9], ids=[FAILURES[i][0] for i in (0, 6, 9)])
def test_a_build_s_first_container_step_gets_the_same_diagnosis(failing_docker, tmp_path, index):
    _, stderr, status, _, words = FAILURES[index]
    failing_docker(stderr, status)
    root = (tmp_path / "engines").absolute()
    output = str(root / WORK_DIRNAME / "first-contact-out")
    step = Step(
        name="first-contact",
        argv=[*FIRST_STEP_ARGV[:-1], output + "/report.txt"],
        output=output,
        inputs=[],
        runs_in="trtllm",
        hash="f" * 16,
    )
    executor = Executor("docker", release.CONTAINER_EXAMPLES_ROOT, root=root, image=IMAGE, log=lambda _: None)
    with pytest.raises(StepFailedError) as caught:
        run_step(step, executor, root / WORK_DIRNAME / "logs")
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"step first-contact failed with exit status {status}: ")
    assert all(word in first for word in words), first
    assert not Path(output + ".partial").exists()


def test_a_host_step_s_failure_is_not_read_as_docker_s(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text(
        'import sys\nprint(\'docker: Error response from daemon: could not select device driver "" with '
        "capabilities: [[gpu]].')\nsys.exit(125)\n"
    )
    output = str(tmp_path / "out")
    step = Step(
        name="prepare-eagle-head",
        argv=[sys.executable, str(tool), output],
        output=output,
        inputs=[],
        runs_in="host",
        hash="e" * 16,
    )
    with pytest.raises(StepFailedError) as caught:
        run_step(step, Executor("docker", "/examples", root=tmp_path, log=lambda _: None), tmp_path / "logs")
    assert "GPU runtime" not in str(caught.value).splitlines()[0]


def test_the_doctor_library_passes_stderr_to_the_classifier(tmp_path):
    seen = {}

    def run(argv):
        seen["argv"] = argv
        return type("Done", (), {"returncode": 125, "stderr": FAILURES[6][1]})()

    with pytest.raises(docker_errors.DockerError, match="docker has no GPU runtime"):
        doctor.doctor(container=IMAGE, run=run, gpus=True)
    assert seen["argv"][:4] == ["docker", "run", "--rm", "--gpus"]
