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
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu.adaptive import ResumeCost
from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import chat_prompt_ids, level_arguments, paired_lanes, run_levels


class FreeResume(ResumeCost):
    """The rule before the charge: resuming costs nothing (catch-ups are still timed)."""

    def charge(self) -> float:
        return 0.0


def free_resume_scheduler(engine, cost_model) -> BatchScheduler:
    """A scheduler on ``engine`` whose rule charges nothing for resuming."""
    scheduler = BatchScheduler(engine, max_batch_size=8, cost_model=cost_model)
    scheduler.resume_cost = FreeResume()
    return scheduler


def run_paired_ab(description: str, variant, label: str) -> None:
    """Parse the command line (baseline engine, engines, levels, ``--prompt-set``) and run the baseline's
    lane and, per engine, ``variant``'s lane (labelled ``label``) beside the shipped scheduler's
    (:func:`~adaptive_interleaved.paired_lanes`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("engines", nargs="+", type=Path)
    level_arguments(parser)
    parser.add_argument("--prompt-set", choices=("chat", "training-style"), default="chat")
    args = parser.parse_args()
    torch.set_num_threads(2)
    lanes, tokenizer_dir = paired_lanes(args.baseline, args.engines, variant, label)
    prompt_ids = chat_prompt_ids(AutoTokenizer.from_pretrained(tokenizer_dir), args.prompt_set)
    run_levels(lanes, prompt_ids, args, prompt_set=args.prompt_set)


def main() -> None:
    run_paired_ab(__doc__.split("\n")[0], free_resume_scheduler, "resume free")


if __name__ == "__main__":
    main()
