"""Which protocol a port speaks (``specpipe.client.probe``), against real servers of each kind."""

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from loopback import free_port

from specpipe.client.probe import not_grpc_hint, not_http_hint, port_protocol, split_host_port


class _Quiet(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def http1_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_port():
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


@pytest.fixture
def silent_port():
    """A TCP server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield listener.getsockname()[1]
    listener.close()


def test_port_protocol_tells_http1_from_grpc(http1_port, grpc_port, silent_port):
    assert port_protocol("127.0.0.1", http1_port) == "http/1"
    assert port_protocol("127.0.0.1", grpc_port) == "http/2"
    assert port_protocol("127.0.0.1", free_port()) is None  # nothing listens
    assert port_protocol("127.0.0.1", silent_port, timeout_s=0.3) is None


def test_hints_name_the_wrong_port_only_where_it_is_one(http1_port, grpc_port):
    assert not_grpc_hint(f"127.0.0.1:{http1_port}").startswith(f"127.0.0.1:{http1_port} answers plain HTTP, not gRPC")
    assert "give the deployment's gRPC port" in not_grpc_hint(f"127.0.0.1:{http1_port}")
    assert not_grpc_hint(f"127.0.0.1:{grpc_port}") == ""
    assert not_grpc_hint(f"127.0.0.1:{free_port()}") == ""
    hint = not_http_hint(f"http://127.0.0.1:{grpc_port}/v1")
    assert hint.startswith(f"127.0.0.1:{grpc_port} answers HTTP/2 as gRPC servers do") and "--openai-port" in hint
    assert not_http_hint(f"http://127.0.0.1:{http1_port}/v1") == ""


@pytest.mark.parametrize(
    "address, expected",
    [
        ("localhost:8001", ("localhost", 8001)),
        ("http://10.0.0.2:8000/v1", ("10.0.0.2", 8000)),
        ("[::1]:8001", ("::1", 8001)),
        ("localhost", None),
        ("http://host/v1", None),
    ],
)
def test_split_host_port(address, expected):
    assert split_host_port(address) == expected
