"""``--tp auto`` / ``--pp auto``: the smallest TP (then PP) the memory plan fits on the GPUs available, with the
options tried in the plan; explicit sizes still checked; the GPU count from nvidia-smi, ``--gpus`` or a node of 8.

Expected sizes are never typed in: they come from the memory plan of the same build made with each explicit
size (``plan_build`` with ``tp=t``), which is what auto must agree with."""

import json

import pytest
from click.testing import CliRunner
from fake_programs import printing_program

from specpipe.build_request import BuildRequest, GpuCount
from specpipe.cli import main
from specpipe.speculative import Method, Runtime
from specpipe.triton.deployment import from_plan
from specpipe.trtllm import environment, executor
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.environment import Board, count_boards
from specpipe.trtllm.gpus import GIB
from specpipe.trtllm.parallelism import NODE_GPUS, PP_REFUSED

H100 = "NVIDIA H100 80GB HBM3, 81559"
H200 = "NVIDIA H200, 143771"
B200 = "NVIDIA B200, 183359"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """No GPU, docker or tensorrt_llm, offline; ``machine(lines)`` adds an nvidia-smi printing those lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(environment, "trtllm_importable", lambda: False)
    monkeypatch.setattr(executor, "trtllm_importable", lambda: False)

    def nvidia_smi(*lines: str) -> None:
        printing_program(bin_dir, "nvidia-smi", "\n".join(lines))

    return nvidia_smi


def explicit(tmp_path, target, draft, gpu, tp, pp=1, **options):
    """The memory plan of the same build with explicit sizes (the numbers auto must agree with)."""
    request = BuildRequest(
        target=target,
        draft=draft,
        runtime=options.pop("runtime", "trtllm"),
        gpu=gpu,
        tp=tp,
        pp=pp,
        dry_run=True,
        engines_dir=tmp_path / "explicit",
        **options,
    )
    return plan_build(request, importable=lambda: False)[0].preflight.memory


def smallest_fitting_tp(tmp_path, target, draft, gpu, gpus, **options):
    """The smallest TP (PP 1) up to ``gpus`` whose explicit plan fits, and each TP's total (bytes per GPU)."""
    totals = {}
    for tp in (1, 2, 4, 8):
        if tp > gpus:
            break
        memory = explicit(tmp_path, target, draft, gpu, tp, **options)
        totals[tp] = memory.total
        if memory.fits:
            return tp, totals
    return None, totals


def dry_run(tmp_path, *args):
    result = CliRunner().invoke(
        main,
        [*"build --target llama3-70b --draft eagle --dry-run --engines-dir".split(), str(tmp_path / "e"), *args],
    )
    return result


@pytest.mark.parametrize(
    "boards, gpu",
    [([H100] * 8, "h100-80gb"), ([H200] * 2, "h200-141gb"), ([B200] * 8, "b200")],
    ids=["8xH100", "2xH200", "8xB200"],
)
def test_auto_picks_the_smallest_tp_the_memory_plan_fits_on_the_detected_gpus(tmp_path, machine, boards, gpu):
    machine(*boards)
    want, totals = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", gpu, len(boards))
    assert want is not None and want > 1  # a 70B model at 16 bits fits no single one of these GPUs with 4 EAGLE nets

    result = dry_run(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    parallel = doc["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["gpus"], parallel["chosen"]) == (want, 1, want, "auto")
    assert (
        parallel["available"] == len(boards)
        and parallel["available_from"] == f"nvidia-smi: {len(boards)} x {boards[0].split(',')[0]}"
    )
    assert [(o["tp"], o["pp"], o["total"], o["fits"]) for o in parallel["tried"]] == [
        (tp, 1, total, tp == want) for tp, total in totals.items()
    ]
    assert doc["gpu"] == gpu and doc["memory"]["total"] == totals[want] and doc["memory"]["fits"] is True
    convert = next(s for s in doc["steps"] if s["name"] == "convert-target")["argv"]
    assert convert[convert.index("--tp_size") + 1] == str(want) and convert[convert.index("--pp_size") + 1] == "1"

    text = dry_run(tmp_path).stdout
    assert f"TP {want} x PP 1 (auto)" in text
    assert (
        f"parallelism: TP {want} x PP 1, auto: the smallest TP, then PP, that fits {gpu}; {len(boards)} GPUs available"
        in text
    )
    for tp, total in totals.items():
        verdict = "yes   chosen" if tp == want else f"no    {total / GIB:.1f} GiB >"
        assert f"{tp:>6}{1:>4}{tp:>6}{total / GIB:>10.2f}  {verdict}" in text


def test_gpus_and_gpu_stand_in_for_nvidia_smi(tmp_path, machine):
    want, _ = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", "h100-80gb", 8)
    result = dry_run(tmp_path, "--gpus", "8", "--gpu", "h100-80gb", "--json")
    assert result.exit_code == 0, result.output
    parallel = json.loads(result.stdout)["parallel"]
    assert (parallel["tp"], parallel["chosen"], parallel["available"], parallel["available_from"]) == (
        want,
        "auto",
        8,
        "--gpus",
    )


def test_no_gpu_detected_assumes_a_node_of_eight_and_says_so(tmp_path, machine):
    result = dry_run(tmp_path, "--gpu", "h100-80gb")
    assert result.exit_code == 0, result.output
    assert (
        f"{NODE_GPUS} GPUs available (assumed, a node of {NODE_GPUS}: no GPU detected, give --gpus N)" in result.stdout
    )


def test_without_any_gpu_auto_is_the_smallest_valid_size_and_says_why(tmp_path, machine):
    result = dry_run(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    parallel = json.loads(result.stdout)["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["chosen"]) == (1, 1, "auto")
    assert parallel["notes"] == ["no GPU to fit (name it with --gpu): auto took the smallest valid size, TP 1 x PP 1"]


def test_an_explicit_tp_wins_and_is_still_refused_with_the_fixes(tmp_path, machine):
    machine(*[H100] * 8)
    want, totals = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", "h100-80gb", 8)
    result = dry_run(tmp_path, "--tp", "2", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["parallel"]["tp"], doc["parallel"]["chosen"]) == (2, "explicit")
    assert [(o["tp"], o["total"], o["fits"]) for o in doc["parallel"]["tried"]] == [(2, totals[2], False)]
    assert result.stderr.startswith(f"error: the plan needs {totals[2] / GIB:.1f} GiB per GPU (bf16, TP 2, ")
    assert f"try --tp {want} or " in result.stderr and result.stderr.count("\n") == 1


def test_an_explicit_tp_one_on_eight_b_still_works(tmp_path, machine):
    machine(*[H100] * 8)
    result = CliRunner().invoke(
        main,
        [*"build --target llama3-8b --draft eagle --tp 1 --dry-run --json --engines-dir".split(), str(tmp_path / "e")],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["parallel"]["tp"], doc["parallel"]["pp"], doc["parallel"]["chosen"]) == (1, 1, "explicit")
    assert (
        doc["memory"]["total"] == explicit(tmp_path, "llama3-8b", "eagle", "h100-80gb", 1).total
        and doc["memory"]["fits"]
    )


def test_when_nothing_fits_the_error_names_the_best_option_and_the_fixes(tmp_path, machine):
    machine(*[H100] * 2)
    want, totals = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", "h100-80gb", 8)
    result = dry_run(tmp_path, "--json")
    assert result.exit_code == 1
    parallel = json.loads(result.stdout)["parallel"]
    best = min((1, 2), key=lambda tp: totals[tp])
    assert (parallel["tp"], parallel["chosen"]) == (best, "auto") and [o["tp"] for o in parallel["tried"]] == [1, 2]
    assert parallel["notes"] == [f"PP > 1 not tried: {PP_REFUSED[(Runtime.TRTLLM, Method.EAGLE)]}"]
    assert result.stderr.startswith(
        f"error: no TP x PP fits h100-80gb within the 2 GPUs available (nvidia-smi: 2 x NVIDIA H100 80GB HBM3): the best "
        f"tried, TP {best} x PP 1, needs {totals[best] / GIB:.1f} GiB per GPU (bf16, batch 8 x 8192 tokens)"
    )
    assert f"try --gpus {want} (auto picks TP {want} x PP 1)" in result.stderr


def test_pp_is_tried_when_tp_alone_cannot_fit_and_the_method_allows_it(tmp_path):
    """70B at 16 bits (no draft) on three H100s: TP must divide the 64 heads, so TP 1 and 2 are all TP alone can
    use and neither fits; PP joins in. The chosen option fits, every option tried before it does not, and
    each has the total its explicit plan has."""
    request = BuildRequest(
        target="llama3-70b",
        draft="none",
        runtime="trtllm",
        gpu="h100-80gb",
        tp="auto",
        pp="auto",
        gpus=GpuCount(3, "--gpus"),
        dry_run=True,
        engines_dir=tmp_path / "e",
    )
    plan = plan_build(request, importable=lambda: False)[0]
    choice = plan.preflight.parallel
    assert choice.chosen == "auto" and choice.fits is True and choice.pp > 1 and choice.tp * choice.pp <= 3
    assert plan.request.tp == choice.tp and plan.request.pp == choice.pp  # the steps use the chosen sizes
    tried = choice.tried
    assert [(o.tp, o.pp) for o in tried if o.pp == 1] == [(1, 1), (2, 1)]
    assert all(o.fits is False for o in tried[:-1]) and (tried[-1].tp, tried[-1].pp, tried[-1].fits) == (
        choice.tp,
        choice.pp,
        True,
    )
    assert [o.gpus for o in tried] == sorted(o.gpus for o in tried)
    for option in tried:
        assert option.total == explicit(tmp_path, "llama3-70b", "none", "h100-80gb", option.tp, option.pp).total
    convert = plan.step("convert-target").argv
    assert convert[convert.index("--tp_size") + 1] == str(choice.tp) and convert[convert.index("--pp_size") + 1] == str(
        choice.pp
    )


def test_the_real_build_uses_the_same_resolved_sizes(tmp_path, machine):
    """Not a dry run: the plan printed before the build stops (no executor here) carries the chosen TP."""
    machine(*[H100] * 8)
    want, _ = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", "h100-80gb", 8)
    result = CliRunner().invoke(
        main,
        [*"build --target llama3-70b --draft eagle --runtime trtllm --engines-dir".split(), str(tmp_path / "e")],
    )
    assert result.exit_code == 1 and "no executor can run TensorRT-LLM here" in result.stderr
    assert f"TP {want} x PP 1 (auto)" in result.stdout and f"--tp_size {want} --pp_size 1" in result.stdout
    assert f"--workers {want}" in result.stdout


def test_the_plan_document_still_feeds_packaging(tmp_path, machine):
    machine(*[H100] * 8)
    want, _ = smallest_fitting_tp(tmp_path, "llama3-70b", "eagle", "h100-80gb", 8)
    result = dry_run(tmp_path, "--json")
    path = tmp_path / "plan.json"
    path.write_text(result.stdout)
    deployment = from_plan(path)
    assert (deployment.tp, deployment.pp, deployment.world_size) == (want, 1, want)


def test_mixed_boards_are_said_and_the_planned_ones_counted(tmp_path, machine):
    machine(*[H100] * 4, *["NVIDIA A100-SXM4-80GB, 81920"] * 4)
    gpu, count = environment.detect_gpus(None, None)
    assert gpu == "h100-80gb" and count.count == 4
    assert count.source == (
        "nvidia-smi: 4 x NVIDIA H100 80GB HBM3 of 8 GPUs (mixed boards: 4 x NVIDIA H100 80GB HBM3, "
        "4 x NVIDIA A100-SXM4-80GB; counting the h100-80gb boards)"
    )
    a100 = [Board("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb")] * 2
    assert count_boards(a100, "h100-80gb").source == (
        "nvidia-smi: 2 x NVIDIA A100-SXM4-80GB (not the h100-80gb planned for: give --gpus N for the machine it is meant for)"
    )
    assert environment.detect_gpus("h200-141gb", 2) == ("h200-141gb", GpuCount(2, "--gpus"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "x"], "must be auto or a positive integer, got 'x'"),
        (["--pp", "0"], "must be a positive integer, got 0"),
        (["--gpus", "0"], "must be a positive integer, got 0"),
    ],
)
def test_bad_sizes_are_usage_errors(tmp_path, machine, args, message):
    result = dry_run(tmp_path, *args)
    assert result.exit_code == 2 and message in result.output


def test_the_cpu_runtime_reads_auto_as_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(
        main,
        [
            *"build --target smollm2-135m --draft ngram --tp auto --pp auto --dry-run --engines-dir".split(),
            str(tmp_path / "e"),
        ],
    )
    assert result.exit_code == 0, result.output
