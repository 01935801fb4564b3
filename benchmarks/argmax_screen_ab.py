"""Greedy decoding with and without the bf16 argmax screen of the lm_head, in one process (not a test).

``specpipe.runtime.cpu.argmax_screen.ArgmaxScreen`` scores greedy rows with a bf16 copy of the tied
lm_head and rescores exactly only the tokens that can still be the argmax. This runs, per engine, two
schedulers on one loaded engine: one with the full fp32 lm_head for every row (the screen removed), one
as shipped. Both start from the same measured cost curve (a copy), so the only difference is the
projection. Lanes take one step each in turn, as in ``adaptive_interleaved.py``; speed-ups are against
the first lane (the first engine with the fp32 lm_head), and ``greedy_identical_to_baseline`` counts
texts equal to that lane's::

    PYTHONPATH=pipeline python benchmarks/argmax_screen_ab.py engines/smollm2-135m-none engines/smollm2-135m-eagle \\
        [--concurrency 1,8] [--prompts 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler import BatchScheduler

from adaptive_interleaved import Lane, chat_prompt_ids, level_arguments, run_levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engines", nargs="+", type=Path)
    level_arguments(parser, concurrency="1,8", prompts=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lanes = []
    for engine_dir in args.engines:
        engine, manifest = load_engine(engine_dir)
        screened = BatchScheduler(engine, max_batch_size=8)
        if screened.lm.argmax_screen is None:
            sys.exit(f"{engine_dir}: no argmax screen here (bf16 kernels and a tied lm_head are needed)")
        fp32_head = BatchScheduler(engine, max_batch_size=8, cost_model=copy.deepcopy(screened.cost_model))
        fp32_head.lm.argmax_screen = None
        lanes += [Lane(f"{manifest.name} (fp32 lm_head)", fp32_head), Lane(manifest.name, screened)]
    tokenizer = AutoTokenizer.from_pretrained(args.engines[0] / manifest.target.path)
    run_levels(lanes, chat_prompt_ids(tokenizer, "chat"), args)


if __name__ == "__main__":
    main()
