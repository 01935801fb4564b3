"""Library functions for the CLI wiring: GPU detection from a stand-in nvidia-smi, what is missing,
and what --runtime auto resolves to."""

from fake_programs import printing_program

from specpipe.speculative import Runtime
from specpipe.trtllm import environment


def fake_nvidia_smi(tmp_path, monkeypatch, line):
    printing_program(tmp_path / "bin", "nvidia-smi", line)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_detect_gpu_maps_nvidia_smi_to_the_table(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559")
    assert environment.detect_gpu() == "h100-80gb"
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 143771")
    assert environment.detect_gpu() == "h200-141gb"
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA GeForce RTX 4090, 24564")
    assert environment.detect_gpu() is None


def test_nothing_here_is_reported_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(environment, "trtllm_importable", lambda: False)
    assert environment.detect_gpu() is None
    assert environment.what_is_missing() == ["GPU", "docker", "importable tensorrt_llm"]


def test_resolve_runtime():
    assert environment.resolve_runtime("llama3-70b") is Runtime.TRTLLM
    assert environment.resolve_runtime("smollm2-135m") is Runtime.CPU
    assert environment.resolve_runtime("llama3-70b", "trtllm-llmapi") is Runtime.TRTLLM_LLMAPI
