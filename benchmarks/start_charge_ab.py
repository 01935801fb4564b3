"""The adaptive rule with and without the charge for a request's first drafts, in one process (not a test).

Before a request drafts for the first time its drafter catches up on the request's whole context (a
draft model's forward over the prompt and the tokens so far, EAGLE's head over the prompt's features);
the rule charges that, spread over the steps requests draft in
(``specpipe.runtime.cpu.adaptive.StartCost``). This runs the baseline and, per method, two schedulers on
one loaded engine: one whose rule charges nothing for starting, one as shipped. Both start from the same
measured cost curve (a copy), so the only difference is the charge. Lanes take one step each in turn, as
in ``adaptive_interleaved.py``; the records give each lane's output tok/s against the baseline's and its
steps per draft length::

    PYTHONPATH=pipeline python benchmarks/start_charge_ab.py engines/smollm2-135m-none \\
        engines/smollm2-135m-smollm2-draft engines/smollm2-135m-eagle [--concurrency 1,2,4] [--prompts 8] [--prompt-set chat|training-style] [--out FILE]
"""

from __future__ import annotations

from specpipe.runtime.cpu.adaptive import StartCost
from specpipe.runtime.cpu.scheduler import BatchScheduler

from resume_charge_ab import run_paired_ab


class FreeStart(StartCost):
    """The rule before the charge: starting to draft costs nothing (first catch-ups are still timed)."""

    def charge(self, context_tokens: int, remaining_tokens: int) -> float:
        return 0.0


def free_start_scheduler(engine, cost_model) -> BatchScheduler:
    """A scheduler on ``engine`` whose rule charges nothing for a request's first drafts."""
    scheduler = BatchScheduler(engine, max_batch_size=8, cost_model=cost_model)
    scheduler.start_cost = FreeStart()
    return scheduler


def main() -> None:
    run_paired_ab(__doc__.split("\n")[0], free_start_scheduler, "start free")


if __name__ == "__main__":
    main()
