"""Run a plan's steps: locally (``tensorrt_llm`` importable) or in the TensorRT-LLM Triton container.

* ``local``: each step's argv runs as is; the examples root comes from ``$SPECPIPE_TRTLLM_EXAMPLES``
  (a TensorRT-LLM checkout's ``examples/``, or ``/app/examples`` inside the container).
* ``docker``: steps that need TensorRT-LLM run as ``docker run --gpus all --rm --ipc=host --ulimit
  memlock=-1 --ulimit stack=67108864 --user UID:GID -e HOME=ROOT/.trtllm-work/home -v ROOT:ROOT -w ROOT
  [-e HF_TOKEN] IMAGE <argv>`` (the flags the TensorRT-LLM/Triton docs use for these containers, as the
  calling user: :mod:`specpipe.trtllm.docker_run`; ``HF_TOKEN`` only for a step that reads from the Hub,
  :func:`specpipe.trtllm.docker_run.reads_hub`), with the engines root mounted at the same path so
  every path in the argv is valid inside; downloads run on the host.

Host steps need no program on ``PATH``: downloads (shown as the equivalent ``hf download`` command) run
through huggingface_hub's Python API into the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``; resumable
across runs: :mod:`specpipe.models.hub_download`) with the same repository, revision and ``--exclude``
patterns, and the step's folder is filled with hard links to (across filesystems: copies of) the cache's
files; a failed download keeps what it fetched in the cache and says why in one line (the traceback
stays in the step's log); host
``python3`` steps run with the interpreter running specpipe (``sys.executable``), so a virtual
environment need not be activated.

Each step writes into ``<output>.partial`` (its output path in the argv is replaced), logs to
``<work>/logs/<step>-<hash>.log`` and is moved into place only when it succeeds, with a marker
holding its hash: a rerun skips finished steps and an interrupted build resumes at the first
unfinished one. While a step runs, its status (elapsed time, the tool's progress, the log's last line)
is shown by :mod:`specpipe.trtllm.step_monitor`; a failed step's error quotes the log's last lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specpipe.errors import SpecpipeError
from specpipe.models import hub_download
from specpipe.models.hub_access import HubSource, describe_hub_error
from specpipe.trtllm import release, step_monitor
from specpipe.trtllm.docker_errors import diagnose_log
from specpipe.trtllm.docker_run import docker_run_prefix, prepare_home, reads_hub
from specpipe.trtllm.plan import Plan, Step
from specpipe.trtllm.step_monitor import log_tail, run_monitored

MARKER = ".specpipe-step.json"
FAILURE_CHARS = 400
"""Characters of a tool's failure line quoted in a step's error (cut at a word)."""


class NoExecutorError(SpecpipeError):
    """Neither executor can run TensorRT-LLM here."""


class StepFailedError(SpecpipeError):
    """A step exited non-zero or produced no output."""


def trtllm_importable() -> bool:
    """Whether ``tensorrt_llm`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("tensorrt_llm") is not None


def local_examples_root() -> str | None:
    """``$SPECPIPE_TRTLLM_EXAMPLES``, else ``/app/examples`` when it exists (inside the container)."""
    env = os.environ.get(release.EXAMPLES_ENV)
    if env:
        return env
    return release.CONTAINER_EXAMPLES_ROOT if Path(release.CONTAINER_EXAMPLES_ROOT).is_dir() else None


@dataclass
class Executor:
    """Runs steps; ``name`` is ``local`` or ``docker``; ``root`` is the mounted engines root (docker)."""

    name: str
    examples_root: str
    root: Path | None = None
    image: str = release.CONTAINER_IMAGE
    env_passthrough: tuple[str, ...] = ("HF_TOKEN",)
    log: Callable[[str], None] = field(default=print)
    heartbeat_s: float = step_monitor.HEARTBEAT_S
    """Seconds between two status lines of a running step when progress is not a terminal."""

    def in_container(self, step: Step) -> bool:
        """Whether ``step`` runs in the TensorRT-LLM container (docker executor, a ``trtllm`` step)."""
        return self.name == "docker" and step.runs_in == "trtllm"

    def command(self, step: Step, argv: list[str]) -> list[str]:
        """The vector actually executed for ``step`` (``argv`` with its output redirected): in the container,
        :func:`specpipe.trtllm.docker_run.docker_run_prefix` (the calling user, ``HOME`` in the work dir)."""
        if self.in_container(step):
            passed = self.env_passthrough if reads_hub(argv) else ()
            return [*docker_run_prefix(self.root, image=self.image, env_passthrough=passed), *argv]
        return argv

    def where(self, step: Step) -> str:
        """Where ``step`` runs, as shown: ``docker`` (in the container), ``local`` or ``host``."""
        return self.name if step.runs_in == "trtllm" else "host"


def docker_prefix(root: Path) -> list[str]:
    """The docker wrapper, for display: the prefix :meth:`Executor.command` puts before a step's argv."""
    return docker_run_prefix(root, image=release.CONTAINER_IMAGE, env_passthrough=Executor.env_passthrough)


def choose_executor(requested: str, *, importable: Callable[[], bool] = trtllm_importable) -> tuple[str | None, str]:
    """Pick ``local``/``docker`` for ``--executor requested`` (``auto`` prefers local).

    Returns ``(name or None, reason)``; ``None`` when the requested executor (or, for ``auto``,
    neither) can run here, with the reason.
    """
    has_local = importable() and local_examples_root() is not None
    has_docker = shutil.which("docker") is not None
    local_why = (
        "tensorrt_llm is not importable here"
        if not importable()
        else f"${release.EXAMPLES_ENV} is not set (TensorRT-LLM examples/ directory)"
    )
    if requested == "local":
        return ("local", "") if has_local else (None, local_why)
    if requested == "docker":
        return ("docker", "") if has_docker else (None, "docker is not on PATH")
    if has_local:
        return "local", ""
    if has_docker:
        return "docker", ""
    return None, f"{local_why} and docker is not on PATH"


def snapshot_download(repo_id: str, revision: str, ignore_patterns: list[str]) -> str:
    """Fill the Hugging Face cache with ``repo_id`` at ``revision`` (files matching ``ignore_patterns``
    left out), resuming what an earlier run left; returns the cache's snapshot folder
    (:func:`specpipe.models.hub_download.download_snapshot`; huggingface_hub is imported only then)."""
    return str(hub_download.download_snapshot(HubSource(repo_id, revision, tuple(ignore_patterns))))


def download_arguments(argv: list[str]) -> dict[str, object]:
    """``repo_id``, ``revision`` and ``ignore_patterns`` of a planned ``hf download REPO --revision R
    --exclude P`` argv (the plan's display form; the flags of ``hf download``, huggingface_hub 2.4.0
    ``cli/download.py``).

    Raises:
        ValueError: not a download argv, or a flag this executor does not run (a defect of the plan).
    """
    if argv[:2] != ["hf", "download"]:
        raise ValueError(f"not a download: {argv[:2]}")
    options: dict[str, object] = {"repo_id": argv[2], "revision": "main", "ignore_patterns": []}
    i = 3
    while i < len(argv):
        flag, value = argv[i], argv[i + 1]
        if flag == "--revision":
            options["revision"] = value
        elif flag == "--exclude":
            options["ignore_patterns"].append(value)
        else:
            raise ValueError(f"unknown download flag {flag}")
        i += 2
    return options


def run_download(argv: list[str], destination: Path, log) -> int:
    """Run a download step: the repository into the Hugging Face cache (:func:`snapshot_download`), then
    its kept files hard-linked into ``destination`` (must not exist); returns 0, or 1 with an
    ``error: <cause and fix>`` line in ``log`` (what was fetched stays in the cache for the next run)."""
    options = download_arguments(argv)
    repo, revision = str(options["repo_id"]), str(options["revision"])
    try:
        snapshot = snapshot_download(**options)
        placed = hub_download.place(Path(snapshot), destination, options["ignore_patterns"])
    except Exception as exc:  # network, authorisation (gated repositories), disk
        resume = (
            ""
            if is_permanent(exc)
            else " (what was downloaded stays in the Hugging Face cache: run the build again to resume)"
        )
        log.write(f"error: download of {repo}@{revision} failed: {describe_hub_error(exc, repo, revision)}{resume}\n")
        log.write("".join(traceback.format_exception(exc)))
        return 1
    log.write(f"{len(placed)} files of {repo}@{revision} linked from {snapshot} into {destination}\n")
    return 0


def is_permanent(exc: BaseException) -> bool:
    """Whether a download failed for a cause a rerun does not cure (refused access, a revision or
    repository missing, offline without the files, a cache it cannot write): no "run again" hint."""
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(
        exc, (SpecpipeError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError, PermissionError)
    ):
        return True
    return getattr(getattr(exc, "response", None), "status_code", None) in (401, 403, 404)


def failure_line(log_path: Path) -> str | None:
    """The first line of a step's log that says why it failed: a first-contact ``[FAILED] ...`` line (e.g.
    both TensorRT-LLM releases of a version mismatch, shortened at a word to :data:`FAILURE_CHARS`) or an
    ``error: ...`` line of specpipe's own steps (whole: it names the cause and the fix)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()[1:]  # line 0: the command
    except OSError:
        return None
    found = next((line.strip() for line in lines if line.startswith(("[FAILED]", "error:"))), None)
    if found is None or found.startswith("error:"):
        return found.removeprefix("error: ") if found else None
    return textwrap.shorten(found, FAILURE_CHARS, placeholder=" ...")


def step_done(step: Step) -> bool:
    """Whether ``step`` finished before with the same hash."""
    marker = Path(step.output) / MARKER
    try:
        return json.loads(marker.read_text()).get("hash") == step.hash
    except (OSError, ValueError):
        return False


def run_step(step: Step, executor: Executor, log_dir: Path, *, force: bool = False) -> str:
    """Run one step unless done; returns ``"cached"`` or ``"ran"``.

    Raises:
        StepFailedError: non-zero exit or no output; the message names the log file.
    """
    if not force and step_done(step):
        executor.log(f"  {step.name}: done earlier ({step.hash}), skipped")
        return "cached"
    final, partial = Path(step.output), Path(step.output + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    argv = [token.replace(step.output, str(partial)) for token in step.argv]
    command = executor.command(step, argv)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{step.name}-{step.hash}.log"
    executor.log(f"  {step.name}: running ({executor.where(step)}), log {log_path}")
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        try:
            if step.runs_in == "host" and command[:2] == ["hf", "download"]:
                code = run_download(command, partial, log)
            else:
                if step.runs_in == "host" and command[0] == "python3":
                    command = [sys.executable, *command[1:]]
                if executor.in_container(step):
                    prepare_home(executor.root)
                code = run_monitored(
                    command, log, label=step.name, report=executor.log, interval_s=executor.heartbeat_s
                )
        except FileNotFoundError as exc:
            raise StepFailedError(
                f"step {step.name}: program {command[0]!r} not found ({exc}): install it or use another --executor"
            ) from exc
    if code != 0:
        shutil.rmtree(partial, ignore_errors=True)
        in_docker = executor.in_container(step)
        reason = (
            diagnose_log(log_path, code, image=executor.image, program=argv[0]) if in_docker else None
        ) or failure_line(log_path)
        own_error = reason is not None and not reason.startswith("[FAILED]")  # its traceback stays in the log
        tail = [] if own_error else log_tail(log_path)
        quoted = f"\n  last {len(tail)} lines of the log:\n" + "\n".join(f"    {line}" for line in tail) if tail else ""
        raise StepFailedError(
            f"step {step.name} failed with exit status {code}: {reason + '; ' if reason else ''}see {log_path}{quoted}"
        )
    if not partial.is_dir():
        raise StepFailedError(f"step {step.name} exited 0 but wrote nothing to its output directory: see {log_path}")
    (partial / MARKER).write_text(json.dumps({"step": step.name, "hash": step.hash, "argv": step.argv}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return "ran"


def run_plan(plan: Plan, executor: Executor, *, force: bool = False) -> dict[str, str]:
    """Run every step in order; returns ``{step: "ran" | "cached"}``.

    Raises:
        StepFailedError: the first failing step (later steps do not run; finished ones stay cached).
    """
    log_dir = plan.work_dir / "logs"
    return {step.name: run_step(step, executor, log_dir, force=force) for step in plan.steps}
