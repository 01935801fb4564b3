"""The one place that pins the TensorRT-LLM release specpipe generates engine-flow commands for.

Everything the engine flow emits (``convert_checkpoint.py``/``quantize.py``/``trtllm-build`` argument
vectors, the container that runs them, the flag tables in ``flags/*.json``) follows this release.

Sources:
    * Release and container pairing: triton-inference-server/server
      ``docs/introduction/compatibility.md`` @ 0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a: the
      ``26.04``–``26.07`` ``trtllm-python-py3`` images ship TensorRT-LLM 1.2.1 (TensorRT 10.14.1.48);
      ``26.03`` ships 1.2.0.
    * The Triton TensorRT-LLM backend builds against ``release/1.2.1``
      (triton-inference-server/tensorrtllm_backend ``dockerfile/Dockerfile.triton.trt_llm_backend``
      @ 9e828d3d70e80a0a1794a94b5b89fb23dfb9e160) and copies TensorRT-LLM's ``examples`` to
      ``/app/examples`` (same file @ e1611ce8612ae4973a45f2bdc5e928061ff7d7e2, ``WORKDIR /app``).
    * The engine flow (``convert_checkpoint.py`` + ``trtllm-build``) is removed upstream after 1.2.x;
      1.2.x is the last line that ships it, hence the pin.
"""

from __future__ import annotations

TRTLLM_VERSION = "1.2.1"
"""TensorRT-LLM release the generated commands are valid for."""

TRITON_RELEASE = "26.04"
"""First Triton container release that ships :data:`TRTLLM_VERSION`."""

CONTAINER_IMAGE = f"nvcr.io/nvidia/tritonserver:{TRITON_RELEASE}-trtllm-python-py3"
"""Triton + TensorRT-LLM container: builds engines and later serves them (same TensorRT)."""

TENSORRT_VERSION = "10.14.1.48"

CONTAINER_EXAMPLES_ROOT = "/app/examples"
"""Where TensorRT-LLM's ``examples/`` tree lies inside :data:`CONTAINER_IMAGE`."""

EXAMPLES_ENV = "SPECPIPE_TRTLLM_EXAMPLES"
"""Environment variable naming a local checkout's ``examples/`` tree (local executor)."""

# Example scripts, relative to the examples root (TensorRT-LLM >= 0.17 layout).
LLAMA_CONVERT = "models/core/llama/convert_checkpoint.py"
EAGLE_CONVERT = "eagle/convert_checkpoint.py"
MEDUSA_CONVERT = "medusa/convert_checkpoint.py"
QUANTIZE = "quantization/quantize.py"


def summary() -> dict[str, str]:
    """The pin as recorded in plans and manifests."""
    return {
        "tensorrt_llm": TRTLLM_VERSION,
        "tensorrt": TENSORRT_VERSION,
        "container_image": CONTAINER_IMAGE,
        "examples_root_in_container": CONTAINER_EXAMPLES_ROOT,
    }
