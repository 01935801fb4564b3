"""``specpipe package``: write the Triton model repository of a built engine (or of a build plan).

The writer is chosen by the manifest's ``runtime``: the CPU runtime (:mod:`specpipe.triton.cpu_repository`),
TensorRT-LLM's engine flow (:mod:`specpipe.triton.trtllm_repository`) or its LLM API
(:mod:`specpipe.triton.llmapi`). Each of them only builds the configs; :mod:`specpipe.triton.writer`
writes every repository the same way (temporary directory, read back, cross-checked, renamed into place:
on any failure nothing is left behind and an existing repository is untouched).
"""

from __future__ import annotations

from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.manifest import changed_files, read_manifest
from specpipe.speculative import Runtime
from specpipe.triton.config import read_config
from specpipe.triton.cpu_repository import RUNTIME_PARAMETER, cpu_repository
from specpipe.triton.deployment import Deployment, from_manifest, from_plan
from specpipe.triton.interface import TENSORRT_LLM
from specpipe.triton.llmapi import llmapi_repository
from specpipe.triton.repo_meta import read_meta
from specpipe.triton.trtllm_repository import engine_repository
from specpipe.triton.writer import write_repository


def package_engine(
    engine_dir: Path, out_dir: Path, *, dense_rows: str = "auto", draft_lengths: str = "adaptive", warm_up: bool = True
) -> Path:
    """Write the Triton model repository for the engine in ``engine_dir`` to ``out_dir``.

    ``out_dir`` is replaced as a whole (written beside it, then renamed into place). The writer is
    chosen by the manifest's ``runtime``: CPU, TensorRT-LLM engine flow or LLM API. ``dense_rows``,
    ``draft_lengths``, ``warm_up``: the CPU model's parameters of those names
    (:mod:`specpipe.triton.models.tensorrt_llm_cpu`); other runtimes take only the defaults.

    Returns:
        the absolute path of the repository (``out_dir``).

    Raises:
        SpecpipeError: the engine directory is missing, has no manifest, was built by another
            specpipe version or TensorRT-LLM release, a CPU engine's files are missing or changed since
            the build (sha256 of each file the manifest lists), or the written repository fails its checks.
    """
    manifest = read_manifest(engine_dir)
    if manifest.runtime is Runtime.VLLM:
        raise SpecpipeError(
            f"engine {manifest.name} is a vLLM deployment, which serves its own OpenAI API without a "
            f"Triton repository: nothing to package; run 'specpipe serve {manifest.name} --runtime vllm'"
        )
    if manifest.runtime is Runtime.CPU:
        repository = cpu_repository(
            manifest, engine_dir, dense_rows=dense_rows, draft_lengths=draft_lengths, warm_up=warm_up
        )
        changed = changed_files(engine_dir, manifest)
        if changed:
            raise SpecpipeError(
                f"engine {engine_dir} is damaged: {', '.join(str(p) for p in changed)} "
                f"{'is' if len(changed) == 1 else 'are'} missing or changed since the build; "
                f"rebuild it with 'specpipe build ... --force'"
            )
        return write_repository(out_dir, repository)
    defaults = {
        "--dense-rows": dense_rows == "auto",
        "--draft-lengths": draft_lengths == "adaptive",
        "--no-warm-up": warm_up,
    }
    given = [flag for flag, is_default in defaults.items() if not is_default]
    if given:
        raise SpecpipeError(
            f"{', '.join(given)}: settings of the CPU runtime, and engine {engine_dir} is for "
            f"'{manifest.runtime.value}': leave {'it' if len(given) == 1 else 'them'} out"
        )
    return write_trtllm_repository(from_manifest(engine_dir), out_dir)


def write_trtllm_repository(deployment: Deployment, out_dir: Path) -> Path:
    """The engine-flow or LLM API repository of a :class:`~specpipe.triton.deployment.Deployment`.

    Raises:
        SpecpipeError: the deployment cannot be served as configured; nothing is written then.
    """
    if deployment.runtime == Runtime.TRTLLM:
        return write_repository(out_dir, engine_repository(deployment))
    return write_repository(out_dir, llmapi_repository(deployment))


def package_plan(plan_path: Path, name: str | None, repo_dir: Path) -> Path:
    """Write the repository a TensorRT-LLM build plan will need, to ``repo_dir/name``, before building.

    Args:
        plan_path: output of ``specpipe build ... --dry-run --json``.
        name: repository name (default: the plan's engine name).
        repo_dir: repositories root (``triton_repo``).

    Raises:
        SpecpipeError: not a plan, another release, inconsistent settings, or no GPU in its memory plan.
    """
    deployment = from_plan(plan_path)
    return write_trtllm_repository(deployment, Path(repo_dir) / (name or deployment.name))


def repository_runtime(repo_dir: Path) -> str | None:
    """The runtime a repository was written for: ``specpipe.json``'s (TensorRT-LLM repositories), else
    ``"cpu"`` from the ``tensorrt_llm`` config of a CPU repository; ``None`` when neither says."""
    meta = read_meta(repo_dir)
    if meta is not None:
        return meta["runtime"]
    config_path = Path(repo_dir) / TENSORRT_LLM.name / "config.pbtxt"
    if not config_path.is_file():
        return None
    config = read_config(config_path)
    if RUNTIME_PARAMETER in config.parameters:
        return config.parameters[RUNTIME_PARAMETER].string_value
    return None
