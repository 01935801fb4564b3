"""``specpipe package``: write the Triton model repository of a built engine (or of a build plan).

TensorRT-LLM engines go to :mod:`specpipe.triton.trtllm_repository` (engine flow) and
:mod:`specpipe.triton.llmapi` (LLM API flow), chosen by the manifest's ``runtime``.

Layout for a CPU-runtime engine (the model names and ensemble wiring of TensorRT-LLM's
``inflight_batcher_llm`` repository, NVIDIA/TensorRT-LLM @ 2a9abd95)::

    triton_repo/NAME/
      ensemble/config.pbtxt          platform ensemble: preprocessing -> tensorrt_llm -> postprocessing
      ensemble/1/
      preprocessing/config.pbtxt     python backend; tokenizer_dir
      preprocessing/1/model.py       imports specpipe.triton.models.preprocessing
      tensorrt_llm/config.pbtxt      python backend, decoupled, KIND_CPU x 1; gpt_model_path, tokenizer_dir
      tensorrt_llm/1/model.py        imports specpipe.triton.models.tensorrt_llm_cpu
      postprocessing/config.pbtxt    python backend; tokenizer_dir
      postprocessing/1/model.py      imports specpipe.triton.models.postprocessing

Paths in the configs are absolute, so the repository can be served from any working directory.
The repository is written into a temporary directory beside the destination, checked (every
config parsed back strictly, the ensemble wiring cross-checked, no ``${`` anywhere) and only then
renamed into place; on any failure nothing is left behind and an existing repository is untouched.
"""

from __future__ import annotations

from pathlib import Path

from specpipe import __version__
from specpipe.errors import SpecpipeError
from specpipe.manifest import read_manifest_json
from specpipe.triton.config import (
    check_ensemble,
    check_no_placeholders,
    ensemble_model_config,
    python_model_config,
    read_config,
    write_config,
)
from specpipe.triton.interface import ENSEMBLE, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM

VERSION_DIR = "1"
RUNTIME_PARAMETER = "specpipe_runtime"

#: Python-backend model name -> module implementing ``TritonPythonModel``.
MODEL_MODULES = {
    PREPROCESSING.name: "specpipe.triton.models.preprocessing",
    TENSORRT_LLM.name: "specpipe.triton.models.tensorrt_llm_cpu",
    POSTPROCESSING.name: "specpipe.triton.models.postprocessing",
}


def model_py(module: str) -> str:
    """Text of a repository ``model.py`` that loads ``TritonPythonModel`` from ``module``."""
    return (
        f'"""Triton Python-backend entry point written by specpipe {__version__}; the model is {module}."""\n'
        f"from {module} import TritonPythonModel  # noqa: F401\n"
    )


def _engine_paths(engine_dir: Path) -> tuple[dict, Path, Path]:
    """Manifest, absolute engine dir and absolute tokenizer dir of a CPU engine.

    Raises:
        SpecpipeError: missing engine or manifest, other specpipe version, not a CPU engine, or no
            target checkpoint directory.
    """
    manifest = read_manifest_json(engine_dir)
    engine_dir = Path(engine_dir).resolve()
    runtime = manifest.get("runtime")
    if runtime != "cpu":
        raise SpecpipeError(f"engine {engine_dir} is for runtime '{runtime}', not the CPU runtime: package it with 'specpipe package'")
    target = (manifest.get("target") or {}).get("path")
    tokenizer_dir = (engine_dir / target).resolve() if target else None
    if tokenizer_dir is None or not tokenizer_dir.is_dir():
        raise SpecpipeError(
            f"engine {engine_dir} has no target checkpoint directory ({target!r} in its manifest): rebuild it with 'specpipe build'"
        )
    return manifest, engine_dir, tokenizer_dir


def _write_repository(root: Path, manifest: dict, engine_dir: Path, tokenizer_dir: Path) -> None:
    common = {"tokenizer_dir": str(tokenizer_dir)}
    step_configs = {
        PREPROCESSING.name: python_model_config(PREPROCESSING, {**common, "add_special_tokens": "true"}),
        TENSORRT_LLM.name: python_model_config(
            TENSORRT_LLM,
            {
                **common,
                "gpt_model_path": str(engine_dir),
                "exclude_input_in_output": "false",
                RUNTIME_PARAMETER: "cpu",
                "engine_name": str(manifest.get("name", engine_dir.name)),
                "specpipe_version": __version__,
            },
            decoupled=True,
        ),
        POSTPROCESSING.name: python_model_config(POSTPROCESSING, {**common, "skip_special_tokens": "true"}),
    }
    ensemble = ensemble_model_config()
    check_ensemble(ensemble, step_configs)
    for name, config in {**step_configs, ENSEMBLE.name: ensemble}.items():
        version_dir = root / name / VERSION_DIR
        version_dir.mkdir(parents=True)
        write_config(config, root / name)
        if name in MODEL_MODULES:
            (version_dir / "model.py").write_text(model_py(MODEL_MODULES[name]))
    # Check what is on disk, not what was meant to be written.
    on_disk = {name: read_config(root / name / "config.pbtxt") for name in step_configs}
    check_ensemble(read_config(root / ENSEMBLE.name / "config.pbtxt"), on_disk)
    check_no_placeholders(root)


def package_engine(engine_dir: Path, out_dir: Path) -> Path:
    """Write the Triton model repository for the engine in ``engine_dir`` to ``out_dir``.

    ``out_dir`` is replaced as a whole (written beside it, then renamed into place). The writer is
    chosen by the manifest's ``runtime``: CPU, TensorRT-LLM engine flow or LLM API.

    Returns:
        the absolute path of the repository (``out_dir``).

    Raises:
        SpecpipeError: the engine directory is missing, has no manifest, was built by another
            specpipe version or TensorRT-LLM release, or the written repository fails its checks.
    """
    from specpipe.fsutil import write_dir_atomically

    runtime = read_manifest_json(engine_dir).get("runtime")
    if runtime in ("trtllm", "trtllm-llmapi"):
        from specpipe.triton.deployment import from_manifest

        return write_trtllm_repository(from_manifest(engine_dir), out_dir)
    manifest, engine_dir, tokenizer_dir = _engine_paths(Path(engine_dir))
    return write_dir_atomically(out_dir, lambda root: _write_repository(root, manifest, engine_dir, tokenizer_dir))


def write_trtllm_repository(deployment, out_dir: Path) -> Path:
    """The engine-flow or LLM API repository of a :class:`~specpipe.triton.deployment.Deployment`."""
    if deployment.runtime == "trtllm":
        from specpipe.triton.trtllm_repository import write_engine_repository

        return write_engine_repository(deployment, out_dir)
    from specpipe.triton.llmapi import write_llmapi_repository

    return write_llmapi_repository(deployment, out_dir)


def package_plan(plan_path: Path, name: str | None, repo_dir: Path) -> Path:
    """Write the repository a TensorRT-LLM build plan will need, to ``repo_dir/name``, before building.

    Args:
        plan_path: output of ``specpipe build ... --dry-run --json``.
        name: repository name (default: the plan's engine name).
        repo_dir: repositories root (``triton_repo``).

    Raises:
        SpecpipeError: not a plan, another release, inconsistent settings, or no GPU in its memory plan.
    """
    from specpipe.triton.deployment import from_plan

    deployment = from_plan(plan_path)
    return write_trtllm_repository(deployment, Path(repo_dir) / (name or deployment.name))


def repository_runtime(repo_dir: Path) -> str | None:
    """The runtime a repository was written for: ``specpipe.json``'s (TensorRT-LLM repositories), else
    ``"cpu"`` from the ``tensorrt_llm`` config of a CPU repository; ``None`` when neither says."""
    from specpipe.triton.repo_meta import read_meta

    meta = read_meta(repo_dir)
    if meta is not None:
        return meta["runtime"]
    if not (Path(repo_dir) / TENSORRT_LLM.name / "config.pbtxt").is_file():
        return None
    config = read_config(Path(repo_dir) / TENSORRT_LLM.name / "config.pbtxt")
    if RUNTIME_PARAMETER in config.parameters:
        return config.parameters[RUNTIME_PARAMETER].string_value
    return None
