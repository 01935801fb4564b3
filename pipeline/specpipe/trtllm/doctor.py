"""Host side of the first-contact check (:mod:`specpipe.trtllm.first_contact`): what it checks, and how
it is run, as the first step of every TensorRT-LLM plan or on its own (``specpipe doctor``).

* :func:`check_input`: the checks document of a plan: the pinned release, every TensorRT-LLM argv
  of the plan, the LLM API ``model.yaml`` it will write, the Triton backends its repository names.
* :func:`add_first_contact_step`: the plan's first step, ``python3 <work>/first-contact/first_contact.py
  --input <work>/first-contact/<hash>.json --report <out>/report.txt`` (runs where TensorRT-LLM runs:
  in the pinned container with the docker executor, so a container of another release is refused
  before anything is downloaded).
* :func:`materialize`: writes the script and the document into the work directory (``build`` does it
  just before running the steps; dry runs write nothing).
* :func:`invocation` / :func:`doctor`: the stand-alone run, in a container image (``docker run`` of the
  image with the files mounted read-only, ``--gpus all`` when this machine has a GPU) or locally
  (``python -m specpipe.trtllm.first_contact``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from specpipe.errors import SpecpipeError
from specpipe.speculative import Runtime
from specpipe.trtllm import docker_errors, first_contact, image_reference, llmapi_args, release
from specpipe.trtllm.plan import Plan, StepBuilder

STEP = "first-contact"
SCRIPT = Path(first_contact.__file__)
#: Triton backends each flow's repository names (engine flow: tensorrtllm + python for the pre/post
#: processing and BLS models; LLM API flow: python).
BACKENDS = {Runtime.TRTLLM.value: ["tensorrtllm", "python"], Runtime.TRTLLM_LLMAPI.value: ["python"]}


MODEL_YAML_CHECK = "model.yaml (LLM API arguments)"


def _add_model_yaml(doc: dict[str, Any], plan_doc: dict[str, Any]) -> None:
    """Put the very model.yaml the repository writer will package (THE builder,
    :func:`specpipe.trtllm.llmapi_args.model_yaml`, on the plan's facts) into ``doc``; where it cannot be
    made yet (no GPU named, so no KV-cache fraction), say why under ``not_checked``."""
    try:
        content = llmapi_args.model_yaml(**llmapi_args.plan_facts(plan_doc))
    except SpecpipeError as exc:
        doc["not_checked"] = [{"what": MODEL_YAML_CHECK, "why": str(exc)}]
        return
    doc["model_yaml"] = yaml.safe_dump(content, sort_keys=False, default_flow_style=False)


def check_input(plan: Plan, steps=None) -> dict[str, Any]:
    """The checks document of ``plan`` (``steps``: the steps to check, default all but the check itself).

    For the LLM API flow it holds the model.yaml that ``specpipe package`` will write for this plan
    (same builder, same facts), or under ``not_checked`` why it cannot be made yet.
    """
    steps = [s for s in (plan.steps if steps is None else steps) if s.name != STEP]
    doc: dict[str, Any] = {
        "pin": release.TRTLLM_VERSION,
        "image": release.CONTAINER_IMAGE,
        "argvs": [{"step": s.name, "argv": s.argv} for s in steps if s.runs_in == "trtllm" and s.tool],
        "backends": BACKENDS[plan.runtime],
    }
    if plan.runtime == Runtime.TRTLLM_LLMAPI.value:
        _add_model_yaml(doc, plan.as_dict())
    return doc


def _paths(plan: Plan, doc: dict[str, Any]) -> tuple[Path, Path]:
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
    folder = plan.work_dir / STEP
    return folder / "first_contact.py", folder / f"{digest}.json"


def add_first_contact_step(plan: Plan) -> None:
    """Put the first-contact step first in ``plan`` (idempotent); its hash covers the checks document."""
    if any(s.name == STEP for s in plan.steps):
        return
    doc = check_input(plan)
    script, document = _paths(plan, doc)
    step = StepBuilder(plan.work_dir, plan.examples_root).add(
        STEP,
        ["python3", str(script), "--input", str(document), "--report", "{out}/report.txt"],
        [],
        "trtllm",
        f"first contact: TensorRT-LLM is {release.TRTLLM_VERSION}; {len(doc['argvs'])} commands parse with its own "
        f"parsers{'; the packaged model.yaml validates' if 'model_yaml' in doc else ''}; backends {', '.join(doc['backends'])} exist",
    )
    plan.steps.insert(0, step)


def materialize(plan: Plan) -> Path | None:
    """Write the first-contact script and checks document where the plan's step reads them."""
    if not any(s.name == STEP for s in plan.steps):
        return None
    doc = check_input(plan)
    script, document = _paths(plan, doc)
    document.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SCRIPT, script)
    document.write_text(json.dumps(doc, indent=1))
    return document


def gpu_present(run=subprocess.run) -> bool:
    """Whether this machine shows an NVIDIA GPU: ``nvidia-smi -L`` exists, exits 0 and lists a ``GPU``."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        proc = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and "GPU" in (proc.stdout or "")


def invocation(document: Path, *, container: str | None = None, local: bool = False, gpus: bool = False) -> list[str]:
    """The command that runs the check of ``document`` in ``container`` (docker) or here (``local``).

    ``gpus``: pass every GPU to the container (``docker run --gpus all``): the NVIDIA Container Toolkit
    then mounts the driver libraries (``libcuda.so.1``, ``libnvidia-ml.so.1``) that importing
    ``tensorrt_llm``'s bindings loads; without them the import fails in any container.

    Raises:
        ValueError: neither or both of ``container`` and ``local``.
    """
    if (container is None) == (not local):
        raise ValueError("give a container image or local=True")
    document = Path(document).absolute()
    if local:
        return [sys.executable, "-m", "specpipe.trtllm.first_contact", "--input", str(document)]
    return [
        "docker",
        "run",
        "--rm",
        *(["--gpus", "all"] if gpus else []),
        "-v",
        f"{SCRIPT}:/specpipe/first_contact.py:ro",
        "-v",
        f"{document}:/specpipe/checks.json:ro",
        container,
        "python3",
        "/specpipe/first_contact.py",
        "--input",
        "/specpipe/checks.json",
    ]


def checks_from_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The checks document of a plan written by ``specpipe build --dry-run --json`` (``PLAN_FORMAT``).

    Raises:
        SpecpipeError: not a specpipe TensorRT-LLM plan document.
    """
    runtime = doc.get("runtime") if isinstance(doc, dict) else None
    if runtime not in BACKENDS or not isinstance(doc.get("steps"), list):
        raise SpecpipeError(
            "the --plan file is not a TensorRT-LLM plan: write one with 'specpipe build --runtime "
            "trtllm|trtllm-llmapi --dry-run --json > PLAN.json'"
        )
    checks: dict[str, Any] = {
        "pin": release.TRTLLM_VERSION,
        "image": release.CONTAINER_IMAGE,
        "argvs": [
            {"step": s["name"], "argv": s["argv"]}
            for s in doc["steps"]
            if s.get("runs_in") == "trtllm" and s.get("tool") and s["name"] != STEP
        ],
        "backends": BACKENDS[runtime],
    }
    if runtime == Runtime.TRTLLM_LLMAPI.value:
        _add_model_yaml(checks, doc)
    return checks


def read_plan_file(path: Path) -> dict[str, Any]:
    """The checks document of the plan JSON at ``path``.

    Raises:
        SpecpipeError: unreadable, not JSON, or not a TensorRT-LLM plan.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecpipeError(
            f"cannot read the plan {path} ({exc}): write it with 'specpipe build ... --dry-run --json'"
        ) from exc
    return checks_from_document(doc)


def doctor(
    *,
    container: str | None = None,
    local: bool = False,
    plan: Plan | None = None,
    plan_file: Path | None = None,
    runtime: str = "trtllm",
    run=docker_errors.run_teed,
    gpus: bool | None = None,
) -> int:
    """``specpipe doctor --container IMAGE | --local [--plan PLAN.json]``: run the first-contact check; returns
    0 when every check passed, else 1. Its report goes to the terminal.

    Without a plan it checks the release and the backends of ``runtime``'s repositories only; with one
    (``plan``, or ``plan_file`` from ``build --dry-run --json``) also every command and the model.yaml.
    A container gets ``--gpus all`` when this machine has a GPU (``gpus``; default: :func:`gpu_present`); the document
    records whether it did, so that a failed import is told apart: a driver library missing (no GPU
    passed, or no NVIDIA Container Toolkit) or a broken container
    (:func:`specpipe.trtllm.first_contact.classify_import_failure`). ``run`` runs the command and returns
    its process, stderr's last lines in ``stderr`` (default :func:`specpipe.trtllm.docker_errors.run_teed`:
    stderr is shown as it comes).

    Raises:
        SpecpipeError: an unreadable ``plan_file``.
        ImageReferenceError: ``container`` is not an image reference (:mod:`specpipe.trtllm.image_reference`).
        DockerError: docker is not installed, or docker itself failed (no daemon, no GPU runtime, cannot
            pull, no ``python3`` in the image: :func:`specpipe.trtllm.docker_errors.diagnose`), one line
            with the fix.
        ValueError: neither or both of ``container`` and ``local``.
    """
    if container is not None:
        image_reference.check(container, example=release.CONTAINER_IMAGE)
    if plan is not None:
        doc = check_input(plan)
    elif plan_file is not None:
        doc = read_plan_file(plan_file)
    else:
        doc = {
            "pin": release.TRTLLM_VERSION,
            "image": release.CONTAINER_IMAGE,
            "argvs": [],
            "backends": BACKENDS[runtime],
        }
    gpus = container is not None and (gpu_present() if gpus is None else gpus)
    if container is not None:
        doc = {**doc, "gpus_passed": gpus}
    with tempfile.TemporaryDirectory(prefix="specpipe-doctor-") as tmp:
        document = Path(tmp) / "checks.json"
        document.write_text(json.dumps(doc, indent=1))
        process = run(invocation(document, container=container, local=local, gpus=gpus))
    if container is not None:
        failure = docker_errors.diagnose(
            getattr(process, "stderr", None) or "", process.returncode, image=container, program="python3"
        )
        if failure is not None:
            raise docker_errors.DockerError(failure.message)
    return 0 if process.returncode == 0 else 1
