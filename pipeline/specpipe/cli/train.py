"""``specpipe train-draft``: train EAGLE/Medusa heads or distil a draft model on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specpipe.cli.options import MINUTES, POSITIVE, TRAINABLE
from specpipe.speculative import METHODS, Method

EAGLE_STYLES = METHODS[Method.EAGLE].flavours


@click.command("train-draft")
@click.option("--target", required=True, help="Target preset (e.g. smollm2-135m) or preset .toml path.")
@click.option("--method", type=TRAINABLE, required=True, help="What to train.")
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    default=None,
    help="Extra data: a JSONL of prompts (the target answers them) or a text file/folder.",
)
@click.option(
    "--budget",
    type=MINUTES,
    default=12.0,
    show_default=True,
    help="Training time budget, minutes (data preparation not counted).",
)
@click.option("--max-steps", type=POSITIVE, default=None, help="Exact number of optimizer steps (reproduces a recipe).")
@click.option(
    "--schedule-steps",
    type=POSITIVE,
    default=None,
    help="Steps of the learning-rate schedule (default: fitted to the budget; recorded in recipe.json).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Output folder (default heads/<target>/<method>)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (data order, initialisation).")
@click.option(
    "--num-prompts",
    type=click.IntRange(min=0),
    default=None,
    help="Built-in self-distillation prompts to use (default 1200 of about 2000; 0 for none).",
)
@click.option(
    "--stdlib-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Tokens of standard-library text (default 60000, 0 for none).",
)
@click.option(
    "--self-instruct",
    type=click.IntRange(min=0),
    default=None,
    help="Requests for a user message sent to the target; its usable replies (about 40 %) become "
    "prompts it then answers (default 0).",
)
@click.option(
    "--trtllm-layout/--no-trtllm-layout",
    default=True,
    show_default=True,
    help="Also write the full TensorRT-LLM converter layout (OUT/trtllm; includes copies of the target's embedding/lm_head).",
)
@click.option(
    "--style",
    type=click.Choice(EAGLE_STYLES),
    default="eagle1",
    show_default=True,
    help="EAGLE head style: eagle1 (EAGLE-1/2 layout) or eagle3 (fused low/mid/top target layers, "
    "training-time test; default output heads/<target>/eagle3).",
)
@click.option(
    "--ttt-steps",
    type=POSITIVE,
    default=None,
    help="Draft steps unrolled in training, each fed the head's own output (EAGLE; default 3, eagle3 4).",
)
@click.option(
    "--sampled-answers",
    type=click.IntRange(min=0),
    default=None,
    help="Answers per prompt sampled from the target besides its greedy one (default 0).",
)
@click.option(
    "--eval-every",
    type=click.IntRange(min=0),
    default=None,
    help="Measure held-out mean accepted length through the drafter every N steps, keep the best head "
    "(default: eagle3 250, others 0 = at the end only).",
)
@click.option(
    "--patience",
    type=POSITIVE,
    default=None,
    help="Stop after this many evaluations without a better held-out acceptance (default 3).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=0),
    default=None,
    help="Also write the resumable checkpoint every N steps (default: every minute only).",
)
@click.option(
    "--resume",
    is_flag=True,
    default=False,
    help="Continue the interrupted run in OUT from its checkpoint (fail if there is none for these settings).",
)
def train_draft(
    target,
    method,
    data,
    budget,
    max_steps,
    schedule_steps,
    out,
    seed,
    num_prompts,
    stdlib_tokens,
    self_instruct,
    trtllm_layout,
    style,
    ttt_steps,
    sampled_answers,
    eval_every,
    patience,
    checkpoint_every,
    resume,
) -> None:
    """Train EAGLE/Medusa heads or distil the draft model against the frozen target, on CPU."""
    from specpipe.training.command import TrainRequest
    from specpipe.training.command import train_draft as run_training

    run_training(
        TrainRequest(
            target=target,
            method=method,
            data=data,
            budget_minutes=budget,
            out_dir=out,
            seed=seed,
            max_steps=max_steps,
            schedule_steps=schedule_steps,
            num_prompts=num_prompts,
            stdlib_tokens=stdlib_tokens,
            self_instruct=self_instruct,
            export_trtllm=trtllm_layout,
            style=style,
            resume=resume,
            sampled_answers=sampled_answers,
            overrides={
                "unroll": ttt_steps,
                "eval_every": eval_every,
                "patience": patience,
                "checkpoint_every": checkpoint_every,
            },
            command="specpipe " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("specpipe") else "",
        )
    )
