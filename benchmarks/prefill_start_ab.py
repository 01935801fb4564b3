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
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import chat_prompt_ids, level_arguments, paired_lanes, run_levels


class StartsBesidePrefill(BatchScheduler):
    """The rule before: any request may start drafting in a step with a prompt chunk."""

    start_beside_prefill = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("engines", nargs="+", type=Path)
    level_arguments(parser, prompts=12)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lanes, tokenizer_dir = paired_lanes(
        args.baseline, args.engines, lambda engine, cost: StartsBesidePrefill(engine, max_batch_size=8, cost_model=cost),
        "starts beside prefill")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    run_levels(lanes, chat_prompt_ids(tokenizer, "chat"), args)


if __name__ == "__main__":
    main()
