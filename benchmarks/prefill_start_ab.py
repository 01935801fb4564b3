"""The adaptive rule with and without starting drafts beside a prompt chunk, in one process (not a test).

In a step that prefills a prompt chunk, a few more verified tokens look nearly free to the rule, but a
request that starts drafting there first catches its drafter up on its whole context, and its run ends
at the next step. ``BatchScheduler.start_beside_prefill`` (False as shipped) forbids such starts. This
runs the baseline and, per method, two schedulers on one loaded engine: one that may start beside a
chunk, one as shipped, both from the same measured cost curve (a copy). Lanes take one step each in
turn, as in ``adaptive_interleaved.py``; the records give each lane's output tok/s against the
baseline's and its request-steps per draft length::

    PYTHONPATH=pipeline python benchmarks/prefill_start_ab.py engines/smollm2-135m-none \\
        engines/smollm2-135m-ngram engines/smollm2-135m-eagle [--concurrency 1,2,4,8] [--prompts 12] [--out FILE]
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
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import Lane, chat_prompt_ids, run_level


class StartsBesidePrefill(BatchScheduler):
    """The rule before: any request may start drafting in a step with a prompt chunk."""

    start_beside_prefill = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--prompts", type=int, default=12, help="prompts per level (at least 2 x concurrency)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    baseline, manifest = load_engine(args.baseline)
    lanes = [Lane(manifest.name, BatchScheduler(baseline, max_batch_size=8))]
    for engine_dir in args.engines:
        engine, engine_manifest = load_engine(engine_dir)
        shipped = BatchScheduler(engine, max_batch_size=8)
        before = StartsBesidePrefill(engine, max_batch_size=8, cost_model=copy.deepcopy(shipped.cost_model))
        lanes += [Lane(f"{engine_manifest.name} (starts beside prefill)", before), Lane(engine_manifest.name, shipped)]
    tokenizer = AutoTokenizer.from_pretrained(args.baseline / manifest.target.path)
    prompt_ids = chat_prompt_ids(tokenizer, "chat")
    params = SamplingParams(max_tokens=args.tokens)
    levels = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        levels += run_level(lanes, prompt_ids, concurrency, max(args.prompts, 2 * concurrency), params)
    report = {"command": shlex.join(["python", *sys.argv]), "date": date.today().isoformat(),
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "levels": levels}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
