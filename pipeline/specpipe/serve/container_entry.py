"""Entry point of the serving image: start Triton on the repository mounted at ``/models``.

``python3 -m specpipe.serve.container_entry`` reads ``/models/specpipe.json`` and replaces itself with
the command :func:`specpipe.serve.trtllm.server_command` gives, in the environment
:func:`specpipe.serve.trtllm.server_environment` gives (orchestrator mode for draft-target on several GPUs) (``mpirun`` with one rank per GPU for
a multi-GPU engine), so compose files and Kubernetes manifests need no per-engine command. Exits with
status 2 and a one-line message when the repository is missing or not a TensorRT-LLM one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.serve.trtllm import server_command, server_environment
from specpipe.triton.deployment import CONTAINER_REPO
from specpipe.triton.repo_meta import read_meta


def command(repo: Path = Path(CONTAINER_REPO)) -> list[str]:
    """The server command for the repository at ``repo``.

    Raises:
        SpecpipeError: no TensorRT-LLM repository there.
    """
    meta = read_meta(repo)
    if meta is None:
        raise SpecpipeError(f"no specpipe TensorRT-LLM repository at {repo}: mount triton_repo/NAME there (read-only)")
    return server_command(meta)


def main() -> None:
    try:
        argv = command()
    except SpecpipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    env = server_environment(read_meta(Path(CONTAINER_REPO)))
    print("specpipe: " + " ".join([f"{k}={v}" for k, v in env.items()] + argv), flush=True)
    os.execvpe(argv[0], argv, {**os.environ, **env})


if __name__ == "__main__":
    main()
