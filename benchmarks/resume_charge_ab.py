"""The adaptive rule with and without the charge for resuming drafts, in one process (not a test).

A request that drafted before but not in its latest step must first catch its drafter up on the
tokens committed meanwhile; the rule charges that (``specpipe.runtime.cpu.adaptive.ResumeCost``). This
runs the baseline and, per method, two schedulers on one loaded engine: one whose rule charges nothing
for resuming, one as shipped. Both start from the same measured cost curve (a copy), so the only
difference is the charge. Lanes take one step each in turn, as in ``adaptive_interleaved.py``; the
table gives each lane's output tok/s against the baseline's and the share of its steps that drafted::

    PYTHONPATH=pipeline python benchmarks/resume_charge_ab.py engines/smollm2-135m-none engines/smollm2-135m-eagle \\
        [--concurrency 1,2,4,8] [--prompts 8] [--prompt-set chat|training-style] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shlex
import sys
from datetime import date
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.bench.prompts import load_prompts
from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.adaptive import ResumeCost
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler
from specpipe.training.prompts import builtin_prompts

from adaptive_interleaved import Lane
from draft_acceptance import CHAT_CATEGORIES, TRAINING_STYLE_SEED


class FreeResume(ResumeCost):
    """The rule before the charge: resuming costs nothing (catch-ups are still timed)."""

    def charge(self) -> float:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per level (at least 2 x concurrency)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-set", choices=("chat", "training-style"), default="chat")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    baseline, manifest = load_engine(args.baseline)
    lanes = [Lane(manifest.name, BatchScheduler(baseline, max_batch_size=8))]
    for engine_dir in args.engines:
        engine, engine_manifest = load_engine(engine_dir)
        charged = BatchScheduler(engine, max_batch_size=8)
        free = BatchScheduler(engine, max_batch_size=8, cost_model=copy.deepcopy(charged.cost_model))
        free.resume_cost = FreeResume()
        lanes += [Lane(f"{engine_manifest.name} (resume free)", free), Lane(engine_manifest.name, charged)]
    tokenizer = AutoTokenizer.from_pretrained(args.baseline / manifest.target.path)
    if args.prompt_set == "chat":
        texts = [p.text for p in load_prompts("chat")[0]]
    else:
        texts = [p.text for p in builtin_prompts(seed=TRAINING_STYLE_SEED) if p.category in CHAT_CATEGORIES]
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]
    prompt_ids = [list(c["input_ids"] if hasattr(c, "keys") else c) for c in chats]
    params = SamplingParams(max_tokens=args.tokens)
    levels = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        count = max(args.prompts, 2 * concurrency)
        chosen = [prompt_ids[i % len(prompt_ids)] for i in range(count)]
        for lane in lanes:
            lane.start(chosen, concurrency, params)
        while any(lane.busy for lane in lanes):
            for lane in lanes:
                if lane.busy:
                    lane.step()
        baseline_texts, baseline_rate = lanes[0].texts(), None
        for lane in lanes:
            texts_out = lane.texts()
            rate = sum(len(t) for t in texts_out.values()) / lane.seconds
            baseline_rate = baseline_rate or rate
            steps = sum(lane.lengths.values())
            levels.append({
                "deployment": lane.name, "concurrency": concurrency, "requests": count,
                "output_tok_s": round(rate, 1), "speedup": round(rate / baseline_rate, 3),
                "drafting_share": round(sum(n for k, n in lane.lengths.items() if k) / max(steps, 1), 3),
                "greedy_identical_to_baseline": sum(texts_out[i] == baseline_texts[i] for i in texts_out),
            })
            print(json.dumps(levels[-1]), flush=True)
    report = {"command": shlex.join(["python", *sys.argv]), "date": date.today().isoformat(),
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "prompt_set": args.prompt_set, "levels": levels}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
