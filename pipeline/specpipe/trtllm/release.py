"""The one place that pins the TensorRT-LLM release specpipe generates engine-flow commands for.

Everything the engine flow emits (``convert_checkpoint.py``/``quantize.py``/``trtllm-build`` argument
vectors, the container that runs them, the flag tables in ``flags/*.json``) follows this release.

Sources:
    * Release and container pairing: triton-inference-server/server
      ``docs/introduction/compatibility.md`` @ 4b54459107911180d3c3b24cea1c5bc832563c0a (on ``main``,
      2026-07-29, "Update default branches post-26.07"): the ``26.04``–``26.07`` ``trtllm-python-py3``
      images ship TensorRT-LLM 1.2.1 (TensorRT 10.14.1.48); ``26.03`` ships 1.2.0.
    * The Triton TensorRT-LLM backend builds against ``release/1.2.1`` (``TENSORRTLLM_VER=1.2.1``) from
      triton-inference-server/tensorrtllm_backend ``dockerfile/Dockerfile.triton.trt_llm_backend``
      @ 8addf2fdc58ac63cc6bfceded34e0960d241791f (#853, the first commit naming ``release/1.2.1``; its
      parent 98bfe1d1cd72fcaba53eebf35529f545c50c49dd still builds ``release/1.2`` = 1.2.0rc8) and copies TensorRT-LLM's ``examples`` to
      ``/app/examples`` (same file @ e1611ce8612ae4973a45f2bdc5e928061ff7d7e2, ``WORKDIR /app``).
    * The engine flow (``convert_checkpoint.py`` + ``trtllm-build``) is removed upstream after 1.2.x;
      1.2.x is the last line that ships it, hence the pin.
"""

from __future__ import annotations

import re

from specpipe.errors import SpecpipeError

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


#: Commits cited above, as read: repository -> full sha -> what it was read for. Kept consistent with the
#: docstrings by ``tests/trtllm/test_release_citations.py``.
VERIFIED_COMMITS: dict[str, dict[str, str]] = {
    "triton-inference-server/server": {
        "4b54459107911180d3c3b24cea1c5bc832563c0a": "docs/introduction/compatibility.md, trtllm-python-py3 table",
    },
    "triton-inference-server/tensorrtllm_backend": {
        "8addf2fdc58ac63cc6bfceded34e0960d241791f": "Dockerfile: TENSORRTLLM_REPO_TAG=release/1.2.1 (#853)",
        "98bfe1d1cd72fcaba53eebf35529f545c50c49dd": "parent of 8addf2f: still release/1.2, 1.2.0rc8",
        "e1611ce8612ae4973a45f2bdc5e928061ff7d7e2": "Dockerfile: WORKDIR /app, examples and all_models copied",
    },
}

# --- Triton container tags and the TensorRT-LLM release each ships -----------------------------------

CONTAINER_REPOSITORY = "nvcr.io/nvidia/tritonserver"
CONTAINER_FLAVOUR = "trtllm-python-py3"

#: Triton release (``YY.MM``) -> TensorRT-LLM release in its ``trtllm-python-py3`` image. Source:
#: triton-inference-server/server ``docs/introduction/compatibility.md`` @ 4b54459107911180d3c3b24cea1c5bc832563c0a
#: ("Container Name: trtllm-python-py3" table, column "TensorRT-LLM version"), every row of it.
CONTAINER_RELEASES: dict[str, str] = {
    "24.04": "0.9.0",
    "24.05": "0.9.0",
    "24.06": "0.10.0",
    "24.07": "0.11.0",
    "24.08": "0.12.0",
    "24.09": "0.13.0",
    "24.10": "0.14.0",
    "24.11": "0.15.0",
    "24.12": "0.16.0",
    "25.01": "0.17.0",
    "25.02": "0.17.0.post1",
    "25.03": "0.18.0",
    "25.04": "0.18.2",
    "25.05": "0.19.0",
    "25.06": "0.20.0",
    "25.07": "0.20.0",
    "25.08": "0.21.0",
    "25.09": "1.0.0",
    "25.10": "1.0.0",
    "25.11": "1.0.3.2510",
    "25.12": "1.1.0",
    "26.01": "1.1.0",
    "26.02": "1.1.0",
    "26.03": "1.2.0",
    "26.04": "1.2.1",
    "26.05": "1.2.1",
    "26.06": "1.2.1",
    "26.07": "1.2.1",
}

CONTAINER_LLMAPI_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
"""Where the Triton TensorRT-LLM image keeps the LLM-API Python model (``model.py`` + ``helpers.py``):
TensorRT-LLM's ``triton_backend/all_models`` is copied to ``/app/all_models``
(tensorrtllm_backend ``dockerfile/Dockerfile.triton.trt_llm_backend`` @ e1611ce8612ae4973a45f2bdc5e928061ff7d7e2)."""

_TAG = re.compile(r"^(?:.+/)?tritonserver:(\d\d\.\d\d)-trtllm-python-py3$")


class UnknownContainerError(SpecpipeError):
    """A container tag whose TensorRT-LLM release specpipe does not know."""


class ReleaseMismatchError(SpecpipeError):
    """Container and engine were made with different TensorRT-LLM releases."""


def container_image(triton_release: str) -> str:
    """``nvcr.io/nvidia/tritonserver:<YY.MM>-trtllm-python-py3``."""
    return f"{CONTAINER_REPOSITORY}:{triton_release}-{CONTAINER_FLAVOUR}"


def container_trtllm_release(image: str) -> str:
    """TensorRT-LLM release shipped in the Triton container ``image``.

    Raises:
        UnknownContainerError: not a ``tritonserver:<YY.MM>-trtllm-python-py3`` tag, or a Triton
            release missing from :data:`CONTAINER_RELEASES`.
    """
    match = _TAG.match(image.strip())
    if match is None:
        raise UnknownContainerError(
            f"container {image!r} is not a Triton TensorRT-LLM image ({CONTAINER_REPOSITORY}:<YY.MM>-{CONTAINER_FLAVOUR}): "
            f"use {CONTAINER_IMAGE}"
        )
    triton = match.group(1)
    if triton not in CONTAINER_RELEASES:
        raise UnknownContainerError(
            f"container {image} is Triton {triton}, whose TensorRT-LLM release specpipe does not know (known: "
            f"{min(CONTAINER_RELEASES)} to {max(CONTAINER_RELEASES)}): use {CONTAINER_IMAGE}"
        )
    return CONTAINER_RELEASES[triton]


def check_container_for_engine(image: str, engine_release: str, engine: str) -> None:
    """Refuse to serve an engine built with TensorRT-LLM ``engine_release`` in ``image``.

    TensorRT engines load only in the TensorRT-LLM/TensorRT release that built them.

    Raises:
        UnknownContainerError: see :func:`container_trtllm_release`.
        ReleaseMismatchError: the container ships another TensorRT-LLM release than the engine's.
    """
    shipped = container_trtllm_release(image)
    if shipped != engine_release:
        matching = sorted(t for t, r in CONTAINER_RELEASES.items() if r == engine_release)
        fix = f"use {container_image(matching[0])}" if matching else f"rebuild the engine with TensorRT-LLM {shipped}"
        raise ReleaseMismatchError(
            f"container {image} ships TensorRT-LLM {shipped}, engine {engine} was built with {engine_release}: {fix}"
        )
