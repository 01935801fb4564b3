"""``specpipe serve NAME --openai-port``: the official ``openai`` client against a tiny CPU deployment."""

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine, tiny_tokenizer

from specpipe.bench.metrics import parse_samples
from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.triton.repository import package_engine

pytestmark = pytest.mark.e2e
NAME = "tiny-ngram"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """``specpipe serve`` in a subprocess, with the gateway; yields (API root, gRPC URL)."""
    root = tmp_path_factory.mktemp("gateway")
    engine = make_tiny_engine(root / "engines", NAME, method="ngram")
    package_engine(engine, root / "repo" / NAME)
    grpc, api = free_port(), free_port()
    log = open(root / "serve.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specpipe.cli",
            "serve",
            NAME,
            "--repo-dir",
            str(root / "repo"),
            "--grpc-port",
            str(grpc),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--openai-port",
            str(api),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://localhost:{api}/v1"
    deadline = time.monotonic() + 300
    try:
        while True:
            assert process.poll() is None, (root / "serve.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (root / "serve.log").read_text()
                time.sleep(0.5)
        yield url, f"localhost:{grpc}"
    finally:
        process.send_signal(signal.SIGTERM)  # serve stops the gateway and Triton on SIGTERM
        process.wait(60)
        log.close()
    assert "stopping Triton" in (root / "serve.log").read_text()


@pytest.fixture(scope="module")
def client(deployment):
    from openai import OpenAI

    return OpenAI(base_url=deployment[0], api_key="not-needed")


def _direct(grpc_url, prompt, max_tokens):
    async def go():
        async with LLMClient(grpc_url) as llm:
            return await llm.generate(GenerationRequest(prompt, max_tokens=max_tokens))

    return run_sync(go())


def test_models_lists_the_deployment(client):
    assert [m.id for m in client.models.list()] == [NAME]


def test_completions_plain_and_streamed_match_the_ensemble(client, deployment):
    prompt = "The quick brown fox"
    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=10, temperature=0)
    direct = _direct(deployment[1], prompt, 10)
    assert plain.object == "text_completion" and plain.model == NAME
    assert plain.choices[0].text == direct.text
    assert plain.usage.completion_tokens == direct.perf["num_output_tokens"]
    assert plain.usage.prompt_tokens == direct.perf["num_input_tokens"]
    assert plain.choices[0].finish_reason == ("length" if plain.usage.completion_tokens == 10 else "stop")
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_chat_uses_the_tokenizer_template_and_streams(client, deployment):
    messages = [{"role": "user", "content": "Countries and their capitals: France - Paris,"}]
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    formatted = tiny_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    direct = _direct(deployment[1], formatted, 8)
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    assert (
        reply.choices[0].message.content == direct.text and reply.usage.prompt_tokens == direct.perf["num_input_tokens"]
    )
    stream = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_a_typical_client_snippet_runs_unchanged(deployment):
    from openai import OpenAI

    client = OpenAI(base_url=deployment[0], api_key="EMPTY")
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,  # the served name; another is a 404, as with vLLM
        messages=[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Say hello."}],
        max_tokens=6,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    assert pieces and sum(len(p) for p in pieces) > 0


def test_errors_come_back_as_openai_errors(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="context limit is 64 tokens"):
        client.completions.create(model=NAME, prompt="word " * 80, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.completions.create(model=NAME, prompt="x", max_tokens=4, n=2)
    with pytest.raises(openai.APIError, match="context limit is 64 tokens"):
        list(
            client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "word " * 80}], max_tokens=4, stream=True
            )
        )


def test_metrics_export_requests_and_acceptance(client, deployment):
    before = parse_samples(urllib.request.urlopen(deployment[0].replace("/v1", "/metrics")).read().decode())
    count = lambda samples: sum(
        v for labels, v in samples.get("specpipe_requests_total", []) if labels["model"] == NAME
    )  # noqa: E731
    for prompt in ("1 2 3 4 5 6", "Café, naïve, über"):
        client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0)
    after = parse_samples(urllib.request.urlopen(deployment[0].replace("/v1", "/metrics")).read().decode())
    assert count(after) - count(before) == 2
    drafts = [v for labels, v in after["specpipe_draft_tokens_total"] if labels["model"] == NAME][0]
    accepted = [v for labels, v in after["specpipe_accepted_draft_tokens_total"] if labels["model"] == NAME][0]
    assert 0 <= accepted <= drafts
    lengths = [v for labels, v in after["specpipe_mean_accepted_length"] if labels["model"] == NAME]
    assert lengths and lengths[0] >= 1.0
    if drafts:
        assert [v for labels, v in after["specpipe_acceptance_rate"] if labels["model"] == NAME][0] == pytest.approx(
            accepted / drafts
        )
    health = json.loads(urllib.request.urlopen(deployment[0].replace("/v1", "/health")).read())
    assert health == {"ready": True}
