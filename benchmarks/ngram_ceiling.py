"""How much prompt lookup (n-gram speculation) can gain on the built-in prompt sets at all (not a test).

The target's greedy answers are deterministic, so any copy-from-context drafter can be replayed against
them without running the model again: at each decoding step the drafter sees the committed context
(prompt + answer so far), proposes, and the step accepts the longest proposed prefix that equals the
answer's next tokens, plus the target's own token. Three drafters:

* ``ngram k=K``: specpipe's :class:`~specpipe.runtime.cpu.drafters.NgramDrafter` (most recent match of
  the last 3..1 tokens, a chain of up to K tokens), what an n-gram deployment runs;
* ``trie nodes=B``: every earlier occurrence of the last 4..1 tokens contributes its next 4 tokens to a
  token tree, each prefix weighted by 4^n per occurrence (n = matched length); the B heaviest prefixes
  are verified together (a tree n-gram drafter in the spirit of REST, He et al. 2023, and lookahead
  decoding's n-gram pool, Fu et al. 2024, restricted to the request's own tokens);
* ``oracle``: with hindsight, the longest run of the answer's next tokens found anywhere in the
  context: no copy drafter can accept more, whatever its selection rule.

Each row reports tokens per target forward (the speed-up if verification were free) and the speed-up
predicted with the forward cost measured in the same run: a step that verifies D draft tokens costs
``cost(1 + D) / cost(1)``, where ``cost(n)`` is the median time of one
:class:`~specpipe.runtime.cpu.batched_lm.BatchedLM` forward over n new tokens of one request (plus
``lm_head``), interpolated between the measured row counts. Drafting time (dictionary look-ups) is left
out, which flatters the drafters.

Usage::

    PYTHONPATH=pipeline python benchmarks/ngram_ceiling.py engines/smollm2-135m-none \\
        [--sets chat,summarize,code] [--tokens 128] [--out benchmarks/results/ngram_ceiling.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from datetime import date
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from specpipe.bench.prompts import load_prompts
from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.drafters import NgramDrafter
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler
from specpipe.training.prompts import Prompt, chat_input_ids

COST_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
TRIE_MATCH, TRIE_DEPTH = 4, 4


def greedy_answers(engine, tokenizer, prompts: list[str], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, greedy answer ids)`` per prompt, decoded in batches of 8 by the baseline scheduler."""
    scheduler = BatchScheduler(engine, max_batch_size=8)
    records: list[tuple[list[int], list[int]]] = []
    for prompt in prompts:
        ids = chat_input_ids(tokenizer, Prompt("chat", prompt))
        answer: list[int] = []
        records.append((ids, answer))
        scheduler.submit(ids, SamplingParams(max_tokens=max_tokens), lambda out, answer=answer: answer.extend(out.token_ids))
    while scheduler.has_work:
        scheduler.step()
    return records


def forward_costs(model, context: list[int], reps: int = 7) -> dict[int, float]:
    """Median seconds of one forward over n new tokens after ``context``, for n in :data:`COST_ROWS`,
    the row counts taking turns ``reps`` times."""
    lm = BatchedLM(model, 1)
    slot = lm.allocate()
    lm.hidden([BatchEntry(slot, context)])
    times: dict[int, list[float]] = {n: [] for n in COST_ROWS}
    with torch.inference_mode():
        for _ in range(reps):
            for n in COST_ROWS:
                start = time.perf_counter()
                lm.project(lm.hidden([BatchEntry(slot, context[-n:])]))
                times[n].append(time.perf_counter() - start)
                lm.truncate(slot, len(context))
    return {n: statistics.median(t) for n, t in times.items()}


def accepted(proposals: list[list[int]], answer: list[int], pos: int) -> int:
    """Draft tokens accepted: the longest proposal prefix equal to ``answer[pos:]``, leaving at least the
    target's own token for this step."""
    best = 0
    for tokens in proposals:
        a = 0
        while a < len(tokens) and pos + a < len(answer) - 1 and tokens[a] == answer[pos + a]:
            a += 1
        best = max(best, a)
    return best


def trie_proposals(context: list[int], nodes: int) -> list[list[int]]:
    """The ``nodes`` heaviest prefixes of every match's continuation, as root-to-leaf token lists."""
    weights: Counter[tuple[int, ...]] = Counter()
    for n in range(min(TRIE_MATCH, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                follow = context[start + n : start + n + TRIE_DEPTH]
                for i in range(1, len(follow) + 1):
                    weights[tuple(follow[:i])] += 4.0**n
    chosen: set[tuple[int, ...]] = set()
    for prefix, _ in weights.most_common():
        if len(chosen) >= nodes:
            break
        if len(prefix) == 1 or prefix[:-1] in chosen:
            chosen.add(prefix)
    return [list(p) for p in chosen]


def oracle_length(context: list[int], answer: list[int], pos: int) -> int:
    """The longest run of ``answer[pos:]`` (short of its last token) that appears anywhere in ``context``."""
    best = 0
    for start in range(len(context)):
        a = 0
        while start + a < len(context) and pos + a < len(answer) - 1 and context[start + a] == answer[pos + a]:
            a += 1
        best = max(best, a)
    return best


def replay(records, propose, relative_cost) -> dict[str, float]:
    """Tokens per target forward and predicted speed-up of drafter ``propose(context, answer, pos)``
    (a list of proposals) over ``records``."""
    steps = tokens = cost = drafted = 0.0
    for prompt, answer in records:
        pos = 0
        while pos < len(answer):
            proposals = propose(prompt + answer[:pos], answer, pos)
            size = len({tuple(p[: i + 1]) for p in proposals for i in range(len(p))})
            got = accepted(proposals, answer, pos)
            steps, tokens, cost = steps + 1, tokens + got + 1, cost + relative_cost(1 + size)
            drafted += size > 0
            pos += got + 1
    return {"tokens_per_forward": round(tokens / steps, 3), "predicted_speedup": round(tokens / cost, 3),
            "steps_drafted": round(drafted / steps, 3)}


def ngram_chain(k: int):
    drafter = NgramDrafter()

    def propose(context, answer, pos):
        if pos == 0:
            drafter.reset(context)
        draft = drafter.propose(context, k, None).tokens
        return [draft] if draft else []

    return propose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engine", type=Path, help="a CPU engine (its target decodes; any method)")
    parser.add_argument("--sets", default="chat,summarize,code", help="built-in prompt sets, comma-separated")
    parser.add_argument("--tokens", type=int, default=128, help="greedy answer length (tokens)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine, manifest = load_engine(args.engine)
    tokenizer = AutoTokenizer.from_pretrained(args.engine / manifest.target.path)
    answers = {name: greedy_answers(engine, tokenizer, [p.text for p in load_prompts(name)[0]], args.tokens)
               for name in args.sets.split(",")}
    first_prompt, first_answer = next(iter(answers.values()))[0]
    costs = forward_costs(engine.target.model, first_prompt + first_answer)
    rows = np.array(COST_ROWS, dtype=float)
    relative = np.array([costs[n] / costs[1] for n in COST_ROWS])

    def relative_cost(n: int) -> float:
        return float(np.interp(n, rows, relative))

    drafters = {f"ngram k={k}": ngram_chain(k) for k in (1, 2, 3, 4, 6, 8)}
    drafters |= {f"trie nodes={b}": (lambda b: lambda c, a, p: trie_proposals(c, b))(b) for b in (2, 4, 8, 12)}
    drafters["oracle"] = lambda c, a, p: [a[p : p + oracle_length(c, a, p)]]
    results = []
    for name, records in answers.items():
        for drafter, propose in drafters.items():
            results.append({"prompts": name, "drafter": drafter, **replay(records, propose, relative_cost)})
            print(json.dumps(results[-1]), flush=True)
    report = {"command": shlex.join(["python", *sys.argv]), "date": date.today().isoformat(), "engine": manifest.name,
              "answer_tokens": args.tokens, "prompts_per_set": {k: len(v) for k, v in answers.items()},
              "forward_ms": {n: round(costs[n] * 1e3, 2) for n in COST_ROWS}, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
