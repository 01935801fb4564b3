"""An in-process stand-in for the ensemble behind the OpenAI gateway (no Triton): it tokenizes the
prompt like ``preprocessing``, "generates" a fixed script a few tokens per step (as a speculative step
commits several), decodes chunks like ``postprocessing`` and records requests and cancellations."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

from tiny_engine import tiny_tokenizer

from specpipe.client.llm import GenerationResult
from specpipe.client.request import GenerationRequest
from specpipe.errors import SpecpipeError
from specpipe.triton.interface import ENSEMBLE
from specpipe.triton.models.postprocessing import Detokenizer
from specpipe.triton.models.preprocessing import Preprocessor

CONTEXT = 256
SCRIPT = (
    "Here are three fruits that are perfect for a healthy and balanced diet: apples, bananas and pears. "
    "Bananas are rich in potassium."
)


def tokenizer_dir(root: Path) -> Path:
    """The tiny tokenizer with a ``config.json`` giving a 64-token context."""
    root.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer().save_pretrained(root)
    (root / "config.json").write_text(json.dumps({"max_position_embeddings": CONTEXT}))
    return root


class FakeLLM:
    """Implements what :class:`~specpipe.openai.server.Gateway` uses of ``LLMClient``."""

    def __init__(self, tokens_per_step: int = 3, step_delay_s: float = 0.0, script: str = SCRIPT, end: bool = True):
        tokenizer = tiny_tokenizer()
        self.pre, self.detok = Preprocessor(tokenizer), Detokenizer(tokenizer)
        self.script = list(tokenizer.encode(script, add_special_tokens=False))
        self.tokens_per_step, self.step_delay_s, self.end = tokens_per_step, step_delay_s, end
        self.inputs = {t.name for t in ENSEMBLE.inputs}
        self.requests: list[GenerationRequest] = []
        self.prompt_ids: list[list[int]] = []
        self.cancelled = self.stopped_early = self.running = 0
        self.busy = False

    @property
    def raw(self):
        return self

    async def get_model_metadata(self, model, as_json=True, client_timeout=None):
        return {"inputs": [{"name": n} for n in sorted(self.inputs)]}

    async def is_server_ready(self, client_timeout=None):
        return True

    async def model_config(self, model=None):
        raise SpecpipeError("the fake has no model configs")

    async def close(self):
        pass

    async def generate(self, request: GenerationRequest, on_text=None) -> GenerationResult:
        self.requests.append(request)
        ids = (
            self.pre.encode_segments(list(request.text_segments))
            if request.text_segments
            else self.pre.encode_prompt(request.prompt)
        )
        self.prompt_ids.append(ids)
        result = GenerationResult()
        if len(ids) >= CONTEXT:
            result.error = f"the prompt has {len(ids)} tokens but the context limit is {CONTEXT} tokens"
            return result
        if self.busy:  # what the CPU engine answers past its queue bound, as it reaches the client
            result.error = (
                "in ensemble 'ensemble', server busy: it holds 40 requests already, the most it takes "
                "(8 decoding together + max_queue 32 waiting); retry later"
            )
            return result
        budget = min(request.max_tokens, CONTEXT - len(ids))
        tokens = (self.script if self.end else self.script * 10)[:budget]
        sent: list[int] = []
        self.running += 1
        try:
            while len(sent) < len(tokens):
                await asyncio.sleep(self.step_delay_s)
                new = tokens[len(sent) : len(sent) + self.tokens_per_step]
                text = self.detok.delta(sent, new)
                sent += new
                result.perf = {"num_input_tokens": len(ids), "num_output_tokens": len(sent)}
                if text:
                    result.add_chunk(text, 0.0)
                    if on_text and on_text(text) is True:
                        self.stopped_early += 1
                        break
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        result.perf = {"num_input_tokens": len(ids), "num_output_tokens": len(sent)}
        result.text = "".join(result.chunks)
        return result


def post(server, path, body, raw: bytes | None = None):
    """(status, parsed JSON or the event-stream text) of a POST of ``body`` (or the bytes ``raw``) to a running gateway."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url.removesuffix("/v1") + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            text = reply.read().decode()
            return reply.status, (json.loads(text) if reply.headers.get_content_type() == "application/json" else text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
