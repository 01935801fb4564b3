"""OpenAPI-driven fuzz of the gateway's request bodies (schemathesis), against the fake ensemble.

The OpenAPI document is the one the gateway serves (``/openapi.json``, from its pydantic models).
Bounded (``max_examples``) to a few seconds for CI. Every answer must be a non-5xx HTTP response (the
connection never drops) with a JSON error object when it is an error, and the server must keep serving.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from loopback import free_port
from openai_fake import FakeLLM, tokenizer_dir

from specpipe.openai.http_server import GatewayServer
from specpipe.openai.schema import openapi_document
from specpipe.openai.server import Gateway

NAME = "fake-deployment"
schema = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    gateway = Gateway(
        "unused:0", NAME, tokenizer_dir=str(tokenizer_dir(tmp_path_factory.mktemp("tok"))), client=FakeLLM()
    )
    with GatewayServer(gateway, free_port(), host="127.0.0.1") as running:
        yield running.url.removesuffix("/v1")


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_body_breaks_the_gateway(case, base_url):
    response = case.call(base_url=base_url, timeout=30)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert "message" in response.json()["error"]


def test_the_served_openapi_document_is_the_models(base_url):
    with urllib.request.urlopen(base_url + "/openapi.json", timeout=10) as reply:
        assert json.loads(reply.read()) == json.loads(json.dumps(openapi_document()))
    with urllib.request.urlopen(base_url + "/v1/models", timeout=10) as reply:  # still serving
        assert json.loads(reply.read())["data"][0]["id"] == NAME
