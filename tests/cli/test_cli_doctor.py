"""``specpipe doctor --container IMAGE | --local [--plan PLAN.json]``: the arguments reaching the library,
and the checks document the library makes from a plan file."""

import json
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
from click.testing import CliRunner
from fake_programs import write_program

from specpipe.cli import main
from specpipe.errors import SpecpipeError
from specpipe.trtllm import doctor


def invoke(*args):
    return CliRunner().invoke(main, ["doctor", *args])


def test_container_reaches_the_library():
    with patch("specpipe.cli.doctor.run_doctor", return_value=0) as run:
        result = invoke("--container", "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3")
    assert result.exit_code == 0, result.output
    run.assert_called_once_with(
        container="nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3", local=False, plan_file=None, runtime="trtllm"
    )


def test_local_with_a_plan_reaches_the_library_and_its_status_is_the_exit_status(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    with patch("specpipe.cli.doctor.run_doctor", return_value=1) as run:
        result = invoke("--local", "--plan", str(plan), "--runtime", "trtllm-llmapi")
    assert result.exit_code == 1
    run.assert_called_once_with(container=None, local=True, plan_file=plan, runtime="trtllm-llmapi")


@pytest.mark.parametrize("args", [[], ["--local", "--container", "img"]])
def test_exactly_one_place_to_check(args):
    with patch("specpipe.cli.doctor.run_doctor") as run:
        result = invoke(*args)
    assert result.exit_code == 2 and "give exactly one of --container IMAGE and --local" in result.output
    assert run.call_count == 0


def test_a_plan_file_becomes_the_checks_document(tmp_path):
    dry = CliRunner().invoke(
        main,
        [
            *"build --target llama3-8b --draft eagle --runtime trtllm --dry-run --json --engines-dir".split(),
            str(tmp_path / "e"),
        ],
    )
    assert dry.exit_code == 0, dry.output
    plan = tmp_path / "plan.json"
    plan.write_text(dry.stdout)
    seen = {}

    def run(argv):
        seen["argv"] = argv
        seen["doc"] = json.loads(Path(argv[argv.index("--input") + 1]).read_text())
        return type("Done", (), {"returncode": 0})()

    assert doctor.doctor(local=True, plan_file=plan, run=run) == 0
    assert seen["argv"][1:3] == ["-m", "specpipe.trtllm.first_contact"]
    doc = seen["doc"]
    assert doc["pin"] == "1.2.1" and doc["backends"] == ["tensorrtllm", "python"]
    assert [a["step"] for a in doc["argvs"]] == ["convert-target", "build-target"]  # prepare-eagle-head is a host step


def test_a_file_that_is_not_a_plan_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"runtime": "cpu"}))
    with pytest.raises(
        SpecpipeError, match="the --plan file is not a TensorRT-LLM plan: write one with 'specpipe build"
    ):
        doctor.doctor(local=True, plan_file=bad, run=lambda argv: None)
    result = invoke("--local", "--plan", str(bad))
    assert result.exit_code == 1 and result.stderr.startswith("error: the --plan file is not a TensorRT-LLM plan")


FAKE_DOCKER = '''#!{python}
"""docker stand-in: records its argv, runs 'run [--rm] [--gpus all] -v SRC:DST:ro ... IMAGE CMD...' here with
the mounts mapped back to their sources, in a container without driver libraries unless --gpus was given."""
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
assert args[0] == "run"
args, mounts, gpus = args[1:], {{}}, False
while args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "--gpus":
        gpus = args.pop(0) == "all"
    elif flag == "-v":
        src, dst, _ = args.pop(0).split(":")
        mounts[dst] = src
image, command = args[0], [mounts.get(a, a) for a in args[1:]]
site = os.environ["FAKE_SITE_" + ("BROKEN" if "broken" in image else "GPU" if gpus else "NO_DRIVER")]
command[0] = sys.executable
sys.exit(subprocess.run(command, env={{**os.environ, "PYTHONPATH": site}}).returncode)
'''

NVIDIA_SMI = "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3c1b2a-0000-0000-0000-000000000000)'\n"


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A PATH with a docker stand-in (and, on request, nvidia-smi) and three container images' sites."""
    from fake_trtllm import write_fake

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_program(bin_dir, "docker", FAKE_DOCKER.format(python=sys.executable))
    for name, failure in (("GPU", None), ("NO_DRIVER", "no-driver"), ("BROKEN", "broken")):
        site, _ = write_fake(tmp_path / name, "1.2", import_failure=failure)
        monkeypatch.setenv(f"FAKE_SITE_{name}", str(site))
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker.log"))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def with_gpu():
        write_program(bin_dir, "nvidia-smi", NVIDIA_SMI)

    def docker_calls():
        return [json.loads(line) for line in (tmp_path / "docker.log").read_text().splitlines()]

    return with_gpu, docker_calls


IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


def test_a_machine_with_a_gpu_passes_it_to_the_container(fake_machine, capfd):
    with_gpu, docker_calls = fake_machine
    with_gpu()
    assert doctor.gpu_present()
    status = doctor.doctor(container=IMAGE, runtime="trtllm-llmapi")
    out = capfd.readouterr().out
    assert docker_calls()[0][:4] == ["run", "--rm", "--gpus", "all"]
    assert status == 1 and "[checked] tensorrt_llm 1.2.1" in out  # the stand-in image lacks /opt/tritonserver


def test_without_a_gpu_a_failed_import_is_a_missing_driver_not_a_broken_container(fake_machine, capfd):
    _, docker_calls = fake_machine
    assert not doctor.gpu_present()
    status = doctor.doctor(container=IMAGE)
    out = capfd.readouterr().out
    assert "--gpus" not in docker_calls()[0]
    assert status == 1
    assert out.startswith(
        "[FAILED] tensorrt_llm import: a driver library is missing, the container is not broken "
        "(ImportError: libcuda.so.1: cannot open shared object file"
    )
    assert "no GPU was passed to the container" in out and "TensorRT-LLM is broken" not in out


def test_a_broken_container_is_reported_as_one_with_its_import_error(fake_machine, capfd):
    with_gpu, _ = fake_machine
    with_gpu()
    status = doctor.doctor(container="broken/tritonserver:26.04-trtllm-python-py3")
    out = capfd.readouterr().out
    assert (
        status == 1
        and out.startswith("[FAILED] tensorrt_llm import: the container's TensorRT-LLM is broken (ImportError: ")
        and "undefined symbol" in out
    )
