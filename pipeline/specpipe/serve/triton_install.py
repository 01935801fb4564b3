"""How specpipe runs the real Triton Inference Server shipped in the ``nvidia-pytriton`` wheel, on CPU.

The wheel (0.7.0: Triton 2.51.0) holds ``pytriton/tritonserver/bin/tritonserver``, its shared
libraries in ``nvidia_pytriton.libs/`` beside ``pytriton/``, the Python backend in
``pytriton/tritonserver/backends/python/`` and one Python-backend stub per CPython version in
``pytriton/tritonserver/python_backend_stubs/<X.Y>/``. specpipe does not import ``pytriton``; it
assembles a backends directory of its own under the cache (the backend + the stub for the running
interpreter) and starts the server with:

- ``LD_LIBRARY_PATH``: the wheel's libraries and the interpreter's own ``LIBDIR`` (otherwise the
  stub may load another ``libpython`` whose extension modules do not match);
- ``PATH`` starting with the interpreter's ``bin/`` directory (the stub finds its ``site-packages``,
  and with it specpipe, through the first ``python3`` on ``PATH``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.paths import cache_dir

WHEEL = "nvidia-pytriton"
STUB_NAME = "triton_python_backend_stub"
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of Triton are inside the installed ``nvidia-pytriton`` wheel.

    Attributes:
        binary: the ``tritonserver`` executable.
        libs_dir: the wheel's shared libraries (``nvidia_pytriton.libs``).
        python_backend_dir: ``backends/python`` (``libtriton_python.so`` + utils module).
        stub: the Python-backend stub built for the running interpreter's ``X.Y``.
        version: the wheel's version.
    """

    binary: Path
    libs_dir: Path
    python_backend_dir: Path
    stub: Path
    version: str


def find_triton() -> TritonInstall:
    """Locate Triton in the installed ``nvidia-pytriton`` wheel.

    Raises:
        SpecpipeError: the wheel is not installed, is incomplete, or has no stub for this Python.
    """
    fix = f"install it with 'pip install {WHEEL}==0.7.0' in this environment"
    try:
        dist = metadata.distribution(WHEEL)
    except metadata.PackageNotFoundError as exc:
        raise SpecpipeError(f"the Triton server wheel '{WHEEL}' is not installed: {fix}") from exc
    root = Path(dist.locate_file("pytriton")) / "tritonserver"
    libs = Path(dist.locate_file("nvidia_pytriton.libs"))
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        libs_dir=libs,
        python_backend_dir=root / "backends" / "python",
        stub=root / "python_backend_stubs" / py / STUB_NAME,
        version=dist.version,
    )
    for path in (install.binary, install.libs_dir, *(install.python_backend_dir / f for f in BACKEND_FILES)):
        if not path.exists():
            raise SpecpipeError(
                f"the '{WHEEL}' wheel is incomplete ({path} is missing): reinstall it with 'pip install --force-reinstall {WHEEL}==0.7.0'"
            )
    if not install.stub.is_file():
        available = (
            sorted(p.name for p in (root / "python_backend_stubs").iterdir())
            if (root / "python_backend_stubs").is_dir()
            else []
        )
        raise SpecpipeError(
            f"the '{WHEEL}' wheel has no Python-backend stub for Python {py} (it has {', '.join(available) or 'none'}): "
            f"run specpipe with one of those Python versions"
        )
    return install


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def prepare_backends_dir(install: TritonInstall, root: Path | None = None) -> Path:
    """A backends directory holding ``python/`` = the wheel's Python backend + this Python's stub.

    Made once per wheel and interpreter under ``root`` (default ``<cache>/triton/``), written to a
    temporary directory and renamed into place, so concurrent callers never see half a copy.

    Returns:
        the directory to pass as ``--backend-directory``.
    """
    sources = [install.python_backend_dir / f for f in BACKEND_FILES] + [install.stub]
    root = Path(root) if root is not None else cache_dir() / "triton"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = root / f"backends-{install.version}-py{py}-{_fingerprint(sources)}"
    if (target / "python" / STUB_NAME).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "python").mkdir(parents=True)
    for source in sources:
        shutil.copy2(source, tmp / "python" / source.name)
    try:
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
        if not (target / "python" / STUB_NAME).is_file():
            raise
    return target


def server_environment(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) with ``LD_LIBRARY_PATH`` and ``PATH``
    prefixed as the module doc says."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ld = (
        [str(install.libs_dir)]
        + ([libdir] if libdir else [])
        + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
    )
    env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    bin_dir = str(Path(sys.executable).parent)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    env["PATH"] = os.pathsep.join([bin_dir, *rest])
    return env


def server_command(
    install: TritonInstall,
    backends_dir: Path,
    repo_dir: Path,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    exit_timeout_s: int = 5,
) -> list[str]:
    """The ``tritonserver`` command line for ``repo_dir`` (absolute paths).

    ``exit_timeout_s``: how long Triton waits at exit for its models to unload (``--exit-timeout-secs``,
    default 30). A CPU deployment is drained before Triton is signalled (:meth:`specpipe.serve.local.LocalTritonServer.drain`),
    so the wait covers only Triton's own unloading, about a second; Triton 2.51 still kept a model "live"
    to the end of it in 6 of 17 stops measured after serving traffic (``tensorrt_llm``, never finalized).
    """
    return [
        str(install.binary),
        f"--model-repository={Path(repo_dir).absolute()}",
        f"--backend-directory={Path(backends_dir).absolute()}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
