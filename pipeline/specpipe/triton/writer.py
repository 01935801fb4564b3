"""The one Triton model-repository writer: every repository specpipe writes goes through :func:`write_repository`.

The CPU, engine-flow and LLM API modules (:mod:`specpipe.triton.cpu_repository`,
:mod:`specpipe.triton.trtllm_repository`, :mod:`specpipe.triton.llmapi`) only build a :class:`Repository`:
model configs as protobuf objects, which Python-backend models load which specpipe module, extra files.
This module writes it into a temporary directory beside the destination (``fsutil.write_dir_atomically``)::

    NAME/<model>/config.pbtxt      from the protobuf object
    NAME/<model>/1/                the version directory Triton requires
    NAME/<model>/1/model.py        Python-backend models: imports ``TritonPythonModel`` from a specpipe module
    NAME/<extra files>             e.g. ``specpipe.json``, ``model.yaml``

then checks what is on disk, not what was meant to be written: every config parsed back strictly, the
ensemble's wiring against the configs read back, no ``${`` placeholder anywhere. Only then is the
directory renamed into place; on any failure nothing is left behind and an existing repository is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from specpipe import __version__
from specpipe.fsutil import write_dir_atomically
from specpipe.triton.config import check_ensemble, check_no_placeholders, read_config, write_config
from specpipe.triton.interface import ENSEMBLE, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM_BLS

VERSION_DIR = "1"
MODEL_PY = "model.py"

#: Every Python-backend model specpipe ships, by role (a repository's ``model.py`` imports one of them).
MODULES = {
    PREPROCESSING.name: "specpipe.triton.models.preprocessing",
    POSTPROCESSING.name: "specpipe.triton.models.postprocessing",
    "cpu_engine": "specpipe.triton.models.tensorrt_llm_cpu",
    TENSORRT_LLM_BLS.name: "specpipe.triton.models.bls",
    "llmapi": "specpipe.triton.models.llmapi_shim",
}

#: The two steps around the engine model that every ensemble repository shares.
STEP_MODULES = {PREPROCESSING.name: MODULES[PREPROCESSING.name], POSTPROCESSING.name: MODULES[POSTPROCESSING.name]}


@dataclass
class Repository:
    """A model repository before it is written.

    Attributes:
        configs: model name -> config (an ``ensemble`` entry, if any, is checked against the others).
        modules: model name -> the specpipe module its ``model.py`` imports (Python-backend models).
        files: path relative to the repository root -> text (metadata, YAML options ...) or bytes (warm-up
            input data).
    """

    configs: dict[str, mc.ModelConfig]
    modules: dict[str, str] = field(default_factory=dict)
    files: dict[str, str | bytes] = field(default_factory=dict)


def model_py(module: str) -> str:
    """Text of a repository ``model.py`` that loads ``TritonPythonModel`` from ``module``."""
    return (
        f'"""Triton Python-backend entry point written by specpipe {__version__}; the model is {module}."""\n'
        f"from {module} import TritonPythonModel  # noqa: F401\n"
    )


def fill(root: Path, repository: Repository) -> None:
    """Write ``repository`` into the (empty) directory ``root`` and check what is on disk.

    Raises:
        SpecpipeError: the ensemble's wiring does not match the configs read back, a config does not
            parse strictly, or a placeholder was left.
    """
    if ENSEMBLE.name in repository.configs:
        check_ensemble(
            repository.configs[ENSEMBLE.name], {n: c for n, c in repository.configs.items() if n != ENSEMBLE.name}
        )
    for name, config in repository.configs.items():
        version_dir = root / name / VERSION_DIR
        version_dir.mkdir(parents=True)
        write_config(config, root / name)
        if name in repository.modules:
            (version_dir / MODEL_PY).write_text(model_py(repository.modules[name]))
    for relative, content in repository.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    on_disk = {name: read_config(root / name / "config.pbtxt") for name in repository.configs}
    if ENSEMBLE.name in on_disk:
        check_ensemble(on_disk.pop(ENSEMBLE.name), on_disk)
    check_no_placeholders(root)


def write_repository(out_dir: Path, repository: Repository) -> Path:
    """Write ``repository`` to ``out_dir`` (replaced as a whole, see the module docstring).

    Returns:
        the absolute path of the repository.
    """
    return write_dir_atomically(out_dir, lambda root: fill(root, repository))
