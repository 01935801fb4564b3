"""Executors, with stand-in programs on PATH that record their argv and write the expected outputs."""

import json
import os
import re
import sys
import textwrap

import pytest
from click.testing import CliRunner
from fake_programs import write_program

from specpipe.build_request import BuildRequest
from specpipe.cli import main
from specpipe.trtllm import build as trtllm_build
from specpipe.trtllm import executor, release
from specpipe.trtllm.build import build_trtllm
from specpipe.trtllm.executor import NoExecutorError, StepFailedError

STANDIN = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    from pathlib import Path
    argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\\n")
    inner = argv
    if argv[0] == "docker":
        inner = argv[argv.index("{image}") + 1:]
    if os.environ.get("STANDIN_FAIL") and os.environ["STANDIN_FAIL"] in " ".join(inner):
        sys.exit(3)
    if "--report" in inner:
        Path(inner[inner.index("--report") + 1]).parent.mkdir(parents=True, exist_ok=True)
    if "--output_dir" in inner:
        out = Path(inner[inner.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({{"made_by": inner[:2]}}))
        (out / "rank0.engine").write_bytes(b"engine")
""")


@pytest.fixture
def standins(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("trtllm-build", "python3", "docker"):
        write_program(bin_dir, name, STANDIN.format(python=sys.executable, image=release.CONTAINER_IMAGE))
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(release.EXAMPLES_ENV, str(tmp_path / "trtllm" / "examples"))

    def snapshot_download(repo_id, revision, ignore_patterns):
        """Stand-in for the Hugging Face cache download (no network): records the call as the planned argv
        and returns a snapshot folder (tests/trtllm/test_trtllm_downloads.py runs the real one)."""
        with open(log, "a") as f:
            f.write(
                json.dumps(
                    [
                        "hf",
                        "download",
                        repo_id,
                        "--revision",
                        revision,
                        *[a for p in ignore_patterns for a in ("--exclude", p)],
                    ]
                )
                + "\n"
            )
        if os.environ.get("STANDIN_FAIL") and os.environ["STANDIN_FAIL"] in repo_id:
            raise OSError("stand-in download failure")
        snapshot = tmp_path / "hf-cache" / repo_id.replace("/", "--") / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps({"made_by": ["hf", "download"]}))
        (snapshot / "tokenizer.json").write_text("{}")
        return str(snapshot)

    monkeypatch.setattr(executor, "snapshot_download", snapshot_download)
    monkeypatch.setattr(trtllm_build, "check_cached", lambda source: tmp_path / "hf-cache" / "0123456789abcdef")
    monkeypatch.setenv("PATH", str(bin_dir))  # no `hf` next to this: the API is used
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def request(tmp_path, **kw):
    base = dict(
        target="llama3.1-8b",
        draft="llama3.2-1b",
        runtime="trtllm",
        gpu="h100-80gb",
        quantization="fp8",
        engines_dir=tmp_path / "engines",
        executor="local",
    )
    base.update(kw)
    return BuildRequest(**base)


def test_local_build_runs_every_step_then_skips_them(tmp_path, standins):
    engine = build_trtllm(request(tmp_path), importable=lambda: True)
    calls = standins()
    assert [c[0] for c in calls] == ["python3", "hf", "hf", "python3", "python3", "trtllm-build", "trtllm-build"]
    first = calls.pop(0)  # the first-contact check, with its script and checks document written beside it
    assert first[1].endswith(".trtllm-work/first-contact/first_contact.py") and os.path.isfile(first[1])
    checks = json.loads(open(first[first.index("--input") + 1]).read())
    assert checks["pin"] == "1.2.1" and [a["step"] for a in checks["argvs"]] == [
        "convert-target",
        "convert-draft",
        "build-target",
        "build-draft",
    ]
    examples = str(tmp_path / "trtllm" / "examples")
    assert calls[2][1] == f"{examples}/quantization/quantize.py" and "--qformat" in calls[2]
    assert all(".partial" in c[c.index("--output_dir") + 1] for c in calls if "--output_dir" in c)
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["trtllm"]["version"] == "1.2.1"
    assert manifest["trtllm"]["container_image"] == release.CONTAINER_IMAGE
    assert [s["name"] for s in manifest["trtllm"]["steps"]] == [
        "first-contact",
        "download-target",
        "download-draft",
        "convert-target",
        "convert-draft",
        "build-target",
        "build-draft",
    ]
    assert all(
        len(s["hash"]) == 16 and s["argv"][0] in ("hf", "python3", "trtllm-build") for s in manifest["trtllm"]["steps"]
    )
    assert manifest["speculative"] == {"method": "draft-model", "max_draft_len": 4, "flavour": "causal-lm"}
    assert (engine / "target" / "rank0.engine").read_bytes() == b"engine"
    assert (engine / "draft" / "rank0.engine").is_file() and (engine / "tokenizer" / "tokenizer.json").is_file()
    logs = list((tmp_path / "engines" / ".trtllm-work" / "logs").glob("*.log"))
    assert len(logs) == 7

    build_trtllm(request(tmp_path), importable=lambda: True)  # unchanged: nothing runs
    assert len(standins()) == 7
    build_trtllm(request(tmp_path, max_batch_size=16), importable=lambda: True)  # the engine builds change (and
    assert [c[0] for c in standins()[7:]] == ["python3", "trtllm-build", "trtllm-build"]  # the checks of their argv)


def test_interrupted_build_resumes_and_writes_nothing_half_done(tmp_path, standins, monkeypatch):
    monkeypatch.setenv("STANDIN_FAIL", "trtllm-build")
    with pytest.raises(
        StepFailedError, match=r"step build-target failed with exit status 3: see .*build-target-.*\.log"
    ):
        build_trtllm(request(tmp_path), importable=lambda: True)
    engines = tmp_path / "engines"
    assert sorted(p.name for p in engines.iterdir()) == [".trtllm-work"]
    assert not list((engines / ".trtllm-work").glob("*.partial"))
    monkeypatch.delenv("STANDIN_FAIL")
    build_trtllm(request(tmp_path), importable=lambda: True)
    assert [c[0] for c in standins()[6:]] == ["trtllm-build", "trtllm-build"]  # 5 steps ran + 1 failed before
    assert (engines / "llama3.1-8b-llama3.2-1b" / "manifest.json").is_file()


def test_docker_executor_wraps_trtllm_steps(tmp_path, standins):
    build_trtllm(request(tmp_path, executor="docker", draft="lookahead", quantization="bf16"), importable=lambda: False)
    calls = standins()
    assert [c[0] for c in calls] == ["docker", "hf", "docker", "docker"]
    calls.pop(0)  # the first-contact check runs in the pinned container too
    root = str((tmp_path / "engines").absolute())
    prefix = [
        *"docker run --gpus all --rm --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 --user".split(),
        f"{os.getuid()}:{os.getgid()}",
        "-e",
        f"HOME={root}/.trtllm-work/home",
        "-v",
        f"{root}:{root}",
        "-w",
        root,
        release.CONTAINER_IMAGE,
    ]
    assert calls[1][: len(prefix)] == prefix == executor.docker_prefix(root)
    assert (tmp_path / "engines" / ".trtllm-work" / "home").is_dir()  # created by the host, as the calling user
    inner = calls[1][len(prefix) :]
    assert inner[:2] == ["python3", "/app/examples/models/core/llama/convert_checkpoint.py"]
    build = calls[2][len(prefix) :]
    assert build[0] == "trtllm-build" and build[build.index("--speculative_decoding_mode") + 1] == "lookahead_decoding"


def test_no_executor_prints_the_plan_then_says_how_to_get_one(tmp_path, standins, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        NoExecutorError, match=r"tensorrt_llm is not importable here and docker is not on PATH\): install docker"
    ):
        build_trtllm(request(tmp_path, executor="auto"), importable=lambda: False)
    assert not (tmp_path / "engines").exists()


def test_real_build_needs_gpu_and_a_fitting_plan(tmp_path, standins):
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            *"build --target llama3-8b --draft lookahead --runtime trtllm --engines-dir".split(),
            str(tmp_path / "e"),
            "--executor",
            "docker",
        ],
    )
    assert result.exit_code == 1 and "name the GPU with --gpu" in result.output
    result = runner.invoke(
        main,
        [
            *"build --target llama3-70b --draft none --runtime trtllm --gpu a100-80gb --tp 1 --pp 1 --engines-dir".split(),
            str(tmp_path / "e"),
            "--executor",
            "docker",
        ],
    )
    assert result.exit_code == 1 and "a100-80gb has 80.0 GiB" in result.output and "--tp 4" in result.output
    # auto parallelism on a single GPU: nothing fits, and the error asks for more GPUs, saying what auto then picks
    result = runner.invoke(
        main,
        [
            *"build --target llama3-70b --draft none --runtime trtllm --gpu a100-80gb --gpus 1 --engines-dir".split(),
            str(tmp_path / "e"),
            "--executor",
            "docker",
        ],
    )
    assert result.exit_code == 1 and re.search(r"try --gpus \d+ \(auto picks TP \d+ x PP \d+\)", result.output), (
        result.output
    )
    assert standins() == [] and not (tmp_path / "e").exists()


def test_read_only_output_root(tmp_path, standins):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(
        main,
        [
            *"build --target llama3-8b --draft lookahead --runtime trtllm --gpu h100-80gb --engines-dir".split(),
            str(blocker / "engines"),
            "--executor",
            "docker",
        ],
    )
    assert result.exit_code == 1
    assert "cannot write to engines directory" in result.output and "--engines-dir" in result.output
    assert standins() == []


def test_llmapi_build_downloads_and_records_the_speculative_config(tmp_path, standins):
    engine = build_trtllm(
        request(tmp_path, runtime="trtllm-llmapi", draft="eagle", quantization="auto", executor="auto"),
        importable=lambda: False,
    )
    calls = standins()
    assert calls[0][:2] == ["docker", "run"] and "--input" in calls[0]  # first contact, in the pinned container
    assert [c[:3] for c in calls[1:]] == [
        ["hf", "download", "meta-llama/Llama-3.1-8B-Instruct"],
        ["hf", "download", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"],
    ]
    checks = json.loads(open(calls[0][calls[0].index("--input") + 1]).read())
    assert "decoding_type: Eagle3" in checks["model_yaml"] and checks["backends"] == ["python"]
    manifest = json.loads((engine / "manifest.json").read_text())
    llmapi = manifest["trtllm"]["llmapi"]
    assert manifest["runtime"] == "trtllm-llmapi" and llmapi["backend"] == "pytorch"
    assert (
        llmapi["speculative_config"]["decoding_type"] == "Eagle3" and llmapi["speculative_config"]["max_draft_len"] == 3
    )
    assert llmapi["speculative_config"]["speculative_model"] == manifest["draft"]["path"]
    assert (tmp_path / "engines" / ".trtllm-work").is_dir() and sorted(p.name for p in engine.iterdir()) == [
        "manifest.json"
    ]


def test_eagle_build_prepares_the_head_for_real_before_the_converter(tmp_path, standins):
    """The prepare-eagle-head host step runs specpipe's module with this interpreter (torch, for real) on a
    head without fc.bias; the stand-in converter is then given the prepared directory."""
    import torch
    from safetensors.torch import load_file
    from trtllm_fakes import causal_lm, eagle1_head

    target = causal_lm(tmp_path / "tiny-target", hidden=64, layers=2, heads=4, kv=2, vocab=256, positions=16384)
    head = eagle1_head(tmp_path / "head", hidden=64, heads=4, kv=2, vocab=256, bias=False)
    engine = build_trtllm(
        request(
            tmp_path,
            target=str(target),
            draft="eagle",
            draft_model=str(head),
            quantization="bf16",
            choices="[[0], [0, 0], [1]]",
        ),
        importable=lambda: True,
    )
    calls = standins()
    assert [c[0] for c in calls] == [
        "python3",
        "python3",
        "trtllm-build",
    ]  # first contact, convert, build (prepare: host)
    convert = calls[1]
    prepared = convert[convert.index("--eagle_model_dir") + 1]
    assert prepared.endswith(tuple("0123456789abcdef")) and "prepare-eagle-head-" in prepared
    state = load_file(os.path.join(prepared, "model.safetensors"))  # what the 1.2 converter reads first
    assert state["fc.bias"].shape == (64,) and not state["fc.bias"].any() and state["fc.bias"].dtype == torch.float16
    steps = json.loads((engine / "manifest.json").read_text())["trtllm"]["steps"]
    assert [s["name"] for s in steps] == ["first-contact", "prepare-eagle-head", "convert-target", "build-target"]


def test_a_container_of_another_release_stops_the_build_before_any_download_naming_both(
    tmp_path, standins, monkeypatch
):
    """The real first-contact script against a stand-in tensorrt_llm 1.1: the build's error line names both
    releases and the fix (not only the log), and nothing was downloaded."""
    from fake_trtllm import write_fake

    site, examples = write_fake(tmp_path / "fake", "1.1")
    python3 = tmp_path / "bin" / "python3"
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv(release.EXAMPLES_ENV, str(examples))
    with pytest.raises(StepFailedError) as info:
        build_trtllm(request(tmp_path, draft="lookahead", quantization="bf16"), importable=lambda: True)
    message = str(info.value)
    assert message.startswith(
        "step first-contact failed with exit status 1: [FAILED] tensorrt_llm 1.1.0: this "
        "TensorRT-LLM is 1.1.0, the plan is pinned to 1.2.1: use " + release.CONTAINER_IMAGE + "; see "
    )
    first, *tail = message.split("\n")  # the reason on the first line, then the log's last lines
    assert first.endswith(".log") and tail[0] == f"  last {len(tail) - 1} lines of the log:"
    assert "    [FAILED] tensorrt_llm 1.1.0: this TensorRT-LLM is 1.1.0" in "\n".join(tail)
    assert standins() == []  # no download ran
    assert not (tmp_path / "engines" / "llama3.1-8b-lookahead").exists()


def test_ctrl_c_during_a_step_exits_130_saying_how_to_resume(tmp_path, standins, monkeypatch):
    def interrupted_download(repo_id, revision, ignore_patterns):
        raise KeyboardInterrupt

    monkeypatch.setattr(executor, "snapshot_download", interrupted_download)
    result = CliRunner().invoke(
        main,
        [
            *"build --target llama3-8b --draft lookahead --runtime trtllm --gpu h100-80gb --engines-dir".split(),
            str(tmp_path / "e"),
            "--executor",
            "docker",
        ],
    )
    assert result.exit_code == 130, result.output
    assert (
        "interrupted: run the same command again to resume: finished steps and downloaded files are kept"
        in result.output
    ) and "Aborted!" not in result.output
    assert re.search(r"  first-contact: running \(docker\), log ", result.output)
    assert re.search(r"  download-target: running \(host\), log ", result.output)  # not in the container
    assert not list((tmp_path / "e" / ".trtllm-work").glob("download-target-*"))  # nothing half-written kept
