"""Micro-measurement of the CPU batch scheduler (issue 11 items 1, 3, 7): in-process output tok/s at
batch 1/4/8, the draft lengths the adaptive rule chose, and greedy identity of every batched request
against the same request alone and against the one-request engine (``SpeculativeEngine``).

Not a timed test: run it by hand on a quiet machine, e.g.
``PYTHONPATH=pipeline python benchmarks/batch_micro.py /tmp/engines/smollm2-135m-ngram --tokens 48``.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler

PROMPTS = [
    "Write a Python function merge_sorted(a, b) with a docstring and an example.",
    "Continue the list: 1. Paris - France 2. Berlin - Germany 3. Madrid - Spain 4. Rome - Italy",
    "Give me advice for exam stress.",
    "Explain hash tables and collisions.",
    "Summarize in 3 sentences: the printing press spread knowledge across Europe quickly.",
    "Add type hints to: def count_words(text): return len(text.split())",
    "What is the capital of Japan and why is it important?",
    "List five prime numbers and explain why they are prime.",
]


def run(scheduler: BatchScheduler, prompts: list[list[int]], params: SamplingParams):
    outputs = [[] for _ in prompts]
    stats = [None] * len(prompts)
    lengths: list[int] = []

    def collect(i):
        def emit(step):
            outputs[i].extend(step.token_ids)
            stats[i] = step.stats
        return emit

    for i, p in enumerate(prompts):
        scheduler.submit(p, params, collect(i))
    start = time.perf_counter()
    while scheduler.has_work:
        scheduler.step()
        lengths += scheduler.last_draft_lengths
    seconds = time.perf_counter() - start
    return outputs, stats, seconds, lengths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine, manifest = load_engine(args.engine_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.engine_dir / manifest.target.path)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
               for p in PROMPTS]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
    params = SamplingParams(max_tokens=args.tokens)
    start = time.perf_counter()
    scheduler = BatchScheduler(engine, max_batch_size=8)
    report = {"engine": manifest.name, "cost_model_ms": dict(zip(scheduler.cost_model.tokens,
              [round(1000 * s, 1) for s in scheduler.cost_model.seconds])),
              "cost_model_load_s": round(time.perf_counter() - start, 2), "batches": {}}
    alone = [run(scheduler, [p], params)[0][0] for p in prompts]
    engine_alone = [engine.generate_all(p, params)[0] for p in prompts]
    for b in [int(x) for x in args.batches.split(",")]:
        outputs, stats, seconds, lengths = run(scheduler, prompts[:b], params)
        tokens = sum(len(o) for o in outputs)
        report["batches"][b] = {
            "output_tok_s": round(tokens / seconds, 1), "seconds": round(seconds, 2), "tokens": tokens,
            "mean_draft_length": round(sum(lengths) / max(len(lengths), 1), 2),
            "accepted_per_forward": round(sum(s.total_accepted_draft_tokens for s in stats)
                                          / max(sum(s.target_forwards - 1 for s in stats), 1) + 1, 2),
            "identical_to_alone": all(o == alone[i] for i, o in enumerate(outputs)),
            "identical_to_engine": all(o == engine_alone[i] for i, o in enumerate(outputs)),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
