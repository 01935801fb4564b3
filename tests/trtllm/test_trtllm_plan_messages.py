"""What a TensorRT-LLM build plan says about its parallel sizes and its fixes: unchecked when no GPU is known
(and why, and what auto picks on common GPUs), each size labelled as given or auto, every suggested fix
re-planned and passing, draft lengths bounded by the engine, one JSON document on every --json failure.

Expected sizes are never typed in: they come from explicit plans of the same build (``plan_build``)."""

import json
import re
import sys

import pytest
from click.testing import CliRunner
from fake_programs import printing_program, write_program

from specpipe.build_request import BuildRequest, GpuCount
from specpipe.cli import main
from specpipe.triton import deployment
from specpipe.trtllm import environment, executor
from specpipe.trtllm.build import plan_build

H100 = "NVIDIA H100 80GB HBM3, 81559"
A100_40 = "NVIDIA A100-SXM4-40GB, 40960"
A10G = "NVIDIA A10G, 23028"
#: The GPUs a plan without a known GPU reports auto's choice on.
COMMON_GPUS = ("h100-80gb", "h200-141gb", "b200")


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    """Only this folder on PATH (no nvidia-smi unless a test writes one), no tensorrt_llm, offline."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(environment, "trtllm_importable", lambda: False)
    monkeypatch.setattr(executor, "trtllm_importable", lambda: False)
    return folder


def build(tmp_path, *args, target="llama3-70b", draft="eagle"):
    return CliRunner().invoke(
        main, ["build", "--target", target, "--draft", draft, "--dry-run", "--engines-dir", str(tmp_path / "e"), *args]
    )


def auto_tp(tmp_path, gpu, gpus=8, draft="eagle"):
    """The smallest TP (PP 1) whose explicit plan fits ``gpu``."""
    for tp in (1, 2, 4, 8):
        if tp > gpus:
            return None
        request = BuildRequest(
            target="llama3-70b",
            draft=draft,
            runtime="trtllm",
            gpu=gpu,
            tp=tp,
            pp=1,
            gpus=GpuCount(gpus, "--gpus"),
            dry_run=True,
            engines_dir=tmp_path / "x",
        )
        if plan_build(request, importable=lambda: False)[0].preflight.memory.fits:
            return tp
    return None


def check_line(text, name):
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("[") and f"] {name}:" in line)


@pytest.mark.parametrize(
    "smi, why",
    [
        (None, "nvidia-smi not found (no NVIDIA driver here)"),
        (
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2; exit 9\n",
            "nvidia-smi failed (exit status 9): NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.",
        ),
        ("#!/bin/sh\necho 'foo bar baz'; echo ',,,'\n", "nvidia-smi listed no GPU (it printed: foo bar baz)"),
        (
            "#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 24564'\n",
            "nvidia-smi lists 1 x NVIDIA GeForce RTX 4090 (24.0 GiB), a board the GPU table lacks",
        ),
    ],
    ids=["missing", "exit-9", "garbage", "unknown-board"],
)
def test_without_a_known_gpu_parallelism_is_not_checked_and_says_why_and_the_choices(tmp_path, bin_dir, smi, why):
    if smi is not None:
        write_program(bin_dir, "nvidia-smi", smi)
    result = build(tmp_path)
    assert result.exit_code == 0, result.output
    line = check_line(result.stdout, "parallelism")
    assert line.startswith("[not checked] parallelism: TP 1 x PP 1 (auto) = 1 GPU ")
    assert f"not fitted to a GPU: {why};" in line and "(name it with --gpu)" in line
    available = 1 if smi and "RTX" in smi else 8
    for gpu in COMMON_GPUS:
        tp = auto_tp(tmp_path, gpu, available)
        assert (f"{gpu}: TP {tp} x PP 1" if tp else f"{gpu}: none fits {available} GPU") in line
    assert "with --gpu h100-80gb: " in line
    assert check_line(result.stdout, "memory plan").startswith("[not checked] memory plan:")
    doc = json.loads(build(tmp_path, "--json").stdout)
    assert doc["parallel"]["checked"] is False and doc["memory"]["fits"] is None


def test_an_unknown_board_is_named_in_the_plan(tmp_path, bin_dir):
    printing_program(bin_dir, "nvidia-smi", "NVIDIA GH200 480GB, 97871")
    line = check_line(build(tmp_path).stdout, "parallelism")
    assert "nvidia-smi lists 1 x NVIDIA GH200 480GB (95.6 GiB), a board the GPU table lacks" in line


def test_a_known_gpu_is_checked_ok(tmp_path, bin_dir):
    printing_program(bin_dir, "nvidia-smi", "\n".join([H100] * 8))
    want = auto_tp(tmp_path, "h100-80gb")
    result = build(tmp_path)
    assert check_line(result.stdout, "parallelism") == (
        f"[ok] parallelism: TP {want} x PP 1 (auto) = {want} GPUs of 8 GPUs (nvidia-smi: 8 x NVIDIA H100 80GB HBM3)"
    )
    assert json.loads(build(tmp_path, "--json").stdout)["parallel"]["checked"] is True


def test_mixed_boards_plan_for_the_most_common_one(tmp_path, bin_dir):
    printing_program(bin_dir, "nvidia-smi", "\n".join([A100_40] + [H100] * 7))
    doc = json.loads(build(tmp_path, "--json").stdout)
    assert doc["gpu"] == "h100-80gb" and doc["parallel"]["available"] == 7
    assert doc["parallel"]["tp"] == auto_tp(tmp_path, "h100-80gb", 7)


def fixes_of(stderr: str) -> list[str]:
    """The suggestions after ``try``: ``--flag value`` (what auto picks kept apart)."""
    tail = stderr.strip().split(": try ", 1)[1]
    return [part for part in tail.split(" or ")]


@pytest.mark.parametrize(
    "boards, args, draft",
    [
        ([H100] * 2, [], "lookahead"),
        ([H100] * 2, [], "eagle"),
        ([H100] * 8, ["--tp", "2"], "eagle"),
        ([H100] * 1, ["--max-batch-size", "64"], "lookahead"),
    ],
    ids=["2xH100-lookahead", "2xH100-eagle", "tp2-eagle", "1xH100-batch64"],
)
def test_every_suggested_fix_is_re_planned_and_passes(tmp_path, bin_dir, boards, args, draft):
    printing_program(bin_dir, "nvidia-smi", "\n".join(boards))
    result = build(tmp_path, *args, draft=draft)
    assert result.exit_code == 1 and ": try " in result.stderr, result.output
    fixes = fixes_of(result.stderr)
    assert fixes
    for fix in fixes:
        flags, picks = re.match(r"(.*?)(?: \(adds no weights\))?(?: \(auto picks TP (\d+) x PP (\d+)\))?$", fix).group(
            1, 2
        )
        tokens = flags.split()
        changed = list(args)
        for name, value in zip(tokens[::2], tokens[1::2]):
            if name in changed:
                changed[changed.index(name) + 1] = value
            elif name != "--draft":
                changed += [name, value]
        new_draft = tokens[tokens.index("--draft") + 1] if "--draft" in tokens else draft
        again = build(tmp_path, *changed, "--json", draft=new_draft)
        assert again.exit_code == 0, (fix, again.output)
        doc = json.loads(again.stdout)
        assert doc["memory"]["fits"] is True and doc["error"] is None
        if picks:
            want = re.search(r"auto picks TP (\d+) x PP (\d+)", fix).groups()
            assert (str(doc["parallel"]["tp"]), str(doc["parallel"]["pp"])) == want


def test_a_fix_that_cannot_fit_is_not_offered(tmp_path, bin_dir):
    """70B on one A10G: a weightless draft does not fit either, so it is not suggested."""
    printing_program(bin_dir, "nvidia-smi", A10G)
    result = build(tmp_path)
    assert result.exit_code == 1
    lookahead = build(tmp_path, "--json", draft="lookahead")
    assert json.loads(lookahead.stdout)["memory"]["fits"] is False
    assert "--draft lookahead" not in result.stderr


def test_given_sizes_are_labelled_and_beyond_the_gpus_warned(tmp_path, bin_dir):
    printing_program(bin_dir, "nvidia-smi", "\n".join([H100] * 8))
    result = build(tmp_path, "--pp", "80", draft="lookahead")
    assert result.exit_code == 0, result.output
    assert "TP 1 (auto) x PP 80 (given)" in result.stdout
    line = check_line(result.stdout, "parallelism")
    assert line.startswith("[warning] parallelism: TP 1 (auto) x PP 80 (given) = 80 GPUs") and "8 available" in line
    parallel = json.loads(build(tmp_path, "--pp", "80", "--json", draft="lookahead").stdout)["parallel"]
    assert (parallel["tp_from"], parallel["pp_from"], parallel["pp"]) == ("auto", "explicit", 80)
    line = check_line(build(tmp_path, "--tp", "16", "--pp", "1", draft="lookahead").stdout, "parallelism")
    assert line.startswith("[warning] parallelism: TP 16 x PP 1 (given) = 16 GPUs")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--lookahead", "100,100,100"],
            "max_draft_len 19799 of lookahead (W, N, G) = (100, 100, 100) does not fit the engine",
        ),
        (["--lookahead", "7,7,7", "--max-seq-len", "64", "--max-input-len", "32"], "max_draft_len 83 of lookahead"),
        (["--lookahead", "1,1,1"], "TensorRT-LLM requires W = 1 and G = 0 for N = 1"),
    ],
)
def test_lookahead_draft_lengths_are_bounded_by_the_engine(tmp_path, bin_dir, args, message):
    result = build(tmp_path, "--gpu", "h100-80gb", *args, draft="lookahead")
    assert result.exit_code == 1 and message in result.stderr, result.output


@pytest.mark.parametrize(
    "args, target, message",
    [
        (["-q", "fp8"], "llama3-70b", "--quantization fp8 with --draft method 'eagle'"),
        (["--tp", "3"], "llama3-70b", "--tp 3 does not divide"),
        ([], "no-such-target", "unknown target 'no-such-target'"),
        (["--gpu", "h100-8"], "llama3-70b", "unknown GPU 'h100-8'"),
    ],
)
def test_with_json_every_failure_is_one_json_document(tmp_path, bin_dir, args, target, message):
    result = build(tmp_path, *args, "--json", target=target)
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert message in doc["error"] and doc["format"] and result.stderr.startswith("error: ")


def test_a_compatibility_fix_names_only_what_then_passes(tmp_path, bin_dir):
    """-q fp8 with EAGLE: each `use --flag value` alternative, applied, makes a plan that passes."""
    result = build(tmp_path, "--gpu", "h100-80gb", "--gpus", "8", "-q", "fp8")
    assert result.exit_code == 1
    assert "--runtime" not in result.stderr
    alternatives = re.findall(r"--quantization (\w+)", result.stderr.split(": use ", 1)[1])
    assert alternatives
    for value in alternatives:
        assert build(tmp_path, "--gpu", "h100-80gb", "--gpus", "8", "-q", value).exit_code == 0


def test_gpu_names_are_normalised_and_counts_singular(tmp_path, bin_dir):
    printing_program(bin_dir, "nvidia-smi", "NVIDIA A100-SXM4-80GB, 81920")
    result = build(tmp_path, "--gpu", "H100-80GB", "--json")
    doc = json.loads(result.stdout)
    assert doc["gpu"] == "h100-80gb"
    assert "not the h100-80gb planned for" in doc["parallel"]["available_from"]
    text = build(tmp_path, "--gpu", "h100-80gb", "--tp", "1", target="llama3-8b").stdout
    assert "1 GPUs" not in text and "memory per GPU (1 GPU, bf16)" in text


def test_packaging_an_unchecked_plan_warns(tmp_path, bin_dir, monkeypatch):
    warnings = []
    monkeypatch.setattr(deployment, "warn", warnings.append)
    unchecked, checked = tmp_path / "unchecked.json", tmp_path / "checked.json"
    unchecked.write_text(build(tmp_path, "--json").stdout)
    checked.write_text(build(tmp_path, "--json", "--gpu", "h100-80gb").stdout)
    assert deployment.from_plan(checked).tp == auto_tp(tmp_path, "h100-80gb") and warnings == []
    assert deployment.from_plan(unchecked).tp == 1
    assert warnings == [
        "plan unchecked.json: TP 1 x PP 1 was not fitted to a GPU (planned without --gpu and none "
        "detected): the repository uses those sizes; re-plan with --gpu NAME to have them checked"
    ]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
