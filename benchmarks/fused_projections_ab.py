"""Fused query/key/value and gate/up projections against the separate ones, in one process (not a test).

Loads the target of ``--engine`` twice, once as the loader does (fused,
:mod:`specpipe.runtime.cpu.fused_projections`) and once with the five separate projections per layer,
both prepacked; checks that both decode the same greedy tokens on a few chat prompts; then times, in
``--reps`` interleaved repetitions (the order alternating), a greedy step at batch 1 (``--tokens``
steps after a chat prompt, argmax screen as a deployment scores greedy requests) and a 12-token
forward (a verification's size). Figures are medians in ms, and the medians of each repetition's own
fused / separate ratio::

    PYTHONPATH=pipeline:benchmarks python benchmarks/fused_projections_ab.py --engine engines/smollm2-135m-none \\
        [--reps 15] [--tokens 48] [--out benchmarks/results/fused_projections_ab.json]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu import loader
from specpipe.runtime.cpu.batched_lm import BatchedLM, BatchEntry

from plain_step import PROMPT, _cpu_name, report, specpipe_step_seconds

IDENTITY_PROMPTS = (PROMPT, "Write a haiku about autumn.", "List three uses of Python.",
                    "What is the capital of France and why is it famous?")


def greedy_tokens(lm: BatchedLM, prompt_ids: list[int], tokens: int) -> list[int]:
    slot = lm.allocate()
    out = []
    try:
        with torch.inference_mode():
            token = int(lm.project(lm.hidden([BatchEntry(slot, prompt_ids)])[-1:], [True]).argmax())
            for _ in range(tokens):
                out.append(token)
                token = int(lm.project(lm.hidden([BatchEntry(slot, [token])]), [True]).argmax())
    finally:
        lm.release(slot)
    return out


def forward_ms(lm: BatchedLM, prompt_ids: list[int], rows: int) -> float:
    """One forward over ``rows`` tokens of one request after its prompt (ms)."""
    slot = lm.allocate()
    try:
        with torch.inference_mode():
            lm.hidden([BatchEntry(slot, prompt_ids)])
            start = time.perf_counter()
            lm.hidden([BatchEntry(slot, prompt_ids[:rows])])
            return (time.perf_counter() - start) * 1e3
    finally:
        lm.release(slot)


def load_separate(engine_dir: Path):
    """The engine with the loader's projection fusion turned off."""
    fuse = loader.fuse_projections
    loader.fuse_projections = lambda decoder: 0
    try:
        return loader.load_engine(engine_dir)[0]
    finally:
        loader.fuse_projections = fuse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fused_engine, manifest = loader.load_engine(args.engine)
    lanes = {"fused": BatchedLM(fused_engine.target.model, 1), "separate": BatchedLM(load_separate(args.engine).target.model, 1)}
    tokenizer = AutoTokenizer.from_pretrained(args.engine / manifest.target.path)

    def ids(prompt: str) -> list[int]:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])

    identical = sum(greedy_tokens(lanes["fused"], ids(p), 96) == greedy_tokens(lanes["separate"], ids(p), 96)
                    for p in IDENTITY_PROMPTS)
    prompt_ids = ids(PROMPT)
    for lm in lanes.values():
        specpipe_step_seconds(lm, prompt_ids, 8)
    step = {name: [] for name in lanes}
    rows12 = {name: [] for name in lanes}
    for rep in range(args.reps):
        for name in (("fused", "separate") if rep % 2 == 0 else ("separate", "fused")):
            step[name].append(specpipe_step_seconds(lanes[name], prompt_ids, args.tokens) * 1e3)
            rows12[name].append(statistics.median(forward_ms(lanes[name], prompt_ids, 12) for _ in range(3)))
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "setup": {"reps": args.reps, "tokens": args.tokens, "threads": args.threads, "torch": torch.__version__,
                  "cpu": _cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M")},
        "greedy_identical": f"{identical}/{len(IDENTITY_PROMPTS)} prompts, 96 tokens each",
        "step_ms": {name: round(statistics.median(v), 2) for name, v in step.items()},
        "forward_12_rows_ms": {name: round(statistics.median(v), 2) for name, v in rows12.items()},
        "paired_step_ratio": round(statistics.median(f / s for f, s in zip(step["fused"], step["separate"])), 3),
        "paired_12_rows_ratio": round(statistics.median(f / s for f, s in zip(rows12["fused"], rows12["separate"])), 3),
    }
    report(result, args.out)


if __name__ == "__main__":
    main()
