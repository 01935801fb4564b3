"""Triton Python-backend model of an LLM API repository: the TensorRT-LLM container's own LLM-API model.

The repository's ``tensorrt_llm/1/model.py`` imports :class:`TritonPythonModel` from here; this class
loads the container's implementation (``model.py`` in the directory named by the model parameter
:data:`MODEL_DIR_PARAMETER`, ``/app/all_models/llmapi/tensorrt_llm/1`` in the pinned release's
container: :data:`specpipe.trtllm.release.CONTAINER_LLMAPI_MODEL_DIR`) and hands every call to it.
That model reads ``model.yaml`` from the repository's model version directory (tensorrtllm_backend
``all_models/llmapi/tensorrt_llm/1/model.py`` @ c2e65b8), so there is one implementation of the
LLM-API model, TensorRT-LLM's, and specpipe only writes its arguments.

Only the standard library is imported here: the module is imported inside the serving container.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

#: config.pbtxt parameter: the directory of the container's LLM-API ``model.py``.
MODEL_DIR_PARAMETER = "llmapi_model_dir"


@functools.lru_cache(maxsize=None)
def container_model(directory: str) -> type:
    """``TritonPythonModel`` of ``directory/model.py``; ``directory`` goes on ``sys.path`` (its helpers module).

    Raises:
        FileNotFoundError: no ``model.py`` there (not the TensorRT-LLM container, or another release).
    """
    path = Path(directory) / "model.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: serve this repository in the TensorRT-LLM container "
            f"it was written for ('specpipe serve')"
        )
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def model_dir(config: dict[str, Any]) -> str:
    """The :data:`MODEL_DIR_PARAMETER` of a model config (as Triton passes it, a dict)."""
    return config["parameters"][MODEL_DIR_PARAMETER]["string_value"]


class TritonPythonModel:
    """Delegates to the container's LLM-API model (see the module docstring)."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        implementation = container_model(model_dir(auto_complete_model_config.as_dict()))
        hook = getattr(implementation, "auto_complete_config", None)
        return hook(auto_complete_model_config) if hook is not None else auto_complete_model_config

    def initialize(self, args: dict[str, str]) -> None:
        self._model = container_model(model_dir(json.loads(args["model_config"])))()
        initialize = getattr(self._model, "initialize", None)
        if initialize is not None:
            initialize(args)

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            finalize()
