"""Long steps show life (elapsed time, progress, last line), a failed step quotes its log, and docker steps
run as the calling user with HOME in the work dir: real subprocesses, fake tools and a fake ``docker``."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fake_programs import write_program
from rich.console import Console

from specpipe import progress
from specpipe.trtllm import docker_run, release
from specpipe.trtllm.executor import Executor, StepFailedError, docker_prefix, run_step
from specpipe.trtllm.plan import WORK_DIRNAME, Step
from specpipe.trtllm.step_monitor import elapsed_text, log_tail, parse_progress

LAYERS = 30
INTERVAL_S = 0.2

# Writes a tqdm-like bar redrawn with \r, one layer per interval: 30 intervals stand for a 30-minute step.
FAKE_CONVERTER = textwrap.dedent(f"""\
    import os, sys, time
    out = sys.argv[sys.argv.index("--output_dir") + 1]
    os.makedirs(out, exist_ok=True)
    print("[TRT-LLM] [I] Loading weights from HF LLaMA...", flush=True)
    total = {LAYERS}
    for i in range(1, total + 1):
        time.sleep({INTERVAL_S})
        pct = 100 * i // total
        sys.stderr.write(f"\\rConverting layers: {{pct:3d}}%|{{'#' * (pct // 10):<10}}| {{i}}/{{total}} [00:{{i:02d}}<00:10,  5.00it/s]")
        sys.stderr.flush()
    sys.stderr.write("\\n")
    open(os.path.join(out, "rank0.safetensors"), "wb").write(b"weights")
    print("Total time of converting checkpoints: 00:30:00", flush=True)
""")

FAKE_FAILING = textwrap.dedent("""\
    import sys
    for i in range(30):
        print(f"line {i}")
    for i in range(1, 5):
        sys.stdout.write(f"\\rLoading checkpoint shards:  {25 * i}%|##   | {i}/4 [00:0{i}<00:03,  1.00it/s]")
    print()
    print("Traceback (most recent call last):")
    print("RuntimeError: [TensorRT-LLM][ERROR] out of memory")
    sys.exit(7)
""")

BEAT = re.compile(r"^  convert-target: (\d+)m(\d\d)s, (\d+)% \((\d+)/(\d+) layers\), last: (.*)$")


def step_for(tmp_path, script: str, runs_in: str = "host", name: str = "convert-target") -> Step:
    tool = tmp_path / "tool.py"
    tool.write_text(script)
    output = str(tmp_path / "engines" / WORK_DIRNAME / f"{name}-0123456789abcdef")
    return Step(
        name=name,
        argv=[sys.executable, str(tool), "--output_dir", output],
        output=output,
        inputs=[],
        runs_in=runs_in,
        hash="0123456789abcdef",
    )


def test_a_long_step_prints_a_heartbeat_per_interval_with_elapsed_time_progress_and_last_line(tmp_path):
    lines: list[str] = []
    stream = io.StringIO()  # not a terminal

    def log(text):
        stream.write(text + "\n")
        lines.append((time.monotonic(), text))

    step = step_for(tmp_path, FAKE_CONVERTER)
    executor = Executor("local", "/examples", log=log, heartbeat_s=INTERVAL_S)
    start = time.monotonic()
    assert run_step(step, executor, tmp_path / "logs") == "ran"
    wall = time.monotonic() - start

    heartbeats = [text for _, text in lines if re.match(r"^  convert-target: \d+m\d\ds, ", text)]
    assert len(heartbeats) >= max(LAYERS - 1, int(wall / INTERVAL_S) - 2), stream.getvalue()
    beats = [(t, BEAT.match(text)) for t, text in lines if BEAT.match(text)]  # those after the first bar
    assert len(beats) >= LAYERS - 5, stream.getvalue()
    elapsed = [int(m[1]) * 60 + int(m[2]) for _, m in beats]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= int(LAYERS * INTERVAL_S) - 1 and elapsed[-1] <= wall + 1
    done = [int(m[4]) for _, m in beats]
    assert done == sorted(done) and done[-1] >= LAYERS - 2 and all(int(m[5]) == LAYERS for _, m in beats)
    assert all(int(m[3]) == 100 * int(m[4]) // LAYERS for _, m in beats)
    assert all(m[6].startswith(f"Converting layers: {m[3]:>3}%|") and m[6].endswith("5.00it/s]") for _, m in beats)
    gaps = [b - a for (a, _), (b, _) in zip(beats, beats[1:])]
    assert sorted(gaps)[len(gaps) // 2] < 2 * INTERVAL_S  # one per interval (median gap), not a burst at the end
    assert lines[-1][1].startswith("  convert-target: finished after 0m0")
    assert (Path(step.output) / "rank0.safetensors").read_bytes() == b"weights"
    assert b"\r" in (tmp_path / "logs" / "convert-target-0123456789abcdef.log").read_bytes()  # the log is as written


def test_a_terminal_gets_one_live_line_instead_of_heartbeats(tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(progress, "console", Console(file=screen, force_terminal=True, width=200))
    lines: list[str] = []
    step = step_for(tmp_path, FAKE_CONVERTER.replace(f"total = {LAYERS}", "total = 8"))
    run_step(step, Executor("local", "/examples", log=lines.append, heartbeat_s=INTERVAL_S), tmp_path / "logs")
    shown = screen.getvalue()
    assert re.search(r"convert-target: 0m0\ds, \d+% \(\d/8 layers\), last: Converting layers:", shown), shown
    assert [line for line in lines if "convert-target: 0m" in line] == []  # no heartbeat lines in a terminal
    assert lines[-1].startswith("  convert-target: finished after")


def test_a_failing_step_names_its_exit_status_and_quotes_the_last_lines_of_its_log(tmp_path):
    step = step_for(tmp_path, FAKE_FAILING)
    with pytest.raises(StepFailedError) as info:
        run_step(step, Executor("local", "/examples", log=lambda _: None), tmp_path / "logs")
    message = str(info.value)
    log_path = tmp_path / "logs" / "convert-target-0123456789abcdef.log"
    first, *quoted = message.split("\n")
    assert first == f"step convert-target failed with exit status 7: see {log_path}"
    expected = [f"line {i}" for i in range(13, 30)] + [
        "Loading checkpoint shards:  100%|##   | 4/4 [00:04<00:03,  1.00it/s]",  # 4 redraws, one line
        "Traceback (most recent call last):",
        "RuntimeError: [TensorRT-LLM][ERROR] out of memory",
    ]
    assert quoted == ["  last 20 lines of the log:"] + [f"    {line}" for line in expected]
    assert not Path(step.output + ".partial").exists() and not Path(step.output).exists()


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Loading checkpoint shards:  50%|█████     | 2/4 [00:05<00:05,  2.51s/it]", "50% (2/4 shards)"),
        ("Rank [0] Loading weights: 100%|██████████| 4/4 [00:03<00:00,  1.20it/s]", "100% (4/4 shards)"),
        ("loading weight in each layer...:  37%|███▋      | 30/80 [00:12<00:20,  2.50it/s]", "37% (30/80 layers)"),
        ("Calibrating: 12%|█▏  | 64/512 [01:02<07:14,  1.03it/s]", "12% (64/512 batches)"),
        ("Fetching 12 files:  25%|██▌       | 3/12 [00:32<01:36, 10.7s/it]", "25% (3/12)"),
        ("370it [00:28, 12.95it/s]", "370 it"),
        ("[TRT-LLM] [I] building layer 12/32", "38% (12/32 layers)"),
        ("converted 3/4 shards", "75% (3/4 shards)"),
    ],
)
def test_progress_is_read_from_what_the_tools_print(line, expected):
    assert parse_progress(line).text() == expected


@pytest.mark.parametrize(
    "line",
    [
        "[TRT-LLM] [I] Total time of building all engines: 00:00:41",
        "[TRT] [I] [MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 1234, GPU 80%",
        "Total time of converting checkpoints: 00:00:31",
        "layer 9/3 of something that is no fraction",
    ],
)
def test_log_lines_without_progress_report_none(line):
    assert parse_progress(line) is None


def test_elapsed_time_reads_in_minutes_then_hours():
    assert [elapsed_text(s) for s in (0.4, 59, 720, 3723.9)] == ["0m00s", "0m59s", "12m00s", "1h02m03s"]


def test_the_log_tail_drops_escape_sequences_and_blank_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("$ the command\n\x1b[Aa\r\x1b[Ab\n\n   \n  File x.py, line 3  \r\r\n")
    assert log_tail(log) == ["b", "  File x.py, line 3"]
    assert log_tail(log, 1) == ["  File x.py, line 3"]
    assert log_tail(tmp_path / "missing.log") == []


def test_docker_prefix_is_the_executed_prefix_with_the_calling_user_and_a_home_in_the_work_dir(tmp_path, monkeypatch):
    root = tmp_path / "engines"
    step = Step(
        name="build-target",
        argv=["trtllm-build", "--output_dir", "x"],
        output="x",
        inputs=[],
        runs_in="trtllm",
        hash="0" * 16,
    )
    executor = Executor("docker", release.CONTAINER_EXAMPLES_ROOT, root=root)
    for token in (None, "secret"):
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        prefix = docker_prefix(root)
        command = executor.command(step, step.argv)
        assert command == [*docker_run.docker_run_prefix(root, env_passthrough=()), *step.argv]
        user = command[command.index("--user") + 1]
        assert user == f"{os.getuid()}:{os.getgid()}"
        assert (
            f"HOME={root}/{WORK_DIRNAME}/home" in command
            and command[command.index(f"HOME={root}/{WORK_DIRNAME}/home") - 1] == "-e"
        )
        assert "HF_TOKEN" not in command  # trtllm-build reads local folders only
        quantize = ["python3", f"{release.CONTAINER_EXAMPLES_ROOT}/{release.QUANTIZE}", "--output_dir", "x"]
        calibrating = executor.command(replace(step, argv=quantize), quantize)  # its calibration set is on the Hub
        assert calibrating == [*prefix, *quantize]
        assert ("HF_TOKEN" in calibrating) == bool(token) and "secret" not in " ".join(calibrating)
        assert prefix[-1] == release.CONTAINER_IMAGE
    host_step = Step(
        name="download-target", argv=["hf", "download", "r"], output="y", inputs=[], runs_in="host", hash="1" * 16
    )
    assert executor.command(host_step, host_step.argv) == host_step.argv
    assert docker_run.user_spec(1000, 1001) == "1000:1001"


FAKE_DOCKER = textwrap.dedent("""\
    #!{python}
    # Stand-in for `docker run`: records its argv, then runs the payload as docker does: as --user UID:GID
    # (the container's root without it), in -w, with the container's environment (HOME=/root) plus -e.
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
        f.write(json.dumps(["docker", *args]) + "\\n")
    assert args[0] == "run", args
    env = {{"PATH": os.environ["PATH"], "HOME": os.environ["FAKE_CONTAINER_HOME"]}}
    user, workdir, i = None, "/", 1
    while args[i].startswith("-"):
        flag = args[i]
        if flag in ("--rm",) or "=" in flag:
            i += 1
            continue
        value, i = args[i + 1], i + 2
        if flag == "-e":
            name, sep, val = value.partition("=")
            env[name] = val if sep else os.environ.get(name, "")
        elif flag == "--user":
            user = value
        elif flag == "-w":
            workdir = value
        elif flag == "-v":
            source, target = value.split(":")[:2]
            assert source == target, value
    payload = args[i + 1:]
    uid, gid = (int(part) for part in user.split(":")) if user else (0, 0)
    if os.getuid() == 0:
        os.setgid(gid)
        os.setuid(uid)
    elif (uid, gid) != (os.getuid(), os.getgid()):
        sys.exit("docker: this stand-in runs payloads as the calling user only")
    os.chdir(workdir)
    os.execvpe(payload[0], payload, env)
""")

# Writes what the real tools write besides their output: a cache under HOME, a timing cache in the cwd.
FAKE_BUILD = textwrap.dedent("""\
    import os, sys
    out = sys.argv[sys.argv.index("--output_dir") + 1]
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "rank0.engine"), "wb").write(b"engine")
    cache = os.path.join(os.environ["HOME"], ".cache", "torch_extensions")
    os.makedirs(cache, exist_ok=True)
    open(os.path.join(cache, "built.so"), "wb").write(b"so")
    open("model.cache", "wb").write(b"timings")
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:01")
""")


def test_a_docker_step_runs_as_the_calling_user_and_its_marker_is_written(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_program(bin_dir, "docker", FAKE_DOCKER.format(python=sys.executable))
    container_home = tmp_path / "container-root"
    container_home.mkdir()
    calls = tmp_path / "docker.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(calls))
    monkeypatch.setenv("FAKE_CONTAINER_HOME", str(container_home))
    root = (tmp_path / "engines").absolute()
    step = step_for(tmp_path, FAKE_BUILD, runs_in="trtllm", name="build-target")
    executor = Executor("docker", release.CONTAINER_EXAMPLES_ROOT, root=root, log=lambda _: None)

    assert run_step(step, executor, root / WORK_DIRNAME / "logs") == "ran"
    argv = json.loads(calls.read_text().splitlines()[0])
    assert argv[: len(docker_prefix(root))] == docker_prefix(root)
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    marker = json.loads((Path(step.output) / ".specpipe-step.json").read_text())
    assert marker["hash"] == step.hash and marker["step"] == "build-target"
    home = root / WORK_DIRNAME / "home"
    written = [
        Path(step.output) / "rank0.engine",
        home / ".cache" / "torch_extensions" / "built.so",
        root / "model.cache",
    ]
    assert [p.read_bytes() for p in written] == [b"engine", b"so", b"timings"]
    assert {p.stat().st_uid for p in written} == {os.getuid()} and {p.stat().st_gid for p in written} == {os.getgid()}
    assert list(container_home.iterdir()) == []  # nothing went to the container's own HOME
    assert run_step(step, executor, root / WORK_DIRNAME / "logs") == "cached"


SIGNAL_CHILD = textwrap.dedent("""\
    import signal, sys, time
    from pathlib import Path
    def got(signum, frame):
        Path(sys.argv[1]).write_text(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGINT, got)
    signal.signal(signal.SIGTERM, got)
    Path(sys.argv[1] + ".ready").write_text("")
    time.sleep(60)
""")

MONITOR = textwrap.dedent("""\
    import sys
    from specpipe.trtllm.step_monitor import run_monitored
    with open(sys.argv[2], "w") as log:
        try:
            run_monitored([sys.executable, "-c", sys.argv[1], sys.argv[3]], log, label="step", report=print,
                          terminal=False)
        except KeyboardInterrupt:
            sys.exit(130)
""")


def test_a_sigint_to_specpipe_alone_reaches_the_step_as_sigint(tmp_path):
    """Not to the process group, as ``kill -INT PID`` does: the step (``docker run``, which passes it on)
    gets SIGINT too, at once, and specpipe ends with 130."""
    seen = tmp_path / "seen"
    monitor = subprocess.Popen(
        [sys.executable, "-c", MONITOR, SIGNAL_CHILD, str(tmp_path / "log"), str(seen)], start_new_session=True
    )
    deadline = time.monotonic() + 60
    while not Path(f"{seen}.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    monitor.send_signal(signal.SIGINT)
    assert monitor.wait(30) == 130
    assert seen.read_text() == "SIGINT" and time.monotonic() - start < 4
