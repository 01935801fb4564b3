"""The Triton model repository of a CPU-runtime engine: its model configs (written by :mod:`specpipe.triton.writer`).

Layout (the model names and ensemble wiring of TensorRT-LLM's ``inflight_batcher_llm`` repository,
NVIDIA/TensorRT-LLM @ 2a9abd95)::

    triton_repo/NAME/
      ensemble/config.pbtxt          platform ensemble: preprocessing -> tensorrt_llm -> postprocessing
      ensemble/1/
      preprocessing/config.pbtxt     python backend; tokenizer_dir
      preprocessing/1/model.py       imports specpipe.triton.models.preprocessing
      tensorrt_llm/config.pbtxt      python backend, decoupled, KIND_CPU x 1; gpt_model_path, tokenizer_dir
      tensorrt_llm/1/model.py        imports specpipe.triton.models.tensorrt_llm_cpu
      postprocessing/config.pbtxt    python backend; tokenizer_dir, engine_model_name (stops abandoned requests)
      postprocessing/1/model.py      imports specpipe.triton.models.postprocessing

Paths in the configs are absolute, so the repository can be served from any working directory. Only
``gpt_model_path`` points at the engine; the speculative settings stay in its manifest.
"""

from __future__ import annotations

from pathlib import Path

from specpipe import __version__
from specpipe.errors import SpecpipeError
from specpipe.manifest import Manifest
from specpipe.speculative import Runtime
from specpipe.triton.config import ensemble_model_config, python_model_config
from specpipe.triton.interface import CPU_ENSEMBLE, ENSEMBLE, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM
from specpipe.triton.models.common import parse_draft_lengths
from specpipe.triton.writer import MODULES, STEP_MODULES, Repository

#: ``tensorrt_llm`` parameter naming the runtime a repository was written for (CPU repositories).
RUNTIME_PARAMETER = "specpipe_runtime"


def cpu_repository(
    manifest: Manifest,
    engine_dir: Path,
    *,
    dense_rows: str = "auto",
    draft_lengths: str = "adaptive",
    warm_up: bool = True,
) -> Repository:
    """The repository of the CPU engine in ``engine_dir`` whose manifest is ``manifest``; ``dense_rows``
    (``auto``, ``all`` or a row count), ``draft_lengths`` (``adaptive`` or ``max``) and ``warm_up`` are
    written as the ``tensorrt_llm`` model's parameters of those names
    (:mod:`specpipe.triton.models.tensorrt_llm_cpu`).

    Raises:
        SpecpipeError: not a CPU engine, no target checkpoint directory, or ``draft_lengths`` is neither value.
    """
    try:
        draft_lengths = parse_draft_lengths(draft_lengths)
    except ValueError as exc:
        raise SpecpipeError(str(exc)) from None
    engine_dir = Path(engine_dir).resolve()
    if manifest.runtime is not Runtime.CPU:
        raise SpecpipeError(
            f"engine {engine_dir} is for runtime '{manifest.runtime.value}', not the CPU runtime: "
            f"package it with 'specpipe package'"
        )
    target = manifest.target.path
    tokenizer_dir = (engine_dir / target).resolve() if target else None
    if tokenizer_dir is None or not tokenizer_dir.is_dir():
        raise SpecpipeError(
            f"engine {engine_dir} has no target checkpoint directory ({target!r} in its manifest): rebuild it with 'specpipe build'"
        )
    common = {"tokenizer_dir": str(tokenizer_dir)}
    configs = {
        PREPROCESSING.name: python_model_config(PREPROCESSING, {**common, "add_special_tokens": "true"}),
        TENSORRT_LLM.name: python_model_config(
            TENSORRT_LLM,
            {
                **common,
                "gpt_model_path": str(engine_dir),
                "exclude_input_in_output": "false",
                "dense_rows": dense_rows,
                "draft_lengths": draft_lengths,
                "warm_up": "true" if warm_up else "false",
                RUNTIME_PARAMETER: Runtime.CPU.value,
                "engine_name": manifest.name,
                "specpipe_version": __version__,
            },
            decoupled=True,
        ),
        POSTPROCESSING.name: python_model_config(
            POSTPROCESSING, {**common, "skip_special_tokens": "true", "engine_model_name": TENSORRT_LLM.name}
        ),
        ENSEMBLE.name: ensemble_model_config(interface=CPU_ENSEMBLE),
    }
    return Repository(configs, modules={**STEP_MODULES, TENSORRT_LLM.name: MODULES["cpu_engine"]})
