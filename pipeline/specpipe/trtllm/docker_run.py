"""The ``docker run`` prefix of the TensorRT-LLM steps, as the calling user: one builder for the command
that runs (:meth:`specpipe.trtllm.executor.Executor.command`) and the one the plan prints
(:func:`specpipe.trtllm.executor.docker_prefix`), so the two cannot drift apart.

Without ``--user`` the container runs as root, and for anyone who runs docker as non-root (the ``docker``
group) every file a step writes into the engines root is root-owned: the host's write of the step marker
and the rename of ``<output>.partial`` fail right after the first step. Of the two ways out, running as
the calling user was chosen over having the host create and own each step's output folder first:

* the tools write more than their output folder. ``trtllm-build`` saves its timing cache to
  ``--output_timing_cache`` (default ``model.cache``, a path relative to the working directory:
  ``tensorrt_llm/builder.py`` ``build``, index id 205252225, and ``tensorrt_llm/commands/build.py``
  @ 65f1d1536e18aea3380e6e270e00895a709333eb); the first-contact check writes ``--report`` files; and
  files created inside a host-owned folder by root would still be root-owned, so the host could not
  delete them on a rebuild (``<output>.partial`` is removed before each run);
* as the calling user every file is the user's, whatever the tool writes and wherever.

The container's ``HOME`` is ``/root``, which that user cannot write, while the tools write caches under
``HOME``: Hugging Face's cache (``~/.cache/huggingface``: quantize.py's calibration dataset, tokenizers),
PyTorch's extension builds (``~/.cache/torch_extensions``: ``torch/utils/cpp_extension.py``
``get_default_build_root``, torch 2.13) and OpenAI Triton's kernel cache (``~/.triton/cache``:
triton-lang/triton ``python/triton/runtime/cache.py`` @ 3fb4e466bedf3bc790bbc92586fdabbb4fcd9e32). ``HOME`` is therefore
set to ``<engines root>/.trtllm-work/home``, which the host creates before the step; it lies under the
mounted root, so it is the same path inside and out and survives between steps and reruns (each cache is
filled once). ``TORCHINDUCTOR_CACHE_DIR`` needs nothing: torch names it after the uid when the uid has no
user name in the container's ``/etc/passwd`` (``torch/_inductor/runtime/cache_dir_utils.py``,
``default_cache_dir``).

When the host user is root, ``--user 0:0`` is what docker does anyway; the flag stays, so the command is
the same for everyone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from specpipe.trtllm import release
from specpipe.trtllm.plan import WORK_DIRNAME

HOME_DIRNAME = "home"
#: The flags the TensorRT-LLM/Triton docs use for these containers (shared memory and locked memory).
RUN_FLAGS = ("--gpus", "all", "--rm", "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")


def container_home(root: Path | str) -> Path:
    """The steps' ``HOME``: ``<root>/.trtllm-work/home`` (``root``: the mounted engines root)."""
    return Path(root) / WORK_DIRNAME / HOME_DIRNAME


def prepare_home(root: Path | str) -> Path:
    """Create :func:`container_home` as the calling user (before a docker step); returns it.

    Raises:
        OSError: the engines root is not writable (checked before any step by the build).
    """
    home = container_home(root)
    home.mkdir(parents=True, exist_ok=True)
    return home


def user_spec(uid: int | None = None, gid: int | None = None) -> str:
    """``UID:GID`` for ``docker run --user``: the calling process's real ids unless given."""
    return f"{os.getuid() if uid is None else uid}:{os.getgid() if gid is None else gid}"


#: Flags of a converter that make it calibrate on a Hub dataset (``--calib_dataset``, default
#: ``ccdv/cnn_dailymail``: ``examples/models/core/llama/convert_checkpoint.py``
#: @ fd96a08bdc489f41f139b295935b10ed43652fa1).
CALIBRATING_FLAGS = ("--smoothquant", "-sq", "--int8_kv_cache")


def reads_hub(argv: list[str]) -> bool:
    """Whether a container step's ``argv`` reads from the Hugging Face Hub, so needs ``HF_TOKEN``:
    ``quantize.py`` loads its calibration set from the Hub (``--calib_dataset``, default
    ``cnn_dailymail``: ``examples/quantization/quantize.py`` @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd),
    as a converter does with :data:`CALIBRATING_FLAGS`; every other step reads local folders only."""
    if any(token.endswith("/" + release.QUANTIZE) for token in argv):
        return True
    return any(token.endswith("convert_checkpoint.py") for token in argv) and any(f in argv for f in CALIBRATING_FLAGS)


def docker_run_prefix(
    root: Path | str,
    *,
    image: str = release.CONTAINER_IMAGE,
    env_passthrough: tuple[str, ...] = ("HF_TOKEN",),
    environ: Mapping[str, str] | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> list[str]:
    """``docker run ... IMAGE``: the vector a step's argv is appended to.

    ``root`` is mounted at the same path and is the working directory, so every path in the argv is valid
    inside; the step runs as ``--user UID:GID`` with ``HOME`` = :func:`container_home`; each variable of
    ``env_passthrough`` set (non-empty) in ``environ`` (default ``os.environ``) is passed by name
    (``-e HF_TOKEN``: the value never appears in the command or the log).
    """
    root = str(root)
    environ = os.environ if environ is None else environ
    prefix = [
        "docker",
        "run",
        *RUN_FLAGS,
        "--user",
        user_spec(uid, gid),
        "-e",
        f"HOME={container_home(root)}",
        "-v",
        f"{root}:{root}",
        "-w",
        root,
    ]
    for var in env_passthrough:
        if environ.get(var):
            prefix += ["-e", var]
    return [*prefix, image]
