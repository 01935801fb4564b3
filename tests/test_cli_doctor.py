"""``specpipe doctor --container IMAGE | --local [--plan PLAN.json]``: the arguments reaching the library,
and the checks document the library makes from a plan file."""

import json
from pathlib import Path
from unittest.mock import patch

import pytest
from click.testing import CliRunner

from specpipe.cli import main
from specpipe.errors import SpecpipeError
from specpipe.trtllm import doctor


def invoke(*args):
    return CliRunner().invoke(main, ["doctor", *args])


def test_container_reaches_the_library():
    with patch("specpipe.cli.doctor.run_doctor", return_value=0) as run:
        result = invoke("--container", "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3")
    assert result.exit_code == 0, result.output
    run.assert_called_once_with(container="nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3", local=False, plan_file=None,
                                runtime="trtllm")


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
    dry = CliRunner().invoke(main, ["build", "--target", "llama3-8b", "--draft", "eagle", "--runtime", "trtllm", "--dry-run",
                                    "--json", "--engines-dir", str(tmp_path / "e")])
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
    with pytest.raises(SpecpipeError, match="the --plan file is not a TensorRT-LLM plan: write one with 'specpipe build"):
        doctor.doctor(local=True, plan_file=bad, run=lambda argv: None)
    result = invoke("--local", "--plan", str(bad))
    assert result.exit_code == 1 and result.stderr.startswith("error: the --plan file is not a TensorRT-LLM plan")
