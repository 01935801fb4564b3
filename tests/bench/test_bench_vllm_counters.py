"""``specpipe bench --url NAME=openai://...`` against a stand-in vLLM server on 127.0.0.1: acceptance and
per-position acceptance from vLLM's own Prometheus counters, and the request body bench sends
(sampling, seeds, ``ignore_eos`` + ``min_tokens``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from specpipe.bench.endpoints import parse_endpoint
from specpipe.bench.metrics import parse_samples, spec_counters
from specpipe.bench.prompts import Prompt
from specpipe.bench.report import to_json
from specpipe.bench.runner import BenchRun, BenchSettings, run_bench

PROMPTS = [Prompt(f"p{i}", f"prompt {i}") for i in range(3)]

#: Per completed request the stand-in counts 4 drafts of 3 tokens, 7 accepted: 4 at position 0, 2 at 1, 1 at 2.
PER_REQUEST = {"drafts": 4, "draft_tokens": 12, "accepted": 7, "positions": (4, 2, 1)}


class StandInVLLM:
    """``/v1/models``, a streamed ``/v1/completions`` and ``/metrics`` with vLLM's counter names."""

    def __init__(self, total_suffix: bool = True):
        self.bodies, self.completed, self.tokens, self.total_suffix = [], 0, 0, total_suffix

    def metrics(self) -> str:
        n = self.completed
        s = "_total" if self.total_suffix else ""
        lines = []
        for name, value in (
            ("spec_decode_num_drafts", n * PER_REQUEST["drafts"]),
            ("spec_decode_num_draft_tokens", n * PER_REQUEST["draft_tokens"]),
            ("spec_decode_num_accepted_tokens", n * PER_REQUEST["accepted"]),
            ("generation_tokens", self.tokens),
            ("request_success", n),
        ):
            lines += [f"# TYPE vllm:{name} counter", f'vllm:{name}{s}{{engine="0",model_name="m"}} {value}.0']
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos{s}{{engine="0",model_name="m",position="{k}"}} {n * v}.0'
            for k, v in enumerate(PER_REQUEST["positions"])
        ]
        return "\n".join(lines) + "\n"

    def app(self) -> web.Application:
        async def models(request):
            return web.json_response({"data": [{"id": "m"}]})

        async def completions(request):
            body = await request.json()
            self.bodies.append(body)
            reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await reply.prepare(request)
            n = body["max_tokens"]
            for i in range(n):
                await reply.write(f"data: {json.dumps({'choices': [{'text': f't{i} '}]})}\n\n".encode())
                await asyncio.sleep(0.002)
            await reply.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n".encode())
            await reply.write(b"data: [DONE]\n\n")
            self.completed += 1
            self.tokens += n
            return reply

        async def metrics(request):
            return web.Response(text=self.metrics(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/metrics", metrics)
        return app


async def _bench_against(server: StandInVLLM, settings: BenchSettings) -> BenchRun:
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        endpoint = parse_endpoint(f"baseline=openai://127.0.0.1:{port}/v1")
        run = BenchRun(settings=settings)
        return await run_bench([endpoint], PROMPTS, settings, run)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("total_suffix", [True, False])
def test_acceptance_and_per_position_acceptance_from_vllm_counters(total_suffix):
    server = StandInVLLM(total_suffix)
    settings = BenchSettings(prompts="chat", concurrencies=(2,), max_tokens=12, num_requests=5, warmup=2)
    run = asyncio.run(_bench_against(server, settings))
    level = run.levels[0]
    # the two warm-up requests are counted before the level's first scrape: only the level's 5 remain
    assert level.counters.source == "vllm"
    assert (level.counters.drafts, level.counters.draft_tokens, level.counters.accepted_draft_tokens) == (20, 60, 35)
    assert level.counters.accepted_per_position == {0: 20.0, 1: 10.0, 2: 5.0}
    result = to_json(run)["results"][0]
    agg = result["aggregate"]
    assert agg["acceptance_source"] == "server counters"
    assert agg["acceptance_rate"] == pytest.approx(35 / 60)
    assert agg["acceptance_by_position"] == pytest.approx([1.0, 0.5, 0.25])
    # 5 requests x 12 tokens: 55 after each first token, in 55 - 35 = 20 target steps
    assert agg["mean_accepted_length"] == pytest.approx(55 / 20)
    assert [r.output_tokens for r in level.records] == [12] * 5
    assert {r.output_tokens_source for r in level.records} == {"usage"}


def test_specpipe_prefix_counts_like_vllm_and_vllm_wins_when_both():
    text = (
        'specpipe:spec_decode_num_draft_tokens_total{model="tensorrt_llm"} 9\n'
        'specpipe:spec_decode_num_accepted_tokens_total{model="tensorrt_llm"} 3\n'
        'specpipe:spec_decode_num_drafts_total{model="tensorrt_llm"} 3\n'
        'specpipe:spec_decode_num_accepted_tokens_per_pos_total{model="tensorrt_llm",position="0"} 2\n'
        'specpipe:spec_decode_num_accepted_tokens_per_pos_total{model="tensorrt_llm",position="1"} 1\n'
    )
    found = spec_counters(parse_samples(text))
    assert (found["source"], found["draft_tokens"], found["accepted_draft_tokens"], found["drafts"]) == (
        "specpipe-triton",
        9,
        3,
        3,
    )
    assert found["accepted_per_position"] == {0: 2.0, 1: 1.0}
    both = text + "vllm:spec_decode_num_draft_tokens_total 5\nvllm:spec_decode_num_accepted_tokens_total 1\n"
    assert spec_counters(parse_samples(both))["source"] == "vllm"
    # the gateway exports both its older series and the specpipe: ones; only the older count requests
    gateway = text + (
        'specpipe_draft_tokens_total{model="tensorrt_llm"} 9\nspecpipe_accepted_draft_tokens_total{model="tensorrt_llm"} 3\n'
        'specpipe_output_tokens_total{model="tensorrt_llm"} 20\nspecpipe_requests_total{model="tensorrt_llm"} 2\n'
    )
    found = spec_counters(parse_samples(gateway))
    assert (found["source"], found["requests"], found["output_tokens"]) == ("specpipe", 2, 20)


def test_sampled_ignore_eos_requests_carry_vllm_fields_and_seeds():
    server = StandInVLLM()
    settings = BenchSettings(
        prompts="chat",
        concurrencies=(1,),
        max_tokens=5,
        num_requests=3,
        warmup=0,
        ignore_eos=True,
        temperature=0.7,
        top_p=0.9,
        seed=40,
    )
    run = asyncio.run(_bench_against(server, settings))
    assert [(b["ignore_eos"], b["min_tokens"], b["max_tokens"]) for b in server.bodies] == [(True, 5, 5)] * 3
    assert [(b["temperature"], b["top_p"]) for b in server.bodies] == [(0.7, 0.9)] * 3
    assert sorted(b["seed"] for b in server.bodies) == [40, 41, 42]
    assert [r.seed for r in run.levels[0].records] == [40, 41, 42]


def test_greedy_requests_send_temperature_zero_and_no_eos_fields():
    server = StandInVLLM()
    settings = BenchSettings(prompts="chat", concurrencies=(1,), max_tokens=3, num_requests=2, warmup=0, seed=5)
    asyncio.run(_bench_against(server, settings))
    assert all(
        b["temperature"] == 0.0 and "seed" not in b and "ignore_eos" not in b and "min_tokens" not in b
        for b in server.bodies
    )
