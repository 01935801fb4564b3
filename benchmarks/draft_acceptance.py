"""How many tokens per decoding step does a speculative CPU engine's full draft commit on the
benchmark's chat prompts, against prompts of its draft's training distribution?

Each prompt is decoded greedily alone, every step verifying the engine's full draft (fixed
``max_draft_len``, the adaptive rule off), so the figure is the draft's quality, not the rule's
choice: output tokens over decoding steps, the prefill's token left out. It does not depend on the
machine's speed. The two prompt sets:

* ``bench-chat``: the first ``--prompts`` of ``specpipe bench --chat`` (written for the benchmark,
  never trained on);
* ``training-style``: ``--prompts`` questions and requests from
  :func:`~specpipe.training.prompts.builtin_prompts` (:data:`CHAT_CATEGORIES`) with a seed other than
  training's, i.e. the templates and topics the heads were trained on.

Several engines (a shipped head beside a retrained one) are measured one after the other on the same
prompts, each in its own entry of ``engines``. Run::

    PYTHONPATH=pipeline python benchmarks/draft_acceptance.py engines/smollm2-135m-eagle [ENGINE ...] \\
        [--prompts 6] [--tokens 96] [--out benchmarks/results/draft_acceptance.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import date
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.bench.prompts import load_prompts
from specpipe.generation.api import SamplingParams
from specpipe.manifest import read_manifest
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.training.prompts import Prompt, builtin_prompts, chat_input_ids

#: The training prompts' categories that are, like the benchmark's chat set, questions and requests
#: (not summaries or edits of standard-library text, which any drafter copies from the prompt).
CHAT_CATEGORIES = ("chat", "advice", "list")
#: ``builtin_prompts`` seed of the training-style set (training uses seed 0).
TRAINING_STYLE_SEED = 1


def tokens_per_step(scheduler: BatchScheduler, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Mean output tokens per decoding step over ``prompts`` (token ids in the chat template) decoded one at
    a time, and the step count."""
    sizes: list[int] = []
    for ids in prompts:
        chunks: list[int] = []
        scheduler.submit(ids, SamplingParams(max_tokens=max_tokens), lambda out: chunks.append(len(out.token_ids)))
        while scheduler.has_work:
            scheduler.step()
        sizes += chunks[1:]  # the first chunk is the prefill's token
    return sum(sizes) / len(sizes), len(sizes)


def measure(engine_dir: Path, sets: dict[str, list[list[int]]], max_tokens: int) -> dict:
    """One engine's tokens per step on each prompt set (its full draft at every step)."""
    engine, manifest = load_engine(engine_dir)
    results = []
    for name, prompts in sets.items():
        scheduler = BatchScheduler(engine, max_batch_size=1, adaptive=False)
        mean, steps = tokens_per_step(scheduler, prompts, max_tokens)
        results.append({"prompts": name, "tokens_per_step": round(mean, 3), "steps": steps})
        print(json.dumps({"engine": manifest.name, **results[-1]}), flush=True)
    return {"engine": manifest.name, "max_draft_len": engine.max_draft_len, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("engine", type=Path, nargs="+")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument(
        "--seed", type=int, default=TRAINING_STYLE_SEED, help="builtin_prompts seed of the training-style set"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(args.engine[0] / read_manifest(args.engine[0]).target.path)
    sets = {
        "bench-chat": [
            chat_input_ids(tokenizer, Prompt("chat", p.text)) for p in load_prompts("chat")[0][: args.prompts]
        ],
        "training-style": [
            chat_input_ids(tokenizer, p)
            for p in [p for p in builtin_prompts(seed=args.seed) if p.category in CHAT_CATEGORIES][: args.prompts]
        ],
    }
    report = {
        "command": shlex.join(["python", *sys.argv]),
        "date": date.today().isoformat(),
        "tokens": args.tokens,
        "engines": [measure(path, sets, args.tokens) for path in args.engine],
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
