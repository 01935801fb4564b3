"""The adaptive rule with a larger drafting margin against the shipped one, in one process (not a test).

The rule drafts only where its estimate beats plain decoding by ``BatchScheduler.draft_margin``
(:data:`~specpipe.runtime.cpu.adaptive.DRAFT_MARGIN` as shipped). This runs the baseline and, per
method, two schedulers on one loaded engine: one with ``--margin``, one as shipped, both from the same
measured cost curve (a copy). Lanes take one step each in turn, as in ``adaptive_interleaved.py``.
``results/margin_ab.json`` and ``margin_ab_rerun.json`` compare 0.08 with the 0.03 shipped then, which
is why 0.08 is shipped now::

    PYTHONPATH=pipeline python benchmarks/margin_ab.py engines/smollm2-135m-none \\
        engines/smollm2-135m-ngram engines/smollm2-135m-eagle --margin 0.08 [--concurrency 1,2,4,8] [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import chat_prompt_ids, level_arguments, paired_lanes, run_levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--margin", type=float, required=True, help="the variant's drafting margin (share)")
    level_arguments(parser, prompts=12)
    args = parser.parse_args()
    torch.set_num_threads(2)

    class WithMargin(BatchScheduler):
        draft_margin = args.margin

    lanes, tokenizer_dir = paired_lanes(
        args.baseline, args.engines, lambda engine, cost: WithMargin(engine, max_batch_size=8, cost_model=cost),
        f"margin {args.margin:g}")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    run_levels(lanes, chat_prompt_ids(tokenizer, "chat"), args, margin=args.margin)


if __name__ == "__main__":
    main()
