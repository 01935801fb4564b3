"""``specpipe serve``: start Triton on a model repository and keep it running until Ctrl-C.

The CPU runtime runs the Triton server of the ``nvidia-pytriton`` wheel on this machine
(:mod:`specpipe.serve.local`). TensorRT-LLM runtimes (engine flow and LLM API) are served from their
container (:mod:`specpipe.serve.trtllm`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from specpipe.errors import SpecpipeError
from specpipe.openai import LOCAL_HOST
from specpipe.progress import out, warn
from specpipe.serve.gateway import GatewayRequest, start_gateway
from specpipe.serve.local import LocalTritonServer
from specpipe.serve.model_processes import supervise
from specpipe.serve.ports import check_ports
from specpipe.serve.stop_signals import StopSignals
from specpipe.serve.triton_log import EXIT_TIMEOUT_LINE, log_tail
from specpipe.serve.trtllm import check_engine_built, container_launch, run_container
from specpipe.triton.repo_meta import read_meta
from specpipe.triton.repository import repository_runtime

__all__ = ["ServeRequest", "serve", "serve_repository", "resolve_runtime"]

#: Seconds the running requests of a CPU deployment get to finish after Ctrl-C (Triton's exit timeout).
DRAIN_S = 10.0


@dataclass(frozen=True)
class ServeRequest:
    """What ``specpipe serve`` was asked to do.

    Attributes:
        repo_dir: the Triton model repository (``triton_repo/NAME``).
        grpc_port, http_port, metrics_port: Triton's ports.
        runtime: ``auto`` (read from the repository), ``cpu``, ``trtllm`` or ``trtllm-llmapi``.
        print_only: print the launch command instead of running it.
        container: TensorRT-LLM runtimes: the Triton TensorRT-LLM image (``None``: the engine's).
        gpus: TensorRT-LLM runtimes: GPU ids, TP x PP of them (``None``: 0..TPxPP-1).
        openai_port: also serve the OpenAI-compatible API on this port.
        openai_host: the address the OpenAI API binds (loopback by default; ``0.0.0.0``: every interface).
        api_key: the key OpenAI clients must send (``Authorization: Bearer KEY``); ``None``: no key.
    """

    repo_dir: Path
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    runtime: str = "auto"
    print_only: bool = False
    container: str | None = None
    gpus: str | None = None
    openai_port: int | None = None
    openai_host: str = LOCAL_HOST
    api_key: str | None = None


def resolve_runtime(repo_dir: Path, runtime: str) -> str:
    """The runtime to serve ``repo_dir`` with: ``runtime`` itself, or for ``"auto"`` the one recorded
    in the repository (``"cpu"`` for repositories written by ``specpipe package`` for CPU engines).

    Raises:
        SpecpipeError: no repository at ``repo_dir``, or ``auto`` cannot tell its runtime.
    """
    repo_dir = Path(repo_dir)
    if not (repo_dir / "ensemble").is_dir() and not (repo_dir / "specpipe.json").is_file():
        parent = repo_dir.parent
        others = sorted(p.name for p in parent.iterdir() if (p / "ensemble").is_dir()) if parent.is_dir() else []
        raise SpecpipeError(
            f"no Triton model repository at {repo_dir}: run 'specpipe package {repo_dir.name}' first"
            + (f" (packaged in {parent}: {', '.join(others)})" if others else "")
        )
    if runtime != "auto":
        return runtime
    found = repository_runtime(repo_dir)
    if found is None:
        raise SpecpipeError(
            f"cannot tell which runtime {repo_dir} was written for: pass --runtime cpu or --runtime trtllm"
        )
    return found


def serve_repository(repo_dir: Path, **options) -> None:
    """:func:`serve` with the :class:`ServeRequest` fields given as keywords."""
    serve(ServeRequest(Path(repo_dir), **options))


def serve(request: ServeRequest) -> None:
    """Serve ``request.repo_dir`` until Ctrl-C (a ``KeyboardInterrupt``) or, with ``print_only``, print how to.

    For the CPU runtime: start ``tritonserver``, wait until it is ready, print the endpoints, block,
    then stop the server cleanly: new requests are refused at once, running ones get :data:`DRAIN_S`
    seconds to finish (a second Ctrl-C ends them) and those still running then end with a "server
    stopping" error (:meth:`LocalTritonServer.drain`); the gateway's ``/health`` answers 503 meanwhile.
    SIGTERM counts as Ctrl-C, and signals after the first only hurry the stop
    (:class:`~specpipe.serve.stop_signals.StopSignals`). With ``print_only``: print the environment and
    the exact command line (stdout), start nothing.

    TensorRT-LLM runtimes: the serving container (``container`` overrides the Triton TensorRT-LLM image
    recorded in the repository; ``gpus`` names the GPU ids, TP x PP of them).

    ``openai_port``: also serve the OpenAI-compatible API (``/v1/models``, ``/v1/completions``,
    ``/v1/chat/completions``, ``/metrics``) on that port of ``openai_host``, translating to the
    ensemble over gRPC (:mod:`specpipe.openai`); with ``api_key``, clients must send it.

    Raises:
        SpecpipeError: no repository, a busy port, a server that fails to start, dies, or does not
            exit cleanly when stopped (a crash, a status other than 0); for
            TensorRT-LLM: a container of another or unknown release, a GPU count other than TP x PP,
            an engine not built yet.
    """
    repo_dir, grpc_port, openai_port = Path(request.repo_dir), request.grpc_port, request.openai_port
    runtime = resolve_runtime(repo_dir, request.runtime)
    if runtime != "cpu":
        gateway = None if request.print_only or openai_port is None else _start_gateway(repo_dir.name, request)
        try:
            _serve_container(
                repo_dir,
                runtime,
                {"http": request.http_port, "grpc": grpc_port, "metrics": request.metrics_port},
                request.print_only,
                request.container,
                request.gpus,
            )
        finally:
            if gateway is not None:
                gateway.stop()
        return
    server = LocalTritonServer(
        repo_dir, grpc_port=grpc_port, http_port=request.http_port, metrics_port=request.metrics_port
    )
    if request.print_only:
        for line in server.shell_lines():
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    if openai_port is not None:
        check_ports(
            {"gRPC": grpc_port, "HTTP": request.http_port, "metrics": request.metrics_port, "openai": openai_port}
        )
    gateway, interrupted = None, False
    with StopSignals(hurry=server.hurry) as signals:
        try:
            server.start()
            out.print(
                f"starting Triton on {server.repo_dir} (log: {server.log_path}) ...", markup=False, highlight=False
            )
            server.wait_ready()
            cold = server.cold_start()
            if cold is not None:
                out.print(f"Triton {cold.summary()}", markup=False, highlight=False)
            if openai_port is not None:
                gateway = _start_gateway(server.repo_dir.name, request)
            _print_endpoints(server, gateway)
            supervise(server)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            signals.hold()
            code = _stop(server, gateway, interrupted)
    if interrupted and code and not (code == -signal.SIGTERM and server.ready_after_s is None):
        _report_unclean_exit(server, code)  # Triton dies of SIGTERM while loading: not a failure


def _stop(server: LocalTritonServer, gateway, interrupted: bool) -> int | None:
    """Stop the gateway and the server; after Ctrl-C a ready server drains first (:data:`DRAIN_S`),
    one still starting has nothing to drain. Returns Triton's exit status."""
    ready = server.ready_after_s is not None
    if gateway is not None:
        gateway.gateway.stopping = True  # its /health answers 503 while the server drains
    if interrupted and ready:
        _say(f"stopping Triton: running requests get {DRAIN_S:g} s to finish (Ctrl-C again ends them now) ...")
        server.drain(DRAIN_S)
    elif interrupted:
        _say("stopping Triton (it was not ready yet) ...")
    if gateway is not None:
        gateway.stop()
    return server.stop(drain_s=0.0 if ready else None)


def _say(message: str) -> None:
    """Print a line while stopping; a terminal already gone (SIGHUP) must not interrupt the stop."""
    try:
        out.print(message, markup=False, highlight=False)
    except OSError:
        pass


def _report_unclean_exit(server: LocalTritonServer, code: int) -> None:
    """After Ctrl-C: a crash or an unknown status is an error; Triton's own "Exit timeout expired"
    (status 1: it still held a request, all of them having been answered) only a warning."""
    if code == 1 and EXIT_TIMEOUT_LINE in log_tail(server.log_path, 5):
        warn(f"Triton still held a finished request and waited its exit timeout (log: {server.log_path})")
        return
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    raise server.failure(f"tritonserver {how} while stopping")


def _serve_container(
    repo_dir: Path, runtime: str, ports: dict[str, int], print_only: bool, container: str | None, gpus: str | None
) -> None:
    meta = read_meta(repo_dir)
    if meta is None:
        raise SpecpipeError(
            f"{repo_dir} was not written for a TensorRT-LLM runtime (no specpipe.json): serve it with --runtime cpu"
        )
    if meta["runtime"] != runtime:
        raise SpecpipeError(
            f"{repo_dir} was written for --runtime {meta['runtime']}, not {runtime}: pass --runtime {meta['runtime']}"
        )
    launch = container_launch(repo_dir, meta, container=container, gpus=gpus, ports=ports)
    if print_only:
        for line in launch.shell_lines():
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    check_engine_built(meta)
    out.print(
        f"starting {launch.image} (build it first with: {launch.shell_lines()[0]})", markup=False, highlight=False
    )
    code = run_container(launch)
    if code != 0:
        raise SpecpipeError(f"the serving container exited with status {code}: see its output above")


def _start_gateway(name: str, request: ServeRequest):
    """Start the OpenAI-compatible gateway for deployment ``name`` (:mod:`specpipe.serve.gateway`)."""
    return start_gateway(
        GatewayRequest(
            f"localhost:{request.grpc_port}", name, request.openai_port, request.openai_host, request.api_key
        )
    )


def _print_endpoints(server, gateway=None) -> None:
    table = Table(title=f"Triton is serving {server.repo_dir.name}", show_header=False)
    table.add_row("gRPC", server.grpc_url)
    table.add_row("HTTP", server.http_url)
    table.add_row("metrics", server.metrics_url)
    table.add_row("model", "ensemble (text_input, max_tokens, stream ... -> text_output)")
    if gateway is not None:
        table.add_row("OpenAI API", f"{gateway.url} (model '{server.repo_dir.name}'; /metrics beside it)")
    table.add_row("log", str(server.log_path))
    out.print(table)
    out.print("Ctrl-C stops the server.")
