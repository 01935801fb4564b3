"""Engines of every CPU method on tiny random models, and helpers that run requests through the batch
scheduler (:mod:`specpipe.runtime.cpu.scheduler.scheduler`) on the test's thread."""

from __future__ import annotations

import torch
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.drafters.eagle import EagleTreeDrafter
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig, EagleHead
from specpipe.runtime.cpu.drafters.medusa import MedusaHeads, MedusaTreeDrafter
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.tree import Tree

METHODS = ("none", "ngram", "draft-model", "medusa", "eagle", "eagle-dynamic")
TREE = "[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"
#: Verification costs the same whatever the tokens: drafting always pays (exercises every drafter).
FLAT_COST = ForwardCostModel((1, 64), (1.0, 1.0))
#: Each token costs as much as a step: drafting never pays.
LINEAR_COST = ForwardCostModel((1, 64), (1.0, 64.0))


def make_engine(method: str, seed: int = 3) -> Deployment:
    """A tiny engine of ``method`` (random weights, vocabulary 64, end id 2 unused unless asked)."""
    return make_engine_of(method, tiny_llama(seed, vocab_size=64), seed)


def make_engine_of(method: str, model, seed: int = 3) -> Deployment:
    """An engine of ``method`` on the target ``model``, its drafts random (drawn with ``seed``)."""
    vocab = model.config.vocab_size
    if method == "none":
        return Deployment(model, NoDrafter(), 0)
    if method == "ngram":
        return Deployment(model, NgramDrafter(3), 4)
    if method == "draft-model":
        return Deployment(model, DraftModelDrafter(tiny_llama(seed + 1, vocab_size=vocab, num_layers=1)), 3)
    torch.manual_seed(seed)
    lm = ReducedLMHead(model.lm_head.weight, torch.arange(0, vocab, 2))
    if method == "medusa":
        heads = MedusaHeads(model.config.hidden_size, 3).eval()
        for p in heads.parameters():
            torch.nn.init.normal_(p, std=0.3)
        return Deployment(model, MedusaTreeDrafter(heads, lm, Tree.parse(TREE)), 7)
    head = EagleHead(EagleConfig.from_target(model.config)).eval()
    embed = model.model.embed_tokens.weight
    if method == "eagle":
        return Deployment(model, EagleTreeDrafter(head, embed, lm, Tree.parse(TREE)), 7)
    return Deployment(model, EagleTreeDrafter(head, embed, lm, dynamic=True, top_k=3, depth=3), 8)


def scheduler_for(engine, **kw) -> BatchScheduler:
    kw.setdefault("cost_model", FLAT_COST)
    kw.setdefault("prefill_chunk", 8)
    return BatchScheduler(engine, **kw)


class Collector:
    """Collects one request's outputs (tokens, finish reason, stats, error)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.reason = None
        self.stats = None
        self.error = None
        self.steps = 0

    def emit(self, step) -> None:
        self.tokens += step.token_ids
        self.steps += 1
        self.stats = step.stats
        if step.finished:
            self.reason = step.finish_reason

    def fail(self, exc) -> None:
        self.error = exc


def submit(scheduler: BatchScheduler, prompt, params: SamplingParams):
    out = Collector()
    request = scheduler.submit(prompt, params, out.emit, out.fail)
    return request, out


def run_alone(engine, prompt, params: SamplingParams, **kw) -> list[int]:
    """The request's tokens when the scheduler serves it alone."""
    scheduler = scheduler_for(engine, **kw)
    _, out = submit(scheduler, prompt, params)
    scheduler.run_until_idle()
    assert out.error is None and out.reason is not None
    return out.tokens


def run_batch(engine, requests, **kw) -> list[Collector]:
    """Submit every ``(prompt, params)`` at once and step until all finish."""
    scheduler = scheduler_for(engine, **kw)
    outs = [submit(scheduler, prompt, params)[1] for prompt, params in requests]
    scheduler.run_until_idle()
    return outs


def prompts(n: int = 8, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of mixed lengths (3 .. 30 tokens), some repetitive (n-gram hits)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = [3, 30, 7, 12, 19, 5, 24, 9][i % 8]
        base = torch.randint(3, 64, (max(2, length // 3),), generator=g).tolist()
        out.append((base * 4)[:length] if i % 2 else torch.randint(3, 64, (length,), generator=g).tolist())
    return out
