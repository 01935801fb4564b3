"""What a TensorRT-LLM deployment is made of, read once from an engine manifest or a build plan.

Both ``engines/NAME/manifest.json`` (written by ``specpipe build --runtime trtllm|trtllm-llmapi``) and
the plan document of ``specpipe build ... --dry-run --json`` describe the same things: the runtime,
the pinned TensorRT-LLM release and container, the speculative settings, the parallel sizes, the
engine limits and the memory plan. :class:`Deployment` holds them with host paths resolved, checked
for consistency, so the repository writers, the launcher and the Kubernetes writer share one reading.

Container layout (every path in a generated config is a path inside the serving container):

    /models              the Triton model repository (triton_repo/NAME), read-only
    /engines             the engines root (engines/), read-only: the engine flow's
                         /engines/NAME/{target,draft,tokenizer}, the LLM API flow's downloaded
                         checkpoints under /engines/.trtllm-work/
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specpipe.errors import CompatibilityError, ManifestError, SpecpipeError
from specpipe.manifest import read_manifest
from specpipe.progress import warn
from specpipe.speculative import Method, Runtime, SpeculativeSettings, entry_for
from specpipe.tree import TreeError
from specpipe.trtllm import release
from specpipe.trtllm.plan import PLAN_FORMAT

CONTAINER_REPO = "/models"
CONTAINER_ENGINES = "/engines"
#: The runtimes a :class:`Deployment` is made for (the CPU runtime is packaged by :mod:`specpipe.triton.cpu_repository`).
RUNTIMES = (Runtime.TRTLLM, Runtime.TRTLLM_LLMAPI)


@dataclass
class Deployment:
    """A TensorRT-LLM deployment (see the module docstring).

    Attributes:
        name: engine name. runtime: ``trtllm`` (engine flow) or ``trtllm-llmapi``.
        trtllm_version: TensorRT-LLM release the engine was built for. container_image: its container.
        speculative: the resolved speculative settings (method, max_draft_len, tree, lookahead sizes ...).
        tp, pp: parallel sizes. limits: max_batch_size (requests), max_input_len, max_seq_len (tokens).
        memory: the memory plan (bytes per GPU, ``MemoryPlan.as_dict()``).
        engines_root, engine_dir: host paths. target_path, draft_path: host paths of the target and
            draft (engine directories, or checkpoints for the LLM API). tokenizer_path: host path.
        origin: ``manifest`` or ``plan`` (the engine does not exist yet).
    """

    name: str
    runtime: str
    trtllm_version: str
    container_image: str
    speculative: SpeculativeSettings
    tp: int
    pp: int
    limits: dict[str, int]
    memory: dict[str, Any]
    engines_root: Path
    engine_dir: Path
    target_path: Path
    draft_path: Path | None
    tokenizer_path: Path
    origin: str

    @property
    def method(self) -> Method:
        return self.speculative.method

    @property
    def world_size(self) -> int:
        """MPI ranks of the engine flow: one per GPU, TP x PP."""
        return self.tp * self.pp

    @property
    def max_draft_len(self) -> int:
        return self.speculative.max_draft_len

    def container_path(self, host_path: Path) -> str:
        """``host_path`` (under the engines root) as seen in the container (under ``/engines``).

        Raises:
            SpecpipeError: the path is outside the engines root (it would not be mounted).
        """
        host_path = Path(host_path).absolute()
        try:
            rel = host_path.relative_to(self.engines_root)
        except ValueError:
            raise SpecpipeError(
                f"{host_path} is outside the engines root {self.engines_root}, which is all the container mounts: "
                f"copy it under {self.engines_root} (or build with --engines-dir pointing above it)"
            ) from None
        return f"{CONTAINER_ENGINES}/{rel.as_posix()}" if str(rel) != "." else CONTAINER_ENGINES


def _check_release(found: str | None, where: str) -> str:
    if found != release.TRTLLM_VERSION:
        raise ManifestError(
            f"{where} is for TensorRT-LLM {found}, this specpipe packages TensorRT-LLM {release.TRTLLM_VERSION}: "
            f"rebuild it with this specpipe's 'specpipe build'"
        )
    return found


#: Each tree method's deepest tree the engine drafts, and what counts the levels (for messages).
TREE_DEPTH_LIMITS: dict[Method, Callable[[SpeculativeSettings], tuple[int | None, str]]] = {
    Method.EAGLE: lambda spec: (spec.num_eagle_layers, "EAGLE layers"),
    Method.MEDUSA: lambda spec: (spec.num_medusa_heads, "Medusa heads"),
}


def check_speculative(spec: SpeculativeSettings, where: str) -> None:
    """Settings that must agree between the engine and the serving config.

    Raises:
        CompatibilityError: a choices tree deeper than the EAGLE layers / Medusa heads or with more
            nodes than ``max_draft_len``; lookahead without (W, N, G).
        MethodTableError: a tree method without an entry in :data:`TREE_DEPTH_LIMITS`.
    """
    if spec.tree is not None:
        limit, counted = entry_for(TREE_DEPTH_LIMITS, spec.method, "triton.deployment.TREE_DEPTH_LIMITS")(spec)
        try:
            spec.tree.check(
                max_depth=limit,
                max_nodes=spec.max_draft_len,
                what=spec.spec.choices_key,
                depth_limit=counted,
                fix_depth=f"use a tree at most {{limit}} deep (--choices) or rebuild with more {counted}",
            )
        except TreeError as exc:
            raise TreeError(f"{where}: {exc}") from None
    if spec.method is Method.LOOKAHEAD and spec.lookahead is None:
        raise CompatibilityError(f"{where}: lookahead settings lack (W, N, G): rebuild the engine")


def from_manifest(engine_dir: Path) -> Deployment:
    """The deployment of a built engine directory.

    Raises:
        ManifestError: no manifest, another specpipe version, not a TensorRT-LLM engine, another
            TensorRT-LLM release, or missing keys.
        CompatibilityError: see :func:`check_speculative`.
    """
    engine_dir = Path(engine_dir).absolute()
    manifest = read_manifest(engine_dir)
    runtime = manifest.runtime
    if runtime not in RUNTIMES:
        raise ManifestError(
            f"{engine_dir} is a '{runtime.value}' engine, not a TensorRT-LLM one: package it without --runtime trtllm"
        )
    missing = [k for k in ("trtllm", "parallel", "limits") if getattr(manifest, k) is None]
    if missing or manifest.target.path is None:
        raise ManifestError(
            f"{engine_dir}/manifest.json lacks {(missing or ['target path'])[0]!r}: rebuild the engine with "
            f"'specpipe build'"
        )
    trt, spec = manifest.trtllm, manifest.speculative
    try:
        version = _check_release(trt["version"], f"engine {engine_dir}")
        memory = trt["memory"] or {}
    except (KeyError, TypeError) as exc:
        raise ManifestError(
            f"{engine_dir}/manifest.json lacks {exc}: rebuild the engine with 'specpipe build'"
        ) from exc
    draft_rel = manifest.draft.path if manifest.draft else None
    if runtime is Runtime.TRTLLM:
        target = engine_dir / manifest.target.path
        draft_path = engine_dir / draft_rel if draft_rel else None
        tokenizer = engine_dir / "tokenizer"
        for path, what in ((target, "target engine"), (tokenizer, "tokenizer")):
            if not path.is_dir():
                raise ManifestError(
                    f"{engine_dir} has no {what} directory {path.name}/: rebuild it with 'specpipe build --force'"
                )
        if spec.spec.weights == "model" and (draft_path is None or not draft_path.is_dir()):
            raise ManifestError(
                f"{engine_dir} is a draft-target engine without its draft/ engine: rebuild it with 'specpipe build --force'"
            )
    else:
        target = Path(manifest.target.path)
        draft_path = Path(draft_rel) if draft_rel else None
        tokenizer = target
    check_speculative(spec, f"engine {engine_dir.name}")
    return Deployment(
        name=manifest.name,
        runtime=runtime.value,
        trtllm_version=version,
        container_image=str(trt.get("container_image", release.CONTAINER_IMAGE)),
        speculative=spec,
        tp=int(manifest.parallel["tp"]),
        pp=int(manifest.parallel["pp"]),
        limits={k: int(v) for k, v in manifest.limits.items()},
        memory=memory,
        engines_root=engine_dir.parent,
        engine_dir=engine_dir,
        target_path=target,
        draft_path=draft_path,
        tokenizer_path=tokenizer,
        origin="manifest",
    )


def from_plan(plan_path: Path) -> Deployment:
    """The deployment a build plan (``build --dry-run --json`` output) will produce.

    Raises:
        SpecpipeError: unreadable JSON or not a plan document (of :data:`~specpipe.trtllm.plan.PLAN_FORMAT`).
        ManifestError: another TensorRT-LLM release, or speculative settings that are not valid.
        CompatibilityError: see :func:`check_speculative`.
    """
    plan_path = Path(plan_path)
    try:
        plan = json.loads(plan_path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecpipeError(
            f"cannot read plan {plan_path} ({exc}): write it with 'specpipe build ... --dry-run --json > PLAN.json'"
        ) from exc
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise SpecpipeError(
            f"{plan_path} is not a specpipe build plan (format {plan.get('format') if isinstance(plan, dict) else None!r}, "
            f"expected {PLAN_FORMAT!r}): write it with 'specpipe build ... --dry-run --json'"
        )
    runtime = plan.get("runtime")
    if runtime not in RUNTIMES:
        raise SpecpipeError(f"plan {plan_path} is for runtime '{runtime}', not a TensorRT-LLM one")
    try:
        version = _check_release(plan["release"]["tensorrt_llm"], f"plan {plan_path}")
        engine_dir = Path(plan["engine_dir"]).absolute()
        spec = SpeculativeSettings.from_json(plan["speculative"], f"plan {plan_path}")
        parallel, limits = plan["parallel"], plan["limits"]
        memory = plan["memory"]
        target_path, draft_path = plan["target"]["path"], plan["draft"]["path"]
    except (KeyError, TypeError) as exc:
        raise SpecpipeError(
            f"plan {plan_path} lacks {exc}: regenerate it with 'specpipe build ... --dry-run --json'"
        ) from exc
    if runtime == Runtime.TRTLLM:
        target, draft = engine_dir / "target", (engine_dir / "draft" if spec.spec.weights == "model" else None)
        tokenizer = engine_dir / "tokenizer"
    else:
        target, draft = Path(target_path), (Path(draft_path) if draft_path else None)
        tokenizer = target
    check_speculative(spec, f"plan {plan_path.name}")
    if parallel.get("checked") is False:
        warn(
            f"plan {plan_path.name}: TP {parallel['tp']} x PP {parallel['pp']} was not fitted to a GPU (planned without "
            f"--gpu and none detected): the repository uses those sizes; re-plan with --gpu NAME to have them checked"
        )
    return Deployment(
        name=str(plan.get("engine_name", engine_dir.name)),
        runtime=runtime,
        trtllm_version=version,
        container_image=str(plan["release"].get("container_image", release.CONTAINER_IMAGE)),
        speculative=spec,
        tp=int(parallel["tp"]),
        pp=int(parallel["pp"]),
        limits={k: int(v) for k, v in limits.items()},
        memory=memory,
        engines_root=engine_dir.parent,
        engine_dir=engine_dir,
        target_path=target,
        draft_path=draft,
        tokenizer_path=tokenizer,
        origin="plan",
    )
