"""The one place that pins the vLLM release specpipe generates ``vllm serve`` commands for.

Everything ``--runtime vllm`` emits (the ``vllm serve`` argument vector, its ``--speculative-config``
JSON, the container that runs it, the flag table in ``flags.json``) follows this release.

Sources:
    * The release: the newest ``vllm`` on PyPI when the pin was made (``pip index versions vllm``:
      0.34.0); its wheel ``vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl`` is what ``flags.json`` was
      read from (:mod:`specpipe.vllm.vendor`).
    * The image: vLLM publishes ``vllm/vllm-openai:v<version>`` on Docker Hub for each release; its
      entrypoint is ``vllm serve``, so the container's arguments are ``vllm serve``'s without the
      program name.
    * ``/health`` answers 200 once the engine is up (vLLM's OpenAI-compatible server); the API is on
      ``--port`` (default 8000, ``FrontendArgs.port`` in ``vllm/entrypoints/common/cli_args.py`` of the wheel).
"""

from __future__ import annotations

VLLM_VERSION = "0.34.0"
"""vLLM release the generated commands are valid for."""

IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
"""The vLLM OpenAI-compatible server image of :data:`VLLM_VERSION`."""

WHEEL = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
"""The wheel the flag table was read from (``pip download --no-deps vllm==0.34.0``)."""

DEFAULT_PORT = 8000
"""``vllm serve --port`` default (``FrontendArgs.port``)."""

HEALTH_PATH = "/health"
"""Readiness: 200 once the engine has loaded."""

CONTAINER_HF_HOME = "/root/.cache/huggingface"
"""Where the image's vLLM (running as root) keeps the Hugging Face cache; the host cache is mounted there."""


def summary() -> dict[str, str]:
    """The pin as recorded in plans and manifests."""
    return {"vllm": VLLM_VERSION, "image": IMAGE, "wheel": WHEEL}
