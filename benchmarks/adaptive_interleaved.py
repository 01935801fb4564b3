"""How many output tokens per second does each CPU speculative deployment serve against plain decoding
at concurrency 1 to 8, measured in one process?

Every engine gets its own :class:`~specpipe.runtime.cpu.scheduler.scheduler.BatchScheduler`; at each concurrency
level the schedulers take **one step each in turn**, each kept at that many requests in flight (closed
loop over the same prompts, 128 greedy tokens), until every one has served its prompts. A deployment's
throughput is its output tokens over the seconds spent in its own steps, so a shared machine that slows
down for a while slows every deployment alike: this resolves the few percent that decide "never slower
than the baseline", which deployments served one after another do not. The first engine is the
baseline of the ratios; greedy texts are compared with the baseline's. Run it on an otherwise idle
machine::

    PYTHONPATH=pipeline python benchmarks/adaptive_interleaved.py engines/smollm2-135m-{none,ngram,eagle} \\
        [--concurrency 1,2,4,8] [--prompts 8] [--tokens 128] [--prompt-set chat|training-style]
        [--llama-gguf /tmp/smollm2-f32.gguf] [--out benchmarks/results/adaptive_interleaved.json]

``--llama-gguf`` adds llama.cpp's plain greedy decoding on the same weights as a lane at concurrency 1,
one token per turn (:class:`plain_step.LlamaCppLane`; setup in ``plain_step.py``); its texts may differ
from the baseline's where two tokens' logits are within the two kernels' rounding.
``--prompt-set training-style`` takes the prompts of ``draft_acceptance.py``'s training-style set instead
of ``specpipe bench --chat``'s: what the drafts do on the distribution they were trained on.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from datetime import date
from pathlib import Path

import torch
from draft_acceptance import CHAT_CATEGORIES, TRAINING_STYLE_SEED
from plain_step import LlamaCppLane, load_llama
from transformers import AutoTokenizer

from specpipe.bench.prompts import load_prompts
from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.dense_rows import apply_dense_rows, dense_copies_wanted
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.training.prompts import builtin_prompts


class Lane:
    """One engine's scheduler and its share of a level."""

    def __init__(self, name: str, scheduler: BatchScheduler):
        self.name, self.scheduler = name, scheduler

    def start(self, prompt_ids: list[list[int]], concurrency: int, params: SamplingParams) -> None:
        self.todo, self.concurrency, self.params = list(range(len(prompt_ids))), concurrency, params
        self.prompt_ids, self.outputs, self.seconds, self.lengths = prompt_ids, {}, 0.0, {}

    @property
    def busy(self) -> bool:
        return bool(self.todo) or self.scheduler.has_work

    def step(self) -> None:
        scheduler = self.scheduler
        while self.todo and len(scheduler.active) + scheduler.waiting < self.concurrency:
            index = self.todo.pop(0)
            self.outputs[index] = []
            scheduler.submit(self.prompt_ids[index], self.params, self.outputs[index].append)
        started = time.perf_counter()
        scheduler.step()
        self.seconds += time.perf_counter() - started
        for length in scheduler.last_draft_lengths:
            self.lengths[length] = self.lengths.get(length, 0) + 1

    def texts(self) -> dict[int, list[int]]:
        return {i: [t for step in steps for t in step.token_ids] for i, steps in self.outputs.items()}


def chat_prompt_ids(tokenizer, prompt_set: str) -> list[list[int]]:
    """The token ids of a prompt set in the target's chat template: ``chat`` (``specpipe bench --chat``'s,
    never trained on) or ``training-style`` (questions and requests of the heads' training templates, with
    another seed; ``draft_acceptance.py``'s set)."""
    if prompt_set == "chat":
        texts = [p.text for p in load_prompts("chat")[0]]
    else:
        texts = [p.text for p in builtin_prompts(seed=TRAINING_STYLE_SEED) if p.category in CHAT_CATEGORIES]
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True) for text in texts
    ]
    return [list(c["input_ids"] if hasattr(c, "keys") else c) for c in chats]


def run_level(lanes: list[Lane], prompt_ids: list[list[int]], concurrency: int, count: int, params) -> list[dict]:
    """Serve ``count`` prompts (cycling ``prompt_ids``) on every lane at ``concurrency`` (lanes with a lower
    ``max_concurrency`` sit the level out), the lanes taking one step each in turn; one record per lane,
    speed-ups against the first lane's."""
    chosen = [prompt_ids[i % len(prompt_ids)] for i in range(count)]
    lanes = [lane for lane in lanes if concurrency <= getattr(lane, "max_concurrency", concurrency)]
    for lane in lanes:
        lane.start(chosen, concurrency, params)
    while any(lane.busy for lane in lanes):
        for lane in lanes:
            if lane.busy:
                lane.step()
    baseline_texts, baseline_rate, records = lanes[0].texts(), None, []
    for lane in lanes:
        texts = lane.texts()
        rate = sum(len(t) for t in texts.values()) / lane.seconds
        baseline_rate = baseline_rate or rate
        records.append(
            {
                "deployment": lane.name,
                "concurrency": concurrency,
                "requests": count,
                "output_tok_s": round(rate, 1),
                "speedup": round(rate / baseline_rate, 3),
                "step_seconds": round(lane.seconds, 2),
                "draft_lengths": dict(sorted(lane.lengths.items())),
                "greedy_identical_to_baseline": sum(texts[i] == baseline_texts[i] for i in texts),
            }
        )
        print(json.dumps(records[-1]), flush=True)
    return records


def level_arguments(parser: argparse.ArgumentParser, concurrency: str = "1,2,4,8", prompts: int = 8) -> None:
    """The level options: ``--concurrency``, ``--prompts``, ``--tokens``, ``--out``."""
    parser.add_argument("--concurrency", default=concurrency)
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts per level (at least 2 x concurrency)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)


def run_levels(lanes: list[Lane], prompt_ids: list[list[int]], args: argparse.Namespace, **extra) -> dict:
    """:func:`run_level` at each of ``args.concurrency`` with greedy ``args.tokens``-token answers; the
    report (command, date, machine, torch, ``extra``, levels), also written to ``args.out`` when given."""
    params = SamplingParams(max_tokens=args.tokens)
    levels = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        levels += run_level(lanes, prompt_ids, concurrency, max(args.prompts, 2 * concurrency), params)
    report = {
        "command": shlex.join(["python", *sys.argv]),
        "date": date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        **extra,
        "levels": levels,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("engines", nargs="+", type=Path)
    level_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompt-set",
        choices=("chat", "training-style"),
        default="chat",
        help="chat: specpipe bench --chat's prompts (never trained on); training-style: questions and "
        "requests of the heads' training templates, with another seed (draft_acceptance.py)",
    )
    parser.add_argument(
        "--llama-gguf",
        type=Path,
        help="also decode with llama.cpp (llama-cpp-python) on this f32 GGUF of the same checkpoint, "
        "at concurrency 1, as one more lane (see plain_step.py)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lanes, cost_curves = [], {}
    for engine_dir in args.engines:
        engine, manifest = load_engine(engine_dir, dense_copy=dense_copies_wanted(None))
        apply_dense_rows(engine, None)
        scheduler = BatchScheduler(engine, max_batch_size=8)
        lanes.append(Lane(manifest.name, scheduler))
        cost_curves[manifest.name] = scheduler.policy.cost_model.describe()
        tokenizer = AutoTokenizer.from_pretrained(engine_dir / manifest.target.path)
    if args.llama_gguf:
        llm = load_llama(engine_dir / manifest.target.path, args.llama_gguf, None, args.threads)
        lanes.append(LlamaCppLane(llm, tokenizer.eos_token_id))
    prompt_ids = chat_prompt_ids(tokenizer, args.prompt_set)
    run_levels(lanes, prompt_ids, args, prompt_set=args.prompt_set, cost_curves=cost_curves)


if __name__ == "__main__":
    main()
