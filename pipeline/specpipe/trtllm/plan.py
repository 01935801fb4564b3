"""The build plan: ordered steps with the exact argument vectors of TensorRT-LLM's own tools.

Steps (engine flow, ``--runtime trtllm``)::

    first-contact     python3 <work>/first-contact/first_contact.py --input <checks> ... (every plan's first
                      step, added by :func:`specpipe.trtllm.doctor.add_first_contact_step`: the live
                      TensorRT-LLM's version, parsers, LLM-API classes and backends, before any download)
    download-target   hf download <repo> --revision <rev> --exclude original/*  (into the Hugging Face cache,
                      then hard-linked into <out>)
    download-draft    the same for EAGLE/Medusa heads or the draft model (EAGLE: before the target)
    prepare-eagle-head  python3 -m specpipe.trtllm.prepare_eagle <head> <out> --max-position-embeddings <N>: the
                      head as TensorRT-LLM's EAGLE converter reads it (zero fc.bias, model.safetensors, the
                      target's positions; :mod:`specpipe.trtllm.eagle_head`)
    convert-target    examples/models/core/llama/convert_checkpoint.py | quantization/quantize.py |
                      eagle/convert_checkpoint.py | medusa/convert_checkpoint.py  -> TensorRT-LLM checkpoint
    convert-draft     the draft model's checkpoint (draft-target only)
    build-target      trtllm-build ... [--speculative_decoding_mode M --max_draft_len D]
    build-draft       trtllm-build for the draft model (draft-target only)

``--runtime trtllm-llmapi`` plans only the first contact and the downloads (the LLM API builds nothing ahead of time).

Each step's output directory is keyed by a hash of its command template (with the examples root and
its own output left symbolic), the hashes of the steps it reads and the pinned release, so an
unchanged step is found done on a rerun. Every argument vector is checked against TensorRT-LLM's flag
definitions (:mod:`specpipe.trtllm.flagcheck`) when the plan is made.
The tools' argument vectors come from :mod:`specpipe.trtllm.tool_argv`; :mod:`specpipe.trtllm.plan_text`
renders a plan for dry runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.build_request import BuildRequest
from specpipe.speculative import Method, Runtime, entry_for, spec_of
from specpipe.trtllm import release
from specpipe.trtllm.eagle_head import PREPARE_STEP, preparation_for, prepare_argv
from specpipe.trtllm.flagcheck import check_argv
from specpipe.trtllm.llmapi_schema import build_speculative_config
from specpipe.trtllm.preflight import PreflightResult
from specpipe.trtllm.resolve import Draft, Target
from specpipe.trtllm.tool_argv import CONVERTERS, build_argv, checkpoint_argv

WORK_DIRNAME = ".trtllm-work"
#: The plan document's format (2: the ``speculative`` block is ``SpeculativeSettings.to_json()``, the tree
#: under ``choices``); read back by :func:`specpipe.triton.deployment.from_plan`.
PLAN_FORMAT = "specpipe-trtllm-plan/2"
#: Download descriptions of a method's weights (:attr:`specpipe.speculative.MethodSpec.weights`).
WEIGHTS_WHAT = {Method.EAGLE: "EAGLE head", Method.MEDUSA: "Medusa heads", Method.DRAFT_MODEL: "draft model"}
TOOL_OF_SCRIPT = {
    release.LLAMA_CONVERT: "llama-convert",
    release.EAGLE_CONVERT: "eagle-convert",
    release.MEDUSA_CONVERT: "medusa-convert",
    release.QUANTIZE: "quantize",
}


@dataclass
class Step:
    """One step: ``argv`` (program first), its ``output`` directory, the steps it reads (``inputs``),
    where it runs (``host`` or ``trtllm``: the TensorRT-LLM environment) and its ``hash``."""

    name: str
    argv: list[str]
    output: str
    inputs: list[str]
    runs_in: str
    hash: str
    tool: str | None = None
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": self.argv,
            "output": self.output,
            "inputs": self.inputs,
            "runs_in": self.runs_in,
            "hash": self.hash,
            "tool": self.tool,
            "description": self.description,
        }


@dataclass
class Plan:
    """Everything a build will do, as data (printed by dry runs, executed by an executor)."""

    runtime: str
    engine_name: str
    engine_dir: Path
    work_dir: Path
    executor: str
    examples_root: str
    target: Target
    draft: Draft
    preflight: PreflightResult
    request: BuildRequest
    steps: list[Step] = field(default_factory=list)
    target_path: str = ""
    draft_path: str | None = None

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    @property
    def inputs_hash(self) -> str:
        return _digest([s.hash for s in self.steps] + [self.runtime, self.engine_name])

    def as_dict(self) -> dict[str, Any]:
        pre, req = self.preflight, self.request
        data: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "runtime": self.runtime,
            "engine_name": self.engine_name,
            "engine_dir": str(self.engine_dir),
            "release": release.summary(),
            "executor": self.executor,
            "target": {
                "preset": self.target.name,
                "source": self.target.source,
                "dtype": self.target.dtype,
                "architecture": vars(self.target.arch) | {},
                "path": self.target_path,
            },
            "draft": {
                "preset": self.draft.name,
                "method": self.draft.method,
                "flavour": self.draft.flavour,
                "source": self.draft.source,
                "path": self.draft_path,
            },
            "speculative": pre.speculative.to_json(),
            "quantization": pre.scheme.name,
            "parallel": pre.parallel.as_dict()
            if pre.parallel
            else {"tp": req.tp, "pp": req.pp, "gpus": req.tp * req.pp},
            "limits": {
                "max_batch_size": req.max_batch_size,
                "max_input_len": req.max_input_len,
                "max_seq_len": req.max_seq_len,
            },
            "gpu": pre.gpu.name if pre.gpu else None,
            "checks": [vars(c) for c in pre.checks],
            "steps": [s.as_dict() for s in self.steps],
            "memory": pre.memory.as_dict(),
            "inputs_hash": self.inputs_hash,
        }
        if self.runtime == Runtime.TRTLLM_LLMAPI.value:
            data["llmapi"] = llmapi_settings(self)
        return data


def llmapi_settings(plan: Plan) -> dict[str, Any]:
    """What the LLM API repository needs (model.yaml keys): model, parallel sizes, speculative_config.

    ``speculative_config`` comes from the one builder, spelled for the pinned release
    (:func:`specpipe.trtllm.llmapi_schema.build_speculative_config`).
    """
    spec = plan.preflight.speculative
    out: dict[str, Any] = {
        "model": plan.target_path,
        "backend": "pytorch",
        "tensor_parallel_size": plan.request.tp,
        "pipeline_parallel_size": plan.request.pp,
        "max_batch_size": plan.request.max_batch_size,
        "max_seq_len": plan.request.max_seq_len,
    }
    config = build_speculative_config(spec, plan.draft_path, release.TRTLLM_VERSION)
    if config is not None:
        out["speculative_config"] = config
    return out


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class StepBuilder:
    """Adds steps with hashed output directories under ``work`` (see the module docstring)."""

    def __init__(self, work: Path, examples_root: str):
        self.work, self.examples_root = work, examples_root
        self.steps: list[Step] = []

    def add(
        self, name: str, template: list[str], inputs: list[str], runs_in: str, description: str, slug: str = ""
    ) -> Step:
        """Add a step; ``template`` may hold ``{out}``, ``{examples}`` and ``{step:NAME}`` placeholders."""
        upstream = {n: self.get(n).hash for n in inputs}
        digest = _digest({"step": name, "argv": template, "inputs": upstream, "release": release.TRTLLM_VERSION})[:16]
        out = str(self.work / f"{name}{'-' + slug if slug else ''}-{digest}")
        argv = []
        for token in template:
            token = token.replace("{out}", out).replace("{examples}", self.examples_root)
            for n in inputs:
                token = token.replace("{step:" + n + "}", self.get(n).output)
            argv.append(token)
        tool = "trtllm-build" if argv[0] == "trtllm-build" else None
        if argv[0] == "python3":
            script = next((k for k in TOOL_OF_SCRIPT if argv[1].endswith("/" + k)), None)
            tool = TOOL_OF_SCRIPT.get(script) if script else None
        if tool is not None:
            check_argv(tool, argv)
        step = Step(name, argv, out, inputs, runs_in, digest, tool, description)
        self.steps.append(step)
        return step

    def get(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


def _download(b: StepBuilder, name: str, source: dict[str, Any], what: str) -> str:
    """A download step for a Hugging Face source; returns the path placeholder of the weights."""
    if source["kind"] == "local":
        return source["path"]
    repo, rev = source["repo_id"], source.get("revision", "main")
    # Meta's repos also carry the original consolidated .pth weights under original/: not needed. The files
    # go into the Hugging Face cache (resumable, shared with other tools), then are hard-linked into {out}
    # (executor.run_download), so the argv names no output folder.
    b.add(
        name,
        ["hf", "download", repo, "--revision", rev, "--exclude", "original/*"],
        [],
        "host",
        f"download {what} {repo}@{rev} into the Hugging Face cache, then hard-link its files into the step's folder",
        slug=repo.replace("/", "--").lower(),
    )
    return "{step:" + name + "}"


def _resolve(b: StepBuilder, value: str, inputs: list[str]) -> str:
    for n in list(inputs):
        if value == "{step:" + n + "}":
            return b.get(n).output
    return value


def make_plan(
    request: BuildRequest,
    target: Target,
    draft: Draft,
    pre: PreflightResult,
    *,
    engine_name: str,
    engines_dir: Path,
    executor: str,
    examples_root: str,
) -> Plan:
    """The ordered steps for ``request`` (see module docstring); every argv is flag-checked.

    Raises:
        InvalidCommandError: a generated command does not match TensorRT-LLM's flags (a defect).
    """
    engines_dir = Path(engines_dir).absolute()
    work = engines_dir / WORK_DIRNAME
    b = StepBuilder(work, examples_root)
    spec, scheme, tp, pp = pre.speculative, pre.scheme, request.tp, request.pp
    plan = Plan(
        request.runtime,
        engine_name,
        engines_dir / engine_name,
        work,
        executor,
        examples_root,
        target,
        draft,
        pre,
        request,
    )
    # EAGLE on the engine flow: the head first, so that its preparation (which checks it against the
    # converter's contract) runs before the target's download.
    eagle_engine = request.runtime == Runtime.TRTLLM.value and Method(draft.method) is Method.EAGLE
    heads = None
    if draft.source is not None and eagle_engine:
        heads = _download(b, "download-draft", draft.source, WEIGHTS_WHAT[Method.EAGLE])
        b.add(
            PREPARE_STEP,
            prepare_argv(heads, target),
            ["download-draft"] if draft.source["kind"] == "hf" else [],
            "host",
            f"prepare the EAGLE head for TensorRT-LLM's converter: check it, add {', '.join(preparation_for(draft, target))}",
        )
    model = _download(b, "download-target", target.source, "target")
    if draft.source is not None and not eagle_engine:
        what = entry_for(WEIGHTS_WHAT, draft.method, "trtllm.plan.WEIGHTS_WHAT")
        heads = _download(b, "download-draft", draft.source, what)
    deps = [n for n in ("download-target", "download-draft") if any(s.name == n for s in b.steps)]
    plan.target_path = _resolve(b, model, deps)
    plan.draft_path = _resolve(b, heads, deps) if heads else None
    if request.runtime == Runtime.TRTLLM_LLMAPI.value:
        plan.steps = b.steps
        return plan

    two_engines = spec.spec.weights == "model"  # a separate draft engine (draft-target)
    tdeps = [d for d in deps if d == "download-target" or spec_of(draft.method).weights == "heads"]
    convert = entry_for(CONVERTERS, spec.method, "trtllm.tool_argv.CONVERTERS")
    template, desc, tdeps = convert(model, heads, spec, scheme, tp, pp, tdeps)
    b.add("convert-target", template, tdeps, "trtllm", desc)
    if two_engines:
        b.add(
            "convert-draft",
            checkpoint_argv(heads, scheme, tp, pp),
            [d for d in deps if d == "download-draft"],
            "trtllm",
            f"convert draft model ({scheme.name}) to a TensorRT-LLM checkpoint",
        )
    mode = spec.spec.build_mode
    extra = ["--speculative_decoding_mode", mode, "--max_draft_len", str(spec.max_draft_len)] if mode else []
    b.add(
        "build-target",
        build_argv("{step:convert-target}", request, extra),
        ["convert-target"],
        "trtllm",
        f"build the target engine{' (' + mode + ')' if mode else ''}",
    )
    if two_engines:
        b.add(
            "build-draft",
            build_argv("{step:convert-draft}", request, []),
            ["convert-draft"],
            "trtllm",
            "build the draft engine",
        )
    plan.steps = b.steps
    return plan
