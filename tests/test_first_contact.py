"""The first-contact check (specpipe/trtllm/first_contact.py) against stand-in tensorrt_llm packages of
both generations, run as a subprocess the way the container runs it."""

import os
import subprocess
import sys

import pytest
import yaml

from specpipe.trtllm import first_contact
from specpipe.trtllm.doctor import invocation
from fake_trtllm import GENERATIONS, checks_document, write_fake


def run_check(site, document):
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, first_contact.__file__, "--input", str(document)], capture_output=True,
                          text=True, env=env, timeout=120)
    return proc.returncode, proc.stdout


def model_yaml(decoding_type, key):
    return yaml.safe_dump({"model": "/m", "backend": "pytorch", "tensor_parallel_size": 1,
                           "speculative_config": {"decoding_type": decoding_type, "max_draft_len": 3, key: "/d"},
                           "triton_config": {"max_batch_size": 0, "decoupled": True}})


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
    argvs = [{"step": "build-target", "argv": ["trtllm-build", "--checkpoint_dir", "/c", "--max_draft_length", "4"]},
             {"step": "quantize", "argv": ["python3", f"{examples}/quantization/quantize.py", "--qformatt", "fp8"]},
             {"step": "convert-target", "argv": ["python3", f"{examples}/models/core/llama/convert_checkpoint.py",
                                                 "--model_dir", "/m", "--use_fp9"]}]
    code, out = run_check(site, checks_document(tmp_path, examples, version, argvs=argvs))
    assert code == 1
    assert "[FAILED] build-target: trtllm-build --checkpoint_dir: " in out and "unrecognized arguments: --max_draft_length 4" in out
    assert "unrecognized arguments: --qformatt fp8" in out and "unrecognized arguments: --use_fp9" in out
    assert "ran" not in out  # parsed only: neither script's work ran


@pytest.mark.parametrize("generation, wrong", [("1.1", "Draft_Target"), ("1.1", "Eagle3"), ("1.2", "DraftTarget")])
def test_a_wrong_decoding_type_is_caught(tmp_path, generation, wrong):
    version, types, key = GENERATIONS[generation]
    site, examples = write_fake(tmp_path, generation)
    code, out = run_check(site, checks_document(tmp_path, examples, version, model_yaml=model_yaml(wrong, key), argvs=[]))
    assert code == 1 and f"[FAILED] model.yaml (LLM API arguments): ValueError: decoding_type {wrong!r}" in out


def test_a_version_mismatch_is_refused_naming_both_sides(tmp_path):
    site, examples = write_fake(tmp_path, "1.1")
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1
    assert ("[FAILED] tensorrt_llm 1.1.0: this TensorRT-LLM is 1.1.0, the plan is pinned to 1.2.1: use "
            "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3") in out


def test_a_missing_backend_and_no_tensorrt_llm(tmp_path):
    site, examples = write_fake(tmp_path, "1.2")
    (tmp_path / "backends" / "tensorrtllm").rmdir()
    code, out = run_check(site, checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1 and f"[FAILED] Triton backend tensorrtllm: {tmp_path}/backends/tensorrtllm does not exist" in out
    code, out = run_check(tmp_path / "nothing", checks_document(tmp_path, examples, "1.2.1", argvs=[]))
    assert code == 1 and out.startswith("[FAILED] tensorrt_llm import: ModuleNotFoundError")


def test_invocations(tmp_path):
    doc = tmp_path / "c.json"
    docker = invocation(doc, container="img:1")
    assert docker[:3] == ["docker", "run", "--rm"] and "img:1" in docker
    assert f"{first_contact.__file__}:/specpipe/first_contact.py:ro" in docker
    assert invocation(doc, local=True)[1:3] == ["-m", "specpipe.trtllm.first_contact"]
    with pytest.raises(ValueError):
        invocation(doc)
