"""The first-contact check (specpipe/trtllm/first_contact.py) against stand-in tensorrt_llm packages of
both generations, run as a subprocess the way the container runs it."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from fake_trtllm import BUILD_RETURNS, GENERATIONS, checks_document, write_fake

from specpipe.trtllm import first_contact
from specpipe.trtllm.doctor import invocation


def run_check(site, document):
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, first_contact.__file__, "--input", str(document)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, proc.stdout


def model_yaml(decoding_type, key):
    return yaml.safe_dump(
        {
            "model": "/m",
            "backend": "pytorch",
            "tensor_parallel_size": 1,
            "speculative_config": {"decoding_type": decoding_type, "max_draft_len": 3, key: "/d"},
            "triton_config": {"max_batch_size": 0, "decoupled": True},
        }
    )


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_a_matching_container_passes_every_check(tmp_path, generation):
    version, types, key = GENERATIONS[generation]
    site, examples = write_fake(tmp_path, generation)
    code, out = run_check(site, checks_document(tmp_path, examples, version, model_yaml=model_yaml(types[0], key)))
    assert code == 0, out
    assert out.splitlines()[-1] == "first contact: 7 checked, 0 failed"
    assert f"[checked] tensorrt_llm {version}" in out and "[checked] model.yaml (LLM API arguments)" in out


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_a_wrong_flag_is_caught_by_the_real_parser(tmp_path, generation):
    version, _, _ = GENERATIONS[generation]
    site, examples = write_fake(tmp_path, generation)
    argvs = [
        {"step": "build-target", "argv": ["trtllm-build", "--checkpoint_dir", "/c", "--max_draft_length", "4"]},
        {"step": "quantize", "argv": ["python3", f"{examples}/quantization/quantize.py", "--qformatt", "fp8"]},
        {
            "step": "convert-target",
            "argv": [
                "python3",
                f"{examples}/models/core/llama/convert_checkpoint.py",
                "--model_dir",
                "/m",
                "--use_fp9",
            ],
        },
    ]
    code, out = run_check(site, checks_document(tmp_path, examples, version, argvs=argvs))
    assert code == 1
    assert (
        "[FAILED] build-target: trtllm-build --checkpoint_dir: " in out
        and "unrecognized arguments: --max_draft_length 4" in out
    )
    assert "unrecognized arguments: --qformatt fp8" in out and "unrecognized arguments: --use_fp9" in out
    assert "ran" not in out  # parsed only: neither script's work ran


@pytest.mark.parametrize("generation, wrong", [("1.1", "Draft_Target"), ("1.1", "Eagle3"), ("1.2", "DraftTarget")])
def test_a_wrong_decoding_type_is_caught(tmp_path, generation, wrong):
    version, types, key = GENERATIONS[generation]
    site, examples = write_fake(tmp_path, generation)
    code, out = run_check(
        site, checks_document(tmp_path, examples, version, model_yaml=model_yaml(wrong, key), argvs=[])
    )
    assert code == 1 and f"[FAILED] model.yaml (LLM API arguments): ValueError: decoding_type {wrong!r}" in out


def test_a_version_mismatch_is_refused_naming_both_sides(tmp_path):
    site, examples = write_fake(tmp_path, "1.1")
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1
    assert (
        "[FAILED] tensorrt_llm 1.1.0: this TensorRT-LLM is 1.1.0, the plan is pinned to 1.2.1: use "
        "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    ) in out


def test_a_missing_backend_and_no_tensorrt_llm(tmp_path):
    site, examples = write_fake(tmp_path, "1.2")
    (tmp_path / "backends" / "tensorrtllm").rmdir()
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1 and f"[FAILED] Triton backend tensorrtllm: {tmp_path}/backends/tensorrtllm does not exist" in out
    code, out = run_check(tmp_path / "nothing", checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1 and out.startswith(
        "[FAILED] tensorrt_llm import: tensorrt_llm is not installed here "
        "(ModuleNotFoundError: No module named 'tensorrt_llm'): run the check in "
        "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    )


def test_invocations(tmp_path):
    doc = tmp_path / "c.json"
    docker = invocation(doc, container="img:1")
    assert docker[:3] == ["docker", "run", "--rm"] and "img:1" in docker
    assert f"{first_contact.__file__}:/specpipe/first_contact.py:ro" in docker
    assert invocation(doc, local=True)[1:3] == ["-m", "specpipe.trtllm.first_contact"]
    with pytest.raises(ValueError):
        invocation(doc)


BOGUS_BUILD = {"step": "build-target", "argv": ["trtllm-build", "--checkpoint_dir", "/c", "--no_such_flag", "7"]}
GOOD_BUILD = {"step": "build-target", "argv": ["trtllm-build", "--checkpoint_dir", "/c", "--max_batch_size", "8"]}


@pytest.mark.parametrize("shape", ["parser", "namespace"])
def test_a_bogus_trtllm_build_flag_fails_whichever_shape_parse_arguments_has(tmp_path, shape):
    """Upstream's parse_arguments() returns the parser unparsed (shape 'parser'): calling it parsed nothing,
    so any argv was reported checked. Both shapes must parse the argv."""
    site, examples = write_fake(tmp_path, "1.2", build_returns=shape)
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[BOGUS_BUILD]))
    assert code == 1, out
    assert "[FAILED] build-target: trtllm-build --checkpoint_dir: " in out
    assert "unrecognized arguments: --no_such_flag 7" in out
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[GOOD_BUILD]))
    assert code == 0 and "[checked] build-target: trtllm-build --checkpoint_dir" in out, out


def test_a_parse_arguments_of_an_unknown_shape_is_a_failure_not_a_pass(tmp_path):
    site, examples = write_fake(tmp_path, "1.2", build_returns="none")
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[GOOD_BUILD]))
    assert code == 1
    assert (
        "[FAILED] build-target: trtllm-build --checkpoint_dir: parse_arguments() returned NoneType, neither a "
        "parsed Namespace nor an ArgumentParser"
    ) in out
    assert set(BUILD_RETURNS) == {"parser", "namespace", "none"}


def test_a_script_that_never_parses_its_arguments_fails(tmp_path):
    site, examples = write_fake(tmp_path, "1.2")
    (examples / "quantization" / "quantize.py").write_text("print('no parser here')\n")
    argv = {"step": "quantize", "argv": ["python3", f"{examples}/quantization/quantize.py", "--qformat", "fp8"]}
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[argv]))
    assert code == 1
    assert "[FAILED] quantize: python3 " in out and "the script ran to its end without parsing its arguments" in out


@pytest.mark.parametrize(
    "cause, gpus_passed, expected",
    [
        (
            "no-driver",
            False,
            "a driver library is missing, the container is not broken (ImportError: libcuda.so.1: cannot "
            "open shared object file: No such file or directory): no GPU was passed to the container",
        ),
        (
            "no-driver",
            True,
            "the container got --gpus all but no driver libraries: install the NVIDIA Container Toolkit",
        ),
        (
            "broken",
            True,
            "the container's TensorRT-LLM is broken (ImportError: /usr/local/lib/python3.12/dist-packages/"
            "tensorrt_llm/libs/libth_common.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev): pull "
            "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 again",
        ),
    ],
)
def test_a_failed_import_says_which_kind_of_failure(tmp_path, cause, gpus_passed, expected):
    site, examples = write_fake(tmp_path, "1.2", import_failure=cause)
    document = checks_document(tmp_path, examples, "1.2.1", argvs=[])
    doc = json.loads(document.read_text())
    document.write_text(json.dumps({**doc, "gpus_passed": gpus_passed}))
    code, out = run_check(site, document)
    assert code == 1 and out.startswith("[FAILED] tensorrt_llm import: ") and expected in out, out
    assert len(out.splitlines()) == 1


def test_what_cannot_be_checked_yet_is_said_and_does_not_fail(tmp_path):
    site, examples = write_fake(tmp_path, "1.2")
    document = checks_document(tmp_path, examples, "1.2.1", argvs=[])
    doc = json.loads(document.read_text())
    document.write_text(
        json.dumps({**doc, "not_checked": [{"what": "model.yaml (LLM API arguments)", "why": "no GPU"}]})
    )
    code, out = run_check(site, document)
    assert code == 0, out
    assert "[not checked] model.yaml (LLM API arguments): no GPU" in out
    assert out.splitlines()[-1] == "first contact: 3 checked, 0 failed, 1 not checked"
