"""One plain decoding step at batch 1: the CPU runtime's batched forward against llama.cpp (issue 11,
item 7), measured side by side on the same fp32 weights (not a test).

Both decode the same chat prompt greedily, one token per forward, after the same prefill; the figure is
the median over ``--reps`` interleaved runs of (wall time of ``--tokens`` steps) / ``--tokens``, in ms:

* ``specpipe``: :class:`~specpipe.runtime.cpu.batched_lm.BatchedLM` (the scheduler's forward) plus
  the greedy ``lm_head`` (:class:`~specpipe.runtime.cpu.argmax_screen.ArgmaxScreen`, as a deployment
  scores greedy requests) and the argmax, one request, three times: with the decoder's dense weight
  copies used for one row (``F.linear``, ``--dense-rows all``), with the prepacked kernels only (MKL's
  packed GEMM where PyTorch has MKL: what a deployment runs by default,
  :mod:`specpipe.runtime.cpu.dense_rows`), and the latter with the full fp32 ``lm_head`` instead of the
  screen (``specpipe_packed_fp32_head``: what a sampled request's step costs);
* ``llama.cpp``: llama-cpp-python's ``generate`` with ``top_k=1`` on an f32 GGUF of the same checkpoint
  (see ``benchmarks/llama_cpp_column.py`` for building llama-cpp-python and the GGUF).

``ratio`` divides the medians; ``paired_ratio`` is the median of each repetition's own ratio (the three
runs of a repetition follow each other, so a slow stretch of the shared machine slows all three).

Usage::

    PYTHONPATH=pipeline python benchmarks/plain_step.py --engine engines/smollm2-135m-none \\
        --gguf /tmp/smollm2-f32.gguf [--tokens 64] [--reps 5] [--threads 2] \\
        [--out benchmarks/results/plain_step.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

PROMPT = "Why is the sky blue? Explain it to a ten-year-old."


def specpipe_step_seconds(lm, prompt_ids: list[int], tokens: int, screened: bool = True) -> float:
    """Seconds per greedy step of one request on ``lm`` (a BatchedLM), after prefilling ``prompt_ids``;
    ``screened``: logits through the argmax screen (``BatchedLM.project``'s ``argmax_only``)."""
    from specpipe.runtime.cpu.batched_lm import BatchEntry

    slot = lm.allocate()
    try:
        with torch.inference_mode():
            token = int(lm.project(lm.hidden([BatchEntry(slot, list(prompt_ids))])[-1:], [screened]).argmax())
            start = time.perf_counter()
            for _ in range(tokens):
                token = int(lm.project(lm.hidden([BatchEntry(slot, [token])]), [screened]).argmax())
            return (time.perf_counter() - start) / tokens
    finally:
        lm.release(slot)


def llama_step_seconds(llm, prompt_ids: list[int], tokens: int) -> float:
    """Seconds per greedy step of llama.cpp after prefilling ``prompt_ids`` (the prefill is not timed)."""
    llm.reset()
    start, produced = None, 0
    for _ in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if start is None:  # the first token comes from the prefill
            start = time.perf_counter()
            continue
        produced += 1
        if produced >= tokens:
            break
    return (time.perf_counter() - start) / produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True, help="a CPU engine directory (its target is measured)")
    parser.add_argument("--gguf", type=Path, required=True, help="f32 GGUF of the same checkpoint")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from specpipe.runtime.cpu.batched_lm import BatchedLM
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.runtime.cpu.prepack import set_dense_rows

    engine, manifest = load_engine(args.engine, dense_copy=True)
    tokenizer = AutoTokenizer.from_pretrained(args.engine / manifest.target.path)
    prompt_ids = list(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                    return_dict=True)["input_ids"])
    lm = BatchedLM(engine.target.model, 1)
    llm = Llama(model_path=str(args.gguf), n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    if lm.argmax_screen is None:
        sys.exit("this CPU or model has no argmax screen (bf16 kernels, tied lm_head): nothing to compare")
    ours, packed, fp32_head, theirs = [], [], [], []
    for rows in (1, 0):
        set_dense_rows(engine.target.model, rows)
        specpipe_step_seconds(lm, prompt_ids, 4)
    specpipe_step_seconds(lm, prompt_ids, 4, screened=False)
    llama_step_seconds(llm, prompt_ids, 4)
    for _ in range(args.reps):
        set_dense_rows(engine.target.model, 1)
        ours.append(specpipe_step_seconds(lm, prompt_ids, args.tokens))
        set_dense_rows(engine.target.model, 0)
        packed.append(specpipe_step_seconds(lm, prompt_ids, args.tokens))
        fp32_head.append(specpipe_step_seconds(lm, prompt_ids, args.tokens, screened=False))
        theirs.append(llama_step_seconds(llm, prompt_ids, args.tokens))
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "setup": {"prompt_tokens": len(prompt_ids), "tokens": args.tokens, "reps": args.reps, "threads": args.threads,
                  "torch": torch.__version__, "machine": platform.machine(), "cpu": _cpu_name(),
                  "date": time.strftime("%Y-%m-%d %H:%M")},
        "specpipe_step_ms": [round(s * 1e3, 2) for s in ours],
        "specpipe_packed_step_ms": [round(s * 1e3, 2) for s in packed],
        "specpipe_packed_fp32_head_step_ms": [round(s * 1e3, 2) for s in fp32_head],
        "llama_cpp_step_ms": [round(s * 1e3, 2) for s in theirs],
        "specpipe_median_ms": round(statistics.median(ours) * 1e3, 2),
        "specpipe_packed_median_ms": round(statistics.median(packed) * 1e3, 2),
        "specpipe_packed_fp32_head_median_ms": round(statistics.median(fp32_head) * 1e3, 2),
        "llama_cpp_median_ms": round(statistics.median(theirs) * 1e3, 2),
        "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
        "packed_ratio": round(statistics.median(packed) / statistics.median(theirs), 3),
        "paired_ratio": round(statistics.median(a / b for a, b in zip(ours, theirs)), 3),
        "paired_packed_ratio": round(statistics.median(a / b for a, b in zip(packed, theirs)), 3),
        "paired_packed_fp32_head_ratio": round(statistics.median(a / b for a, b in zip(fp32_head, theirs)), 3),
        "paired_screen_saving": round(statistics.median(a / b for a, b in zip(packed, fp32_head)), 3),
    }
    report(result, args.out)


def report(result: dict, out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` (its folder created) when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                return line.split(":", 1)[1].strip() + (" (AVX-512)" if "avx512f" in flags else " (AVX2, no AVX-512)")
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
