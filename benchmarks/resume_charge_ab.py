"""The adaptive rule with and without the charge for resuming drafts, in one process (not a test).

A request that drafted before but not in its latest step must first catch its drafter up on the
tokens committed meanwhile; the rule charges that (``specpipe.runtime.cpu.adaptive.ResumeCost``). This
runs the baseline and, per method, two schedulers on one loaded engine: one whose rule charges nothing
for resuming, one as shipped. Both start from the same measured cost curve (a copy), so the only
difference is the charge. Lanes take one step each in turn, as in ``adaptive_interleaved.py``; the
records give each lane's output tok/s against the baseline's and its steps per draft length::

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

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.adaptive import ResumeCost
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import Lane, chat_prompt_ids, run_level


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
    prompt_ids = chat_prompt_ids(tokenizer, args.prompt_set)
    params = SamplingParams(max_tokens=args.tokens)
    levels = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        levels += run_level(lanes, prompt_ids, concurrency, max(args.prompts, 2 * concurrency), params)
    report = {"command": shlex.join(["python", *sys.argv]), "date": date.today().isoformat(),
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "prompt_set": args.prompt_set, "levels": levels}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
