"""Per-step cost of the CPU engines at batch 1: plain decoding against speculative steps (not a test).

Each engine decodes the same chat prompts greedily; every decoding step (prefill excluded) is timed
with ``time.perf_counter`` between two outputs of ``engine.generate``. Engines run interleaved (prompt by
prompt, repetition by repetition) so machine noise hits all alike, and the report gives medians:

* ``step_ms``: median wall time of one step (ms), and its ratio to the plain step (``vs_plain``);
* ``tokens_per_step``: committed tokens per step (mean accepted length);
* ``propose_ms`` / ``verify_ms``: median time of the drafter's ``propose`` and of the rest of the step.

Usage::

    python benchmarks/step_cost.py --methods none,eagle,medusa [--engines-dir /tmp/engines]
        [--prompts 3] [--max-tokens 64] [--reps 2] [--draft-dtype float32|bfloat16|int8]

Engines are built from the presets into ``--engines-dir`` when missing (``specpipe build --runtime cpu``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

PROMPTS = [
    "What should I consider when adopting a dog?",
    "Write a Python function that checks whether two strings are anagrams.",
    "List 10 animals that live in the desert.",
    "Why is the sky blue? Explain it to a ten-year-old.",
]


def load_engines(methods: list[str], engines_dir: Path, draft_dtype: str | None):
    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest
    from specpipe.runtime.cpu.loader import load_engine

    engines = {}
    for method in methods:
        path = engines_dir / f"smollm2-135m-{method}"
        if not (path / "manifest.json").is_file():
            path = build_cpu(BuildRequest(target="smollm2-135m", draft=method, engines_dir=engines_dir))
        kwargs = {} if draft_dtype is None else {"draft_dtype": draft_dtype}
        engines[method], _ = load_engine(path, **kwargs)
    return engines


def timed_steps(engine, ids: list[int], max_tokens: int) -> dict:
    """Step times (s), propose times (s) and tokens per step of one greedy request."""
    from specpipe.generation.api import SamplingParams

    proposes: list[float] = []
    drafter = engine.drafter
    original = drafter.propose

    def propose(*args, **kwargs):
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        proposes.append(time.perf_counter() - t0)
        return out

    drafter.propose = propose
    steps, tokens = [], []
    try:
        t0 = time.perf_counter()
        for index, out in enumerate(engine.generate(ids, SamplingParams(max_tokens=max_tokens))):
            now = time.perf_counter()
            if index:  # the first output is the prefill
                steps.append(now - t0)
                tokens.append(len(out.token_ids))
            t0 = now
    finally:
        del drafter.propose
    return {"steps": steps, "proposes": proposes, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="none,eagle")
    parser.add_argument("--engines-dir", type=Path, default=Path("/tmp/specpipe-step-cost/engines"))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-dtype", default=None, help="the loader's draft_dtype (default: the loader's own)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    methods = args.methods.split(",")
    engines = load_engines(methods, args.engines_dir, args.draft_dtype)
    tok = AutoTokenizer.from_pretrained(engines[methods[0]].target.model.name_or_path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p in PROMPTS[: args.prompts]]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    samples = {m: {"steps": [], "proposes": [], "tokens": []} for m in methods}
    for method in methods:  # warm-up
        timed_steps(engines[method], prompts[0], 8)
    for _ in range(args.reps):
        for ids in prompts:
            for method in methods:
                for key, values in timed_steps(engines[method], ids, args.max_tokens).items():
                    samples[method][key] += values
    plain = statistics.median(samples[methods[0]]["steps"])
    report = {}
    for method, s in samples.items():
        step = statistics.median(s["steps"])
        propose = statistics.median(s["proposes"]) if s["proposes"] else 0.0
        report[method] = {"step_ms": round(step * 1e3, 2), "vs_plain": round(step / plain, 3),
                          "tokens_per_step": round(statistics.mean(s["tokens"]), 3),
                          "propose_ms": round(propose * 1e3, 2), "verify_ms": round((step - propose) * 1e3, 2),
                          "steps": len(s["steps"])}
    print(json.dumps({"draft_dtype": args.draft_dtype, "threads": args.threads, "methods": report}, indent=2))


if __name__ == "__main__":
    main()
