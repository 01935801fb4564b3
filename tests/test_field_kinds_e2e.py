"""Issue 34's field kinds end to end, for every CPU method (none, n-gram, draft model, Medusa, EAGLE) of the
real default model, alone and in a batch, over gRPC (streamed and not) and through the OpenAI gateway.

One real Triton server hosts the five deployments side by side (their repositories merged, each model
renamed after its method), each with its own gateway. They are packaged for a quick start
(``--dense-rows all --draft-lengths max --no-warm-up``: no load-time measurement, every step drafts
``max_draft_len``), so a request's steps are the same in every run and a block of accepted drafts found in
one run can be aimed at in the next. Per method:

- greedy text (alone, and in a batch of gRPC and gateway requests, streamed and not) is the baseline's,
  streamed chunks concatenate to it, and the token counts (``num_output_tokens``,
  ``usage.completion_tokens``) are the tokens sent, not the chunks;
- an end id and a stop word aimed at a block of accepted drafts end the text there, alone and in a batch,
  over gRPC and (the stop string) the gateway, with the counts of what was sent;
- a multi-token bad word is never generated; a stream cancelled without a request id frees the engine;
- per request, accepted <= drafted and generated tokens (sent + the end id or stop word) = target
  forwards + accepted drafts; the model's Triton series add exactly what its requests' perf outputs and
  its gateway's counters say.
"""

from __future__ import annotations

import asyncio
import queue
import re
import shutil
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from dashboard_queries import dashboard_queries, series_names
from loopback import free_port
from prometheus_client.parser import text_string_to_metric_families

from specpipe.client.llm import LLMClient, run_sync
from specpipe.client.request import GenerationRequest, build_inputs
from specpipe.generation import spec_metrics as names
from specpipe.generation.api import SamplingParams
from specpipe.openai.http_server import GatewayServer
from specpipe.openai.server import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.model]

METHODS = ("none", "ngram", "smollm2-draft", "medusa", "eagle")
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
N = 32
#: The packaging of a quick start: no load-time measurement, no warm-up, full drafts every step.
QUICK = {"dense_rows": "all", "draft_lengths": "max", "warm_up": False}


def suffix(method: str) -> str:
    return method.replace("-", "_")


def merged_repository(repositories: dict[str, Path], out: Path) -> Path:
    """One Triton repository serving each deployment of ``repositories`` (method -> its repository) as
    ``ensemble_<method>`` over ``tensorrt_llm_<method>`` and ``postprocessing_<method>``, sharing the first
    one's ``preprocessing`` (the same tokenizer for all)."""
    out.mkdir(parents=True)
    for i, (method, repository) in enumerate(repositories.items()):
        if i == 0:
            shutil.copytree(repository / "preprocessing", out / "preprocessing")
        for model in ("ensemble", "tensorrt_llm", "postprocessing"):
            shutil.copytree(repository / model, out / f"{model}_{suffix(method)}")
            config = out / f"{model}_{suffix(method)}" / "config.pbtxt"
            text = re.sub(r'^name: "(\w+)"', rf'name: "\1_{suffix(method)}"', config.read_text(), count=1, flags=re.M)
            text = re.sub(r'model_name: "(tensorrt_llm|postprocessing)"', rf'model_name: "\1_{suffix(method)}"', text)
            text = text.replace('string_value: "tensorrt_llm"', f'string_value: "tensorrt_llm_{suffix(method)}"')
            config.write_text(text)
    return out


@pytest.fixture(scope="module")
def served(smollm2_engines, tmp_path_factory):
    """``(server, {method: gateway}, {method: deployment name})``: one Triton, five gateways."""
    from specpipe.serve.local import LocalTritonServer
    from specpipe.triton.repository import package_engine

    root = tmp_path_factory.mktemp("five")
    repositories = {m: package_engine(smollm2_engines[m], root / "single" / m, **QUICK) for m in METHODS}
    repo = merged_repository(repositories, root / "merged")
    server = LocalTritonServer(
        repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log_path=root / "triton.log"
    )
    server.start()
    gateways = {}
    try:
        server.wait_ready(timeout_s=900)
        for method in METHODS:
            gateway = Gateway(server.grpc_url, smollm2_engines[method].name, model=f"ensemble_{suffix(method)}")
            gateways[method] = GatewayServer(gateway, free_port(), host="127.0.0.1")
            gateways[method].start()
        yield server, gateways, {m: smollm2_engines[m].name for m in METHODS}
    finally:
        for gateway in gateways.values():
            gateway.stop()
        server.stop()


@pytest.fixture(scope="module")
def tokenizer(smollm2_engines):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_engines["none"] / "target")


@pytest.fixture(scope="module")
def greedy(smollm2_engines, tokenizer):
    """The baseline's greedy token ids after :data:`PROMPT` (in process, plain decoding, the kernels served)."""
    from specpipe.runtime.cpu.dense_rows import apply_dense_rows, parse_dense_rows
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

    deployment = load_engine(smollm2_engines["none"], dense_copy=True)[0]
    apply_dense_rows(deployment, parse_dense_rows(QUICK["dense_rows"]))
    return generate_all(solo_scheduler(deployment), tokenizer(PROMPT)["input_ids"], SamplingParams(max_tokens=N))[0]


# --- requests -------------------------------------------------------------------------------------


async def grpc(server, method: str, stream: bool, **fields):
    async with LLMClient(server.grpc_url, model=f"ensemble_{suffix(method)}") as client:
        result = await client.generate(GenerationRequest(PROMPT, max_tokens=N, stream=stream, **fields))
    assert result.error is None, result.error
    return result


async def gateway(gateways, deployments, method: str, stream: bool, **fields):
    """An OpenAI completion through ``method``'s gateway: ``(text, usage.completion_tokens, text chunks)``."""
    client = openai.AsyncOpenAI(base_url=gateways[method].url, api_key="none", max_retries=0)
    try:
        kw = {"model": deployments[method], "prompt": PROMPT, "max_tokens": N, "temperature": 0, **fields}
        if not stream:
            reply = await client.completions.create(**kw)
            return reply.choices[0].text, reply.usage.completion_tokens, [reply.choices[0].text]
        chunks = [
            c async for c in await client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        ]
        texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
        return "".join(texts), chunks[-1].usage.completion_tokens, texts
    finally:
        await client.close()


def alone_and_in_a_batch(calls):
    """Each call alone (one after another), then all of them at once (one batch in the engine)."""

    async def go():
        alone = [await call() for call in calls]
        return alone, list(await asyncio.gather(*(call() for call in calls)))

    return run_sync(go())


def stream_steps(server, method: str) -> list[dict]:
    """The perf outputs and text of each response of one streamed greedy ensemble request (one per step)."""
    from tritonclient.grpc.aio import InferenceServerClient

    async def go():
        client = InferenceServerClient(server.grpc_url)
        request = GenerationRequest(PROMPT, max_tokens=N, stream=True)

        async def requests():
            yield {"model_name": f"ensemble_{suffix(method)}", "inputs": build_inputs(request, True), "request_id": "s"}

        steps = []
        try:
            async for response, error in client.stream_infer(requests()):
                assert error is None, error
                text = response.as_numpy("text_output")
                step = {"text": "" if text is None else "".join(t.decode() for t in text.ravel())}
                for name in ("num_output_tokens", "total_accepted_draft_tokens", "target_forwards"):
                    if response.as_numpy(name) is not None:
                        step[name] = int(response.as_numpy(name).ravel()[0])
                steps.append(step)
                final = response.get_response().parameters.get("triton_final_response")
                if (final and final.bool_param) or step.get("num_output_tokens") == N:
                    break
        finally:
            await client.close()
        return [s for s in steps if "num_output_tokens" in s]

    return run_sync(go())


def assert_counted(perf: dict, stopping_tokens: int) -> None:
    """accepted <= drafted; tokens sent + the end id or stop word = target forwards + accepted drafts."""
    assert perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]
    assert perf["num_output_tokens"] + stopping_tokens == perf["target_forwards"] + perf["total_accepted_draft_tokens"]


def aim(steps: list[dict], greedy: list[int], tokenizer, method: str) -> int | None:
    """An output index p that is a draft its step accepted (the baseline: any step's token), whose token
    is one whole word (a stop string that tokenizes to it alone) first seen there, as token and as text."""
    text, before = tokenizer.decode(greedy), {"num_output_tokens": 0, "total_accepted_draft_tokens": 0}
    for step in steps[1:]:
        offset = before["num_output_tokens"]
        accepted = step["total_accepted_draft_tokens"] - before["total_accepted_draft_tokens"]
        plain = step["num_output_tokens"] - offset == accepted + 1  # no token held back or released
        before = step
        for p in [offset + k for k in ([0] if method == "none" else range(accepted))] if plain else []:
            word = tokenizer.decode([greedy[p]])
            if (
                p >= 2
                and greedy[p] not in greedy[:p]
                and re.fullmatch(r" [A-Za-z]+", word)
                and tokenizer(word, add_special_tokens=False)["input_ids"] == [greedy[p]]
                and text.find(word) == len(tokenizer.decode(greedy[:p]))
            ):
                return p
    return None


def bad_pair(greedy: list[int], tokenizer) -> int | None:
    """An index q such that greedy tokens q, q + 1 are two whole words whose text tokenizes back to them
    and whose first token is first seen at q: a two-token bad word the greedy text would contain."""
    for q in range(2, len(greedy) - 2):
        words = tokenizer.decode(greedy[q : q + 2])
        if (
            re.fullmatch(r" [A-Za-z]+ [A-Za-z]+", words)
            and greedy[q] not in greedy[:q]
            and tokenizer(words, add_special_tokens=False)["input_ids"] == greedy[q : q + 2]
        ):
            return q
    return None


# --- metrics --------------------------------------------------------------------------------------


def samples(url: str) -> list:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(found: list, name: str, model: str) -> float:
    values = [s.value for s in found if s.name == name and s.labels.get(names.MODEL_LABEL) == model]
    assert len(values) <= 1, f"{name} {model}: {values}"
    return values[0] if values else 0.0


def idle_samples(server, model: str, timeout_s: float = 60.0) -> list:
    """Triton's samples once ``model`` runs no request (a gateway's stopped request may run a step longer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = samples(server.metrics_url)
        if value(found, names.REQUESTS_RUNNING, model) == 0:
            return found
        assert time.monotonic() < deadline, f"{model} still runs a request {timeout_s:.0f} s after the test's requests"
        time.sleep(0.5)


COUNTED = {
    names.NUM_ACCEPTED_TOKENS: "total_accepted_draft_tokens",
    names.NUM_DRAFT_TOKENS: "total_draft_tokens",
    names.GENERATION_TOKENS: "num_output_tokens",
}


# --- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_greedy_text_counts_and_series_alone_and_in_a_batch(served, greedy, tokenizer, method):
    """Greedy requests over gRPC and the gateway, streamed and not, alone then in one batch: the baseline's
    text, counts of the tokens sent, the counting identity, and Triton's series add up what they said."""
    server, gateways, deployments = served
    model, expected = deployments[method], tokenizer.decode(greedy)
    before = idle_samples(server, model), samples(gateways[method].url.removesuffix("/v1") + "/metrics")
    calls = [
        lambda: grpc(server, method, False),
        lambda: grpc(server, method, True),
        lambda: gateway(gateways, deployments, method, False),
        lambda: gateway(gateways, deployments, method, True),
    ]
    alone, batch = alone_and_in_a_batch(calls)
    ended = int(len(greedy) < N)  # by the end id, which is generated but not sent
    for results in (alone, batch):
        for result in results[:2]:
            assert result.text == expected
            assert result.perf["num_output_tokens"] == len(greedy)
            assert_counted(result.perf, stopping_tokens=ended)
        for text, usage, _ in results[2:]:
            assert (text, usage) == (expected, len(greedy))
        if method != "none":  # chunks carry several tokens: the counts, not the chunks, count them
            assert results[1].perf["total_accepted_draft_tokens"] > 0
            assert len(results[1].chunks) < len(greedy) and len(results[3][2]) < len(greedy)
    after = idle_samples(server, model), samples(gateways[method].url.removesuffix("/v1") + "/metrics")
    perfs = [r.perf for r in alone[:2] + batch[:2]]
    for name, perf in COUNTED.items():
        triton_added = value(after[0], name, model) - value(before[0], name, model)
        gateway_added = value(after[1], name, model) - value(before[1], name, model)
        assert triton_added == gateway_added + sum(p[perf] for p in perfs), name
    assert value(after[0], names.GENERATION_TOKENS, model) - value(
        before[0], names.GENERATION_TOKENS, model
    ) == 8 * len(greedy)
    positions = {
        int(s.labels["position"]): s.value
        for s in after[0]
        if s.name == names.NUM_ACCEPTED_PER_POS and s.labels.get(names.MODEL_LABEL) == model
    }
    per_position = [positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1)]
    accepted = value(after[0], names.NUM_ACCEPTED_TOKENS, model)
    assert sum(per_position) == accepted <= value(after[0], names.NUM_DRAFT_TOKENS, model)
    assert per_position == sorted(per_position, reverse=True)
    assert (accepted > 0) == (method != "none")


@pytest.mark.parametrize("method", METHODS)
def test_an_end_id_or_stop_word_inside_accepted_drafts_alone_and_in_a_batch(served, greedy, tokenizer, method):
    server, gateways, deployments = served
    steps = stream_steps(server, method)
    assert "".join(s["text"] for s in steps) == tokenizer.decode(greedy)
    p = aim(steps, greedy, tokenizer, method)
    assert p is not None, f"{method}: no block of accepted drafts with a word to aim at: {steps}"
    word, sent = tokenizer.decode([greedy[p]]), tokenizer.decode(greedy[:p])
    calls = [
        lambda: grpc(server, method, False, end_id=greedy[p]),
        lambda: grpc(server, method, True, end_id=greedy[p]),
        lambda: grpc(server, method, False, stop_words=(word,)),
        lambda: grpc(server, method, True, stop_words=(word,)),
        lambda: gateway(gateways, deployments, method, False, stop=[word]),
        lambda: gateway(gateways, deployments, method, True, stop=[word]),
    ]
    for results in alone_and_in_a_batch(calls):
        for result in results[:4]:
            assert (result.text, result.perf["num_output_tokens"]) == (sent, p)
            assert_counted(result.perf, stopping_tokens=1)
        for text, usage, _ in results[4:]:
            assert (text, usage) == (sent, p)


@pytest.mark.parametrize("method", METHODS)
def test_a_multi_token_bad_word_and_a_stream_cancelled_without_an_id(served, greedy, tokenizer, method):
    server, _, deployments = served
    q = bad_pair(greedy, tokenizer)
    assert q is not None, f"no two-word pair in {tokenizer.decode(greedy)!r}"
    words = tokenizer.decode(greedy[q : q + 2])
    banned = run_sync(grpc(server, method, False, bad_words=(words,)))
    assert banned.text.startswith(tokenizer.decode(greedy[: q + 1]))
    assert not re.search(re.escape(words) + r"(?![A-Za-z])", banned.text)  # ' The capitals' is other tokens
    assert_counted(banned.perf, stopping_tokens=int(banned.perf["num_output_tokens"] < N))

    import tritonclient.grpc as grpcclient

    triton = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue = queue.Queue()
    triton.start_stream(callback=lambda result, error: received.put((result, error)))
    request = GenerationRequest("Count to a million:", max_tokens=2000, min_tokens=2000, stream=True)
    triton.async_stream_infer(f"ensemble_{suffix(method)}", build_inputs(request, True), request_id="")
    for _ in range(3):  # the engine is decoding the request
        assert received.get(timeout=120)[1] is None
    triton.stop_stream(cancel_requests=True)
    triton.close()
    idle_samples(server, deployments[method], timeout_s=30)  # 2000 tokens would take minutes


def test_every_cpu_series_the_dashboard_queries_is_on_the_metrics_port(served):
    """The Grafana dashboard's queries resolve on served CPU deployments: each series they name that the CPU
    model exports is on Triton's metrics port after the tests' requests, the ``specpipe:`` ones labelled
    with each deployment (the baseline accepts nothing, so it has no per-position counts)."""
    from specpipe.triton.models.scheduler_metrics import exported_series

    server, _, deployments = served
    queried = set().union(*(series_names(expr) for expr in dashboard_queries())) & exported_series()
    assert {names.NUM_DRAFTS, names.TIME_TO_FIRST_TOKEN + "_bucket", "specpipe_draft_length"} <= queried
    live = samples(server.metrics_url)
    assert {n for n in queried if not n.startswith("specpipe:")} <= {s.name for s in live}
    for method, model in deployments.items():
        labelled = {n for n in queried if n.startswith("specpipe:")}
        labelled -= {names.NUM_ACCEPTED_PER_POS} if method == "none" else set()
        shown = {s.name for s in live if s.labels.get(names.MODEL_LABEL) == model}
        assert labelled <= shown, f"{model}: {sorted(labelled - shown)} not on the metrics port"
