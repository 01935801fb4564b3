"""``specpipe build`` with ``--runtime auto`` (the default): the mission's command as typed, on a machine
without a GPU, prints the engine-flow plan and what is missing and downloads nothing; CPU targets stay on
the CPU runtime; ``--gpu`` comes from nvidia-smi when a GPU is present."""

from unittest.mock import patch

import pytest
from click.testing import CliRunner
from fake_programs import printing_program

from specpipe.build_request import BuildRequest, GpuCount
from specpipe.cli import main
from specpipe.trtllm import environment, executor


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """This machine as the issue describes it: no nvidia-smi, no docker, no tensorrt_llm; no network; any
    download attempt fails the test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(environment, "trtllm_importable", lambda: False)
    monkeypatch.setattr(executor, "trtllm_importable", lambda: False)

    def no_download(**options):
        raise AssertionError(f"downloaded {options}")

    monkeypatch.setattr(executor, "snapshot_download", no_download)

    def add_tool(name, line=""):
        printing_program(bin_dir, name, line)

    return add_tool


def test_the_missions_command_as_typed_prints_the_engine_plan_and_what_is_missing(tmp_path, machine, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["build", "--target", "llama3-70b", "--draft", "eagle"])
    assert result.exit_code == 1
    out = result.stdout
    assert out.startswith("specpipe build plan: llama3-70b-eagle (trtllm, TensorRT-LLM 1.2.1")
    assert "hf download yuhuili/EAGLE-LLaMA3-Instruct-70B" in out and "python3 -m specpipe.trtllm.prepare_eagle" in out
    assert "/eagle/convert_checkpoint.py" in out and "--speculative_decoding_mode eagle" in out
    assert "no eagle heads ship" not in result.output and "train-draft" not in result.output  # not the CPU runtime
    assert result.stderr.splitlines() == [
        "error: --runtime auto chose trtllm for target llama3-70b, but this machine lacks a GPU (no nvidia-smi) and docker "
        "and an importable tensorrt_llm: build on a machine with an NVIDIA GPU and docker (the steps run in "
        "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3) or inside that container; the plan above lists every step, "
        "nothing was downloaded"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # no engines/, no HF cache, nothing downloaded


def test_with_docker_but_no_gpu_it_still_stops_before_downloading(tmp_path, machine):
    machine("docker")
    result = CliRunner().invoke(
        main, ["build", "--target", "llama3-8b", "--draft", "lookahead", "--engines-dir", str(tmp_path / "e")]
    )
    assert result.exit_code == 1 and "lacks a GPU (no nvidia-smi) and an importable tensorrt_llm:" in result.stderr
    assert "executor docker" in result.stdout and not (tmp_path / "e").exists() and not (tmp_path / "hf").exists()


def test_cpu_targets_resolve_to_the_cpu_runtime(machine):
    with (
        patch("specpipe.build_cpu.build_cpu") as build_cpu,
        patch("specpipe.trtllm.build.build_trtllm") as build_trtllm,
    ):
        result = CliRunner().invoke(main, ["build", "--target", "smollm2-135m", "--draft", "ngram"])
    assert result.exit_code == 0, result.output
    assert build_trtllm.call_count == 0
    assert build_cpu.call_args.args[0].runtime == "cpu" and build_cpu.call_args.args[0].gpu is None


def test_the_gpu_comes_from_nvidia_smi_and_the_build_proceeds(machine):
    machine("nvidia-smi", "NVIDIA H100 80GB HBM3, 81559")
    machine("docker")
    with patch("specpipe.trtllm.build.build_trtllm") as build_trtllm:
        result = CliRunner().invoke(main, ["build", "--target", "llama3-8b", "--draft", "eagle"])
    assert result.exit_code == 0, result.output
    build_trtllm.assert_called_once_with(
        BuildRequest(
            target="llama3-8b",
            draft="eagle",
            runtime="trtllm",
            gpu="h100-80gb",
            tp="auto",
            pp="auto",
            gpus=GpuCount(1, "nvidia-smi: 1 x NVIDIA H100 80GB HBM3"),
        )
    )
    with patch("specpipe.trtllm.build.build_trtllm") as build_trtllm:  # an explicit --gpu wins
        CliRunner().invoke(main, ["build", "--target", "llama3-8b", "--draft", "eagle", "--gpu", "h200-141gb"])
    assert build_trtllm.call_args.args[0].gpu == "h200-141gb"


@pytest.mark.parametrize("runtime", ["cpu", "trtllm", "trtllm-llmapi"])
def test_an_explicit_runtime_is_kept(machine, runtime):
    with (
        patch("specpipe.build_cpu.build_cpu") as build_cpu,
        patch("specpipe.trtllm.build.build_trtllm") as build_trtllm,
    ):
        result = CliRunner().invoke(main, ["build", "--target", "llama3-8b", "--draft", "ngram", "--runtime", runtime])
    assert result.exit_code == 0, result.output
    called = build_cpu if runtime == "cpu" else build_trtllm
    assert called.call_args.args[0].runtime == runtime and (build_cpu.call_count + build_trtllm.call_count) == 1


def test_auto_dry_runs_need_nothing_here(tmp_path, machine):
    result = CliRunner().invoke(
        main, ["build", "--target", "llama3-70b", "--draft", "eagle", "--dry-run", "--engines-dir", str(tmp_path / "e")]
    )
    assert result.exit_code == 0 and "specpipe build plan: llama3-70b-eagle (trtllm" in result.stdout
    assert not (tmp_path / "e").exists()


def test_a_checkpoint_directory_resolves_to_the_engine_flow(tmp_path):
    (tmp_path / "ckpt").mkdir()
    assert environment.resolve_runtime(str(tmp_path / "ckpt")).value == "trtllm"
    assert (
        environment.cannot_run_here(["docker"]) is None
        and environment.cannot_run_here(["importable tensorrt_llm"]) is None
    )
