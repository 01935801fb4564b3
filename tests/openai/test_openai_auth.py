"""The gateway's API key and bind address (issue 32): through the real aiohttp app and sockets, with the
in-process fake ensemble (:mod:`openai_fake`), the official ``openai`` client, and ``specpipe gateway``
run alone in a subprocess against a Triton address where nothing listens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import psutil
import pytest
from click.testing import CliRunner
from loopback import free_port
from openai_fake import FakeLLM, tokenizer_dir

from specpipe.cli import main
from specpipe.openai.auth import APIKeyError, bearer_token, resolve_api_key
from specpipe.openai.http_server import GatewayServer
from specpipe.openai.server import Gateway
from specpipe.serve import ServeRequest
from specpipe.serve.gateway import GatewayRequest, start_gateway

NAME = "fake-deployment"
KEY = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return str(tokenizer_dir(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def server(tokenizer):
    with GatewayServer(
        Gateway("unused:0", NAME, tokenizer_dir=tokenizer, client=FakeLLM()), free_port(), api_key=KEY
    ) as running:
        yield running


def call(server, path, headers=None, body=None):
    """(status, headers, parsed JSON or text) of a request to ``server``."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            text = reply.read().decode()
            return (
                reply.status,
                reply.headers,
                json.loads(text) if reply.headers.get_content_type() == "application/json" else text,
            )
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


COMPLETION = {"model": NAME, "prompt": "Fruits:", "max_tokens": 5, "temperature": 0}


def test_a_request_without_the_key_gets_openais_401(server):
    status, headers, body = call(server, "/v1/completions", body=COMPLETION)
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="specpipe"'
    assert body == {
        "error": {"message": body["error"]["message"], "type": "invalid_request_error", "param": None, "code": None}
    }
    assert body["error"]["message"].startswith("You didn't provide an API key.")
    for headers in ({"Authorization": "Basic " + KEY}, {"Authorization": "Bearer"}, {"Authorization": ""}):
        assert call(server, "/v1/models", headers)[2]["error"]["code"] is None


@pytest.mark.parametrize("wrong", ["sk-test", KEY + "x", KEY.upper(), "Bearer"])
def test_a_wrong_key_gets_invalid_api_key(server, wrong):
    status, _, body = call(
        server,
        "/v1/chat/completions",
        {"Authorization": f"Bearer {wrong}"},
        {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert status == 401
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key"
    assert KEY not in json.dumps(body)


def test_the_key_lets_requests_through(server):
    status, _, body = call(server, "/v1/completions", {"Authorization": f"Bearer {KEY}"}, COMPLETION)
    assert status == 200 and body["object"] == "text_completion" and body["choices"][0]["text"]
    assert (
        call(server, "/v1/models", {"Authorization": f"bearer  {KEY} "})[0] == 200
    )  # scheme case-insensitive, spaces trimmed


def test_the_openai_client_with_and_without_the_key(server):
    good = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list()] == [NAME]
    reply = good.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "List fruits."}], max_tokens=4
    )
    assert reply.choices[0].message.content
    bad = openai.OpenAI(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.completions.create(**COMPLETION)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"


def test_health_and_metrics_stay_open_other_paths_do_not(server):
    assert call(server, "/health")[:1] == (200,)
    status, _, text = call(server, "/metrics")
    assert status == 200 and "specpipe" in text
    assert call(server, "/no/such/route")[0] == 401  # the routes are not revealed without the key
    assert call(server, "/no/such/route", {"Authorization": f"Bearer {KEY}"})[0] == 404
    assert call(server, "/openapi.json")[0] == 401


def test_without_a_key_the_gateway_is_open(tokenizer):
    with GatewayServer(Gateway("unused:0", NAME, tokenizer_dir=tokenizer, client=FakeLLM()), free_port()) as running:
        assert call(running, "/v1/completions", body=COMPLETION)[0] == 200


def _listening(port: int) -> set[str]:
    process = psutil.Process()
    connections = (
        process.net_connections(kind="tcp") if hasattr(process, "net_connections") else process.connections(kind="tcp")
    )
    return {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_gateway_binds_loopback_unless_told_otherwise(tokenizer, capsys):
    assert ServeRequest("repo").openai_host == "127.0.0.1"
    port = free_port()
    gateway = start_gateway(GatewayRequest("unused:0", NAME, port))
    try:
        assert _listening(port) == {"127.0.0.1"}
    finally:
        gateway.stop()
    port = free_port()
    gateway = start_gateway(GatewayRequest("unused:0", NAME, port, host="0.0.0.0"))
    try:
        assert _listening(port) == {"0.0.0.0"}
    finally:
        gateway.stop()
    assert "without an API key: anyone who reaches port" in capsys.readouterr().err


def test_resolve_api_key(tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    assert resolve_api_key(None, tmp_path / "key", environ={}) == KEY
    assert resolve_api_key(KEY, environ={}) == KEY and resolve_api_key(environ={}) is None
    with pytest.raises(APIKeyError, match="--api-key and --api-key-file both give a key: pass one of them"):
        resolve_api_key(KEY, tmp_path / "key", environ={})
    with pytest.raises(APIKeyError, match=r"\$SPECPIPE_API_KEY and --api-key-file both give a key"):
        resolve_api_key(None, tmp_path / "key", environ={"SPECPIPE_API_KEY": KEY})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(
        APIKeyError, match="the API key file .*empty gives an empty API key, which would leave the gateway open"
    ):
        resolve_api_key(None, tmp_path / "empty", environ={})
    with pytest.raises(APIKeyError, match="cannot read the API key file"):
        resolve_api_key(None, tmp_path / "missing", environ={})
    with pytest.raises(APIKeyError, match="the API key of --api-key has whitespace or non-ASCII characters inside it"):
        resolve_api_key("two words", environ={})
    assert bearer_token("Bearer abc") == "abc" and bearer_token("Token abc") is None and bearer_token(None) is None


@pytest.mark.parametrize("raw", [KEY + "\n", f"  {KEY}\r\n", f"\t{KEY} "])
def test_every_key_source_strips_surrounding_whitespace_alike(tmp_path, raw):
    """A Secret made from ``print(...) > file`` keeps the newline: flag, variable and file all drop it."""
    (tmp_path / "key").write_text(raw)
    assert resolve_api_key(raw, environ={}) == KEY
    assert resolve_api_key(environ={"SPECPIPE_API_KEY": raw}) == KEY
    assert resolve_api_key(None, tmp_path / "key", environ={}) == KEY
    assert resolve_api_key(KEY, environ={"SPECPIPE_API_KEY": "other"}) == KEY  # the flag wins over the variable


@pytest.mark.parametrize("empty", ["", "\n", "   "])
def test_a_given_but_empty_key_is_refused_not_an_open_gateway(empty):
    with pytest.raises(
        APIKeyError, match=r"\$SPECPIPE_API_KEY gives an empty API key, which would leave the gateway open"
    ):
        resolve_api_key(environ={"SPECPIPE_API_KEY": empty})
    with pytest.raises(APIKeyError, match="--api-key gives an empty API key"):
        resolve_api_key(empty, environ={})


def test_specpipe_gateway_refuses_an_empty_key_variable_before_binding():
    env = {**os.environ, "SPECPIPE_API_KEY": ""}
    try:  # an open gateway would serve until killed
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "specpipe.cli",
                "gateway",
                "--triton-url",
                "127.0.0.1:1",
                "--name",
                "x",
                "--port",
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the gateway started with an empty key: {exc.stdout}") from exc
    assert done.returncode == 1 and "$SPECPIPE_API_KEY gives an empty API key" in done.stderr + done.stdout


def test_the_banner_brackets_an_ipv6_host(capsys):
    port = free_port()
    gateway = start_gateway(GatewayRequest("unused:0", NAME, port, host="::", api_key=KEY))
    try:
        banner = capsys.readouterr().out
    finally:
        gateway.stop()
    assert f"http://[::]:{port}/v1 (API key required" in banner and ":::" not in banner


def test_serve_refuses_two_keys(tmp_path):
    (tmp_path / "key").write_text(KEY)
    result = CliRunner().invoke(
        main, ["serve", "x", "--repo-dir", str(tmp_path), "--api-key", KEY, "--api-key-file", str(tmp_path / "key")]
    )
    assert result.exit_code == 1 and "both give a key: pass one of them" in result.output


def test_specpipe_gateway_runs_alone_with_the_key_from_a_file(tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    port, triton = free_port(), free_port()  # nothing listens on the Triton port
    env = {k: v for k, v in os.environ.items() if k != "SPECPIPE_API_KEY"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specpipe.cli",
            "gateway",
            "--triton-url",
            f"127.0.0.1:{triton}",
            "--name",
            NAME,
            "--port",
            str(port),
            "--api-key-file",
            str(tmp_path / "key"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    running = type("Running", (), {"port": port})()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                status = call(running, "/health")[0]
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert status == 503  # Triton is not there: not ready, but the gateway answers
        assert call(running, "/v1/models")[0] == 401
        status, _, body = call(running, "/v1/models", {"Authorization": f"Bearer {KEY}"})
        assert status == 200 and [m["id"] for m in body["data"]] == [NAME]
        assert _listening_of(process.pid, port) == {"127.0.0.1"}
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == 0, output
    assert f"OpenAI-compatible API for {NAME}: http://localhost:{port}/v1 (API key required" in output
    assert KEY not in output


def _listening_of(pid: int, port: int) -> set[str]:
    process = psutil.Process(pid)
    connections = (
        process.net_connections(kind="tcp") if hasattr(process, "net_connections") else process.connections(kind="tcp")
    )
    return {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
