"""What does weight-only quantization (``-q int8-wo``, ``-q int4-wo``) do to the plain greedy CPU
baseline against fp32: its decoding speed, its tokens, and its model process's resident memory?

Run it on an otherwise idle machine::

    specpipe build --target smollm2-135m --draft none                 # engines/smollm2-135m-none
    specpipe build --target smollm2-135m --draft none -q int8-wo      # engines/smollm2-135m-none-int8-wo
    specpipe build --target smollm2-135m --draft none -q int4-wo      # engines/smollm2-135m-none-int4-wo
    PYTHONPATH=pipeline python benchmarks/quantized_baseline.py engines/smollm2-135m-none{,-int8-wo,-int4-wo} \\
        [--prompts 6] [--tokens 128] [--rounds 3] [--out benchmarks/results/quantized_baseline.json]

Speed: one process loads every engine and decodes the same chat prompts greedily at batch 1, engine
after engine **per prompt**, ``--rounds`` times (a machine that slows down for a while slows every
engine alike); an engine's tokens/s is its generated tokens over its decoding seconds (prefill
included), with the median per prompt beside it, and ``speed_vs_first`` is that over the first
engine's. ``same_tokens_as_first``: the share of generated tokens equal to the first engine's, position
by position (a quantized model decodes other text than fp32 once one argmax differs).

Memory: each engine is loaded again in a fresh process (``--child``), which reports ``/proc/self/status``
(``VmRSS``, ``RssAnon``, ``RssFile``) once loaded and after decoding one prompt, the bytes of the
engine's ``*.safetensors`` files (``weight_files_mib``: what fp32 engines hold in the target folder), and
the bytes held by its linear layers (``quantized_linear_mib``: int8/int4 weights, bf16 scales, biases).
The JSON result records the command that made it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.model.quantized_linear import quantized_bytes
from specpipe.runtime.cpu.model.weights_memory import resident_bytes
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

MiB = 2**20

#: Chat prompts (user turns), formatted with the target's chat template.
QUESTIONS = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about the sea.",
    "What are three tips for learning a new language?",
    "Summarize the plot of a detective story in four sentences.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Give me a recipe for a simple tomato soup.",
    "What is the difference between weather and climate?",
]


def chat_prompts(engine_dir: Path, count: int) -> list[list[int]]:
    """``count`` chat prompts as token ids, with the engine target's chat template."""
    tokenizer = AutoTokenizer.from_pretrained(engine_dir / "target")
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in (QUESTIONS * (count // len(QUESTIONS) + 1))[:count]
    ]


def weight_files_bytes(engine_dir: Path) -> int:
    """Bytes of the engine's ``*.safetensors`` files (target and draft; hard links counted once)."""
    seen, total = set(), 0
    for path in engine_dir.rglob("*.safetensors"):
        stat = path.stat()
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_size
    return total


def child(engine_dir: Path, tokens: int) -> dict:
    """Load one engine in this (fresh) process and report its memory (module doc)."""
    engine, manifest = load_engine(engine_dir)
    loaded = resident_bytes()
    prompt = chat_prompts(engine_dir, 1)[0]
    generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=tokens))
    served = resident_bytes()
    return {
        "engine": str(engine_dir),
        "quantization": manifest.quantization or "fp32",
        "weight_files_mib": round(weight_files_bytes(engine_dir) / MiB, 1),
        "quantized_linear_mib": round(quantized_bytes(engine.target.model) / MiB, 1),
        "loaded_mib": {k: round(v / MiB, 1) for k, v in loaded.items()},
        "served_mib": {k: round(v / MiB, 1) for k, v in served.items()},
    }


def speed(engine_dirs: list[Path], prompts: int, tokens: int, rounds: int) -> list[dict]:
    """Interleaved greedy decoding of every engine (module doc)."""
    engines = [load_engine(d)[0] for d in engine_dirs]
    inputs = chat_prompts(engine_dirs[0], prompts)
    params = SamplingParams(max_tokens=tokens)
    schedulers = [solo_scheduler(engine) for engine in engines]
    for scheduler in schedulers:
        generate_all(scheduler, inputs[0], SamplingParams(max_tokens=8))  # warm-up
    seconds = [[] for _ in engines]
    outputs: list[list[list[int]]] = [[] for _ in engines]
    for round_index in range(rounds):
        for prompt in inputs:
            for i, scheduler in enumerate(schedulers):
                start = time.perf_counter()
                out, _ = generate_all(scheduler, prompt, params)
                seconds[i].append((time.perf_counter() - start, len(out)))
                if round_index == 0:
                    outputs[i].append(out)
    first_rate = None
    results = []
    for i, engine_dir in enumerate(engine_dirs):
        total_tokens = sum(n for _, n in seconds[i])
        rate = total_tokens / sum(s for s, _ in seconds[i])
        first_rate = first_rate or rate
        same = sum(a == b for got, want in zip(outputs[i], outputs[0]) for a, b in zip(got, want))
        results.append(
            {
                "engine": str(engine_dir),
                "tokens_per_s": round(rate, 2),
                "median_prompt_tokens_per_s": round(statistics.median(n / s for s, n in seconds[i]), 2),
                "speed_vs_first": round(rate / first_rate, 3),
                "same_tokens_as_first": round(same / sum(len(o) for o in outputs[0]), 3),
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("engines", nargs="+", type=Path, help="engine directories; the first is the reference (fp32)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.engines[0], args.tokens)), flush=True)
        return
    memory = []
    for engine_dir in args.engines:
        run = subprocess.run(
            [sys.executable, __file__, str(engine_dir), "--child", "--tokens", str(args.tokens)],
            capture_output=True,
            text=True,
            check=True,
        )
        memory.append(json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:]))
        print(json.dumps(memory[-1]), flush=True)
    rates = speed(args.engines, args.prompts, args.tokens, args.rounds)
    for row in rates:
        print(json.dumps(row), flush=True)
    report = {
        "command": shlex.join(["python", *sys.argv]),
        "date": date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "settings": {"prompts": args.prompts, "tokens": args.tokens, "rounds": args.rounds},
        "speed": rates,
        "memory": memory,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
