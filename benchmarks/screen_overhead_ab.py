"""The argmax screen's work after its bf16 GEMV, before and after it was trimmed, in one process (not a test).

At batch 1 the screen's passes over the 49,152 scores (``aminmax`` on bf16, which PyTorch does not
vectorise, a row count by ``sum``, a cleared mask, a fresh ``-inf`` tensor) and ``BatchedLM.project``'s
copy of the screen's output into another ``[rows, vocab]`` tensor took about as long as half the GEMV.
The trimmed screen widens the scores to float32 once (exact), takes ``amax``/``amin``, counts the kept
tokens from ``nonzero``'s rows, and writes the exact scores into the widened buffer, which ``project``
returns as it is when every row is greedy. ``PreviousScreen`` below is the screen as it was before
(commit 9f8ab2b), kept here to compare against.

Both decode the same chat prompt greedily at batch 1 on one loaded target, one token per forward, lanes
alternating per repetition; per repetition the figure is the median over ``--tokens`` steps of the
projection's time (``project``) and the mean step time (decoder forward, projection and argmax). Every
lane's tokens must equal the first lane's::

    PYTHONPATH=pipeline python benchmarks/screen_overhead_ab.py engines/smollm2-135m-none \\
        [--tokens 64] [--reps 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specpipe.runtime.cpu.argmax_screen import MAX_CANDIDATES, ArgmaxScreen
from specpipe.runtime.cpu.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.loader import load_engine

from plain_step import PROMPT, _cpu_name, report


class PreviousScreen(ArgmaxScreen):
    """The screen's passes as they were before (same bound, same kept tokens, same output values)."""

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = hidden.float().contiguous()
        screen = self.screen(hidden)
        low, high = screen.aminmax(dim=1, keepdim=True)
        largest = torch.maximum(low.abs(), high.abs()).float()
        bound = hidden.norm(dim=1, keepdim=True) * (self._product_error * self.largest_row_norm) + largest * self._output_error
        threshold = high.float() - 2 * bound
        candidates = screen >= threshold
        left_out = ~torch.isfinite(threshold[:, 0]) | (candidates.sum(dim=1) > MAX_CANDIDATES)
        candidates[left_out] = False
        out = torch.full(screen.shape, float("-inf"))
        rows, tokens = candidates.nonzero(as_tuple=True)
        out[rows, tokens] = (self.weight[tokens].double() * hidden[rows].double()).sum(dim=1).float()
        return out, left_out


def previous_project(lm: BatchedLM, hidden: torch.Tensor) -> torch.Tensor:
    """``BatchedLM.project`` of greedy rows as it was before: the screen's output copied into a new tensor."""
    out = hidden.new_empty(len(hidden), lm.argmax_screen.weight.shape[0])
    screened = torch.arange(len(hidden))
    out[screened], left_out = lm.argmax_screen.logits(hidden[screened])
    if bool(left_out.any()):
        out[left_out] = lm.model.lm_head(hidden[left_out]).float()
    return out


def decode(lm: BatchedLM, prompt_ids: list[int], tokens: int, project) -> tuple[float, float, list[int]]:
    """Median projection seconds, mean step seconds and the greedy tokens of one request at batch 1."""
    slot, out, projections = lm.allocate(), [], []
    try:
        with torch.inference_mode():
            token = int(project(lm.hidden([BatchEntry(slot, list(prompt_ids))])[-1:]).argmax())
            start = time.perf_counter()
            for _ in range(tokens):
                hidden = lm.hidden([BatchEntry(slot, [token])])
                began = time.perf_counter()
                logits = project(hidden)
                projections.append(time.perf_counter() - began)
                token = int(logits.argmax())
                out.append(token)
            return statistics.median(projections), (time.perf_counter() - start) / tokens, out
    finally:
        lm.release(slot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine, manifest = load_engine(args.engine)
    tokenizer = AutoTokenizer.from_pretrained(args.engine / manifest.target.path)
    prompt_ids = list(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                    return_dict=True)["input_ids"])
    lm = BatchedLM(engine.target.model, 1)
    if lm.argmax_screen is None:
        sys.exit("this CPU or model has no argmax screen (bf16 kernels, tied lm_head): nothing to compare")
    trimmed, previous = lm.argmax_screen, PreviousScreen(lm.argmax_screen.weight)

    def run_previous(steps):
        lm.argmax_screen = previous
        try:
            return decode(lm, prompt_ids, steps, lambda h: previous_project(lm, h))
        finally:
            lm.argmax_screen = trimmed

    def run_trimmed(steps):
        return decode(lm, prompt_ids, steps, lambda h: lm.project(h, [True] * len(h)))

    lanes = {"previous": run_previous, "trimmed": run_trimmed}
    reference = None
    for run in lanes.values():  # warm-up, and the tokens compared
        tokens = run(args.tokens)[2]
        reference = reference or tokens
        if tokens != reference:
            sys.exit("the greedy tokens differ between the lanes")
    projection = {name: [] for name in lanes}
    step = {name: [] for name in lanes}
    for _ in range(args.reps):
        for name, run in lanes.items():
            p, s, _ = run(args.tokens)
            projection[name].append(p)
            step[name].append(s)
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "setup": {"prompt_tokens": len(prompt_ids), "tokens": args.tokens, "reps": args.reps, "threads": 2,
                  "torch": torch.__version__, "cpu": _cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M")},
        "projection_ms": {k: [round(v * 1e3, 3) for v in vs] for k, vs in projection.items()},
        "step_ms": {k: [round(v * 1e3, 2) for v in vs] for k, vs in step.items()},
        "projection_median_ms": {k: round(statistics.median(vs) * 1e3, 3) for k, vs in projection.items()},
        "step_median_ms": {k: round(statistics.median(vs) * 1e3, 2) for k, vs in step.items()},
        "paired_projection_ratio": round(statistics.median(
            a / b for a, b in zip(projection["trimmed"], projection["previous"])), 3),
        "paired_step_ratio": round(statistics.median(a / b for a, b in zip(step["trimmed"], step["previous"])), 3),
        "greedy_tokens_identical": True,
    }
    report(result, args.out)


if __name__ == "__main__":
    main()
