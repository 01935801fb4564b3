"""``specpipe build --runtime trtllm|trtllm-llmapi``: checks, plan, and (unless a dry run) execution.

Order: resolve presets and ``--draft-model`` -> pre-flight checks (no weights downloaded) -> plan ->
``--dry-run``: print the plan and memory table (or one JSON document with ``--json``) and stop (dry runs
stay offline: the Hugging Face check is listed as "not checked") -> otherwise: refuse an unfit plan, pick
an executor, check Hugging Face access (token, gated licences) and free disk for every download still to
run (:func:`check_downloads`), check the output root is writable, run the steps (cached by hash),
assemble ``engines/NAME/`` (temporary directory + rename) with its manifest.

Engine directory (``--runtime trtllm``)::

    engines/NAME/manifest.json   TensorRT-LLM version, container image, every step's argv and hash
    engines/NAME/target/         the target engine (trtllm-build output, hard-linked)
    engines/NAME/draft/          the draft engine (draft-target only)
    engines/NAME/tokenizer/      the target's tokenizer files

``--runtime trtllm-llmapi`` downloads the checkpoints and writes the manifest with the LLM API
settings (model, parallel sizes, speculative_config); the Triton repository is made by ``package``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from specpipe.build_common import OutputRootError, check_writable, is_engine_name, up_to_date
from specpipe.build_request import BuildRequest
from specpipe.errors import PresetError, SpecpipeError
from specpipe.fsutil import link_tree, write_dir_atomically
from specpipe.manifest import Manifest, Part, write_manifest
from specpipe.models.hub_access import HubSource, check_sources, is_offline, licence_page
from specpipe.models.hub_cache import check_cache_writable, check_cached
from specpipe.progress import note, result
from specpipe.speculative import Method, Runtime, spec_of
from specpipe.trtllm import release
from specpipe.trtllm.doctor import add_first_contact_step, materialize
from specpipe.trtllm.executor import (
    Executor,
    choose_executor,
    download_arguments,
    local_examples_root,
    run_plan,
    step_done,
    trtllm_importable,
)
from specpipe.trtllm.plan import Plan, make_plan
from specpipe.trtllm.plan_text import render_text
from specpipe.trtllm.preflight import Check, raise_if_unfit, run_preflight
from specpipe.trtllm.resolve import resolve_draft, resolve_target
from specpipe.trtllm.tokenizer_check import compare_tokenizers, locate_tokenizer

__all__ = ["OutputRootError", "build_trtllm", "check_downloads", "execute", "plan_build"]
HUB_CHECK = "Hugging Face access and disk"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def _tokenizer_check(target, draft, allow_network: bool) -> Check | None:
    if spec_of(draft.method).weights != "model":
        return None
    t, d = locate_tokenizer(target.source, allow_network), locate_tokenizer(draft.source, allow_network)
    if t is None or d is None:
        why = "offline (dry run)" if not allow_network else "tokenizer files not reachable"
        return Check("tokenizers (content)", "not checked", why)
    return compare_tokenizers(t, d, target.arch.vocab_size, draft.vocab_size or 0)


def plan_build(request: BuildRequest, *, importable=None) -> tuple[Plan, str | None, str]:
    """Resolve, check and plan; returns ``(plan, executor name or None, why no executor)``.

    Raises:
        SpecpipeError: any failed pre-flight check (memory fit excepted: see ``raise_if_unfit``).
    """
    name_check = request.name
    if name_check is not None and not is_engine_name(name_check):
        raise PresetError(f"--name {name_check!r} must be a plain name (letters, digits, . _ -), no paths")
    allow_network = not request.dry_run
    target = resolve_target(request.target)
    draft = resolve_draft(request.draft, request.draft_model, target, allow_network)
    pre = run_preflight(request, target, draft)
    request = replace(request, tp=pre.parallel.tp, pp=pre.parallel.pp)  # --tp/--pp auto resolved
    tok = _tokenizer_check(target, draft, allow_network)
    if tok is not None:
        pre.checks.append(tok)
    executor, why = choose_executor(request.executor, importable=importable or trtllm_importable)
    examples = (local_examples_root() if executor == "local" else None) or release.CONTAINER_EXAMPLES_ROOT
    engine_name = request.engine_name(target.name, draft.name)
    if not is_engine_name(engine_name):
        raise PresetError(f"engine name {engine_name!r} is not a plain name: give one with --name")
    plan = make_plan(
        request,
        target,
        draft,
        pre,
        engine_name=engine_name,
        engines_dir=request.engines_dir,
        executor=executor or "none",
        examples_root=examples,
    )
    add_first_contact_step(plan)
    if request.dry_run and _download_steps(plan):
        pre.checks.append(Check(HUB_CHECK, "not checked", _dry_run_hub_note(plan)))
    return plan, executor, why


def _download_steps(plan: Plan) -> list:
    return [s for s in plan.steps if s.argv[:2] == ["hf", "download"]]


def _dry_run_hub_note(plan: Plan) -> str:
    gated = [
        src["repo_id"]
        for src in (plan.target.source, plan.draft.source)
        if src and src.get("kind") == "hf" and src.get("gated")
    ]
    note_ = "dry run (offline); a build checks the token, gated licences and free disk before any download"
    if gated:
        note_ += "; gated: " + ", ".join(f"{repo} (accept the licence at {licence_page(repo)})" for repo in gated)
        note_ += ", then `hf auth login` or HF_TOKEN"
    return note_


def check_downloads(plan: Plan, *, force: bool = False) -> list[str]:
    """Before anything is written: for each download step still to run, the Hub's access (token, gated
    licence) and the repository's size against free disk (:func:`specpipe.models.hub_access.check_sources`);
    returns the report lines; the cache must be writable (:func:`specpipe.models.hub_cache.check_cache_writable`).
    Nothing is checked for an up-to-date engine or finished downloads. Offline (``HF_HUB_OFFLINE=1``: the
    downloads use the cache only) each repository must be completely in the cache instead
    (:func:`specpipe.models.hub_cache.check_cached`).

    Raises:
        NotCachedError: offline, and a repository is not (completely) in the cache.
        CacheNotWritableError: the cache cannot be written by this user.
        HubAccessError: gated licence not accepted, token refused, repository not found.
        DiskSpaceError: not enough free disk in the cache's or the engines directory's filesystem.
        SpecpipeError: the Hub cannot be reached.
    """
    if not force and up_to_date(plan.engine_dir, plan.inputs_hash):
        return []
    steps = [s for s in _download_steps(plan) if force or not step_done(s)]
    if not steps:
        return []
    sources = []
    for step in steps:
        options = download_arguments(step.argv)
        sources.append(HubSource(str(options["repo_id"]), str(options["revision"]), tuple(options["ignore_patterns"])))
    if is_offline():
        return [
            f"hub: {s.repo_id}@{s.revision} in the Hugging Face cache ({check_cached(s).name[:12]}): "
            "HF_HUB_OFFLINE=1, access and disk not checked"
            for s in sources
        ]
    check_cache_writable([s.repo_id for s in sources])
    return check_sources(sources, plan.engine_dir.parent)


def build_trtllm(request: BuildRequest, *, importable=None) -> Path | None:
    """Entry point of ``specpipe build --runtime trtllm|trtllm-llmapi``.

    Returns the engine directory (``None`` for dry runs).

    Raises:
        SpecpipeError: a failed check (before any step runs), no executor, a failed step.
    """
    from specpipe.trtllm.executor import docker_prefix

    plan, executor, why = plan_build(request, importable=importable)
    if request.dry_run:
        if request.json_output:
            doc = plan.as_dict()
            doc["error"] = plan.preflight.memory_error
            doc["executor_available"] = executor is not None
            result(json.dumps(doc, indent=1))
        else:
            prefix = docker_prefix(plan.engine_dir.parent) if executor in ("docker", None) else None
            result(render_text(plan, prefix))
        raise_if_unfit(plan.preflight)
        return None
    result(render_text(plan, docker_prefix(plan.engine_dir.parent) if executor == "docker" else None))
    if request.gpu is None and request.runtime == "trtllm":
        raise SpecpipeError(
            "name the GPU with --gpu (e.g. --gpu h100-80gb) so the memory plan is checked before building"
        )
    raise_if_unfit(plan.preflight)
    needs_trtllm = any(s.runs_in == "trtllm" for s in plan.steps)
    if needs_trtllm and executor is None:
        from specpipe.trtllm.executor import NoExecutorError

        raise NoExecutorError(
            f"no executor can run TensorRT-LLM here ({why}): install docker with the NVIDIA Container Toolkit "
            f"(--executor docker pulls {release.CONTAINER_IMAGE}), or run specpipe inside that container "
            f"(--executor local); the plan above lists every command"
        )
    for line in check_downloads(plan, force=request.force):
        note(line)
    check_writable(plan.engine_dir.parent)
    return execute(plan, executor or "local", force=request.force)


def _manifest(plan: Plan) -> Manifest:
    """The engine directory's manifest: paths relative to it on the engine flow; the LLM API flow's
    checkpoints stay where the plan downloaded them (absolute)."""
    pre, req = plan.preflight, plan.request
    engine_flow = plan.runtime == Runtime.TRTLLM.value
    weights = spec_of(plan.draft.method).weights
    draft = None
    if weights is not None:
        path = ("draft" if weights == "model" else None) if engine_flow else plan.draft_path
        draft = Part(
            preset=plan.draft.name,
            source=plan.draft.source,
            path=path,
            method=Method(plan.draft.method).value,
            flavour=plan.draft.flavour,
        )
    return Manifest(
        name=plan.engine_name,
        runtime=Runtime(plan.runtime),
        inputs_hash=plan.inputs_hash,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        target=Part(
            preset=plan.target.name, source=plan.target.source, path="target" if engine_flow else plan.target_path
        ),
        draft=draft,
        speculative=pre.speculative,
        quantization=pre.scheme.name,
        parallel={"tp": req.tp, "pp": req.pp},
        limits={
            "max_batch_size": req.max_batch_size,
            "max_input_len": req.max_input_len,
            "max_seq_len": req.max_seq_len,
        },
        trtllm={
            "version": release.TRTLLM_VERSION,
            "container_image": release.CONTAINER_IMAGE,
            "executor": plan.executor,
            "steps": [s.as_dict() for s in plan.steps],
            "memory": pre.memory.as_dict(),
            "llmapi": plan.as_dict().get("llmapi"),
        },
    )


_STEP_RECORD = shutil.ignore_patterns(".specpipe-step.json")


def execute(plan: Plan, executor_name: str, *, force: bool = False) -> Path:
    """Run the plan's steps and assemble ``engines/NAME`` (temporary directory + rename).

    Raises:
        StepFailedError: a step failed; nothing is written to ``engines/NAME``.
        KeyboardInterrupt: Ctrl-C or SIGTERM during a step (after a line saying how to resume).
    """
    if not force and up_to_date(plan.engine_dir, plan.inputs_hash):
        note(f"{plan.engine_dir} is up to date (inputs {plan.inputs_hash[:12]}): nothing to do (--force rebuilds)")
        return plan.engine_dir
    executor = Executor(executor_name, plan.examples_root, root=plan.engine_dir.parent, log=note)
    note(f"running {len(plan.steps)} steps with the {executor_name} executor")
    materialize(plan)
    try:
        run_plan(plan, executor, force=force)
    except KeyboardInterrupt:
        note("interrupted: run the same command again to resume: finished steps and downloaded files are kept")
        raise

    def assemble(tmp: Path) -> None:
        if plan.runtime == "trtllm":
            link_tree(Path(plan.step("build-target").output), tmp / "target", ignore=_STEP_RECORD)
            if plan.preflight.speculative.spec.weights == "model":
                link_tree(Path(plan.step("build-draft").output), tmp / "draft", ignore=_STEP_RECORD)
            tok = tmp / "tokenizer"
            tok.mkdir()
            for name in TOKENIZER_FILES:
                src = Path(plan.target_path) / name
                if src.is_file():
                    shutil.copy2(src, tok / name)
        write_manifest(tmp, _manifest(plan))

    write_dir_atomically(plan.engine_dir, assemble)
    note(f"wrote {plan.engine_dir}")
    return plan.engine_dir
