"""Training loops for ``specpipe train-draft``: EAGLE head, Medusa heads, distilled draft model.

All three are self-distillation against the frozen target: labels are the target's own greedy tokens
(argmax of its logits) at each position of the corpus (:func:`specpipe.training.data.build_corpus`), and
EAGLE also regresses the target's next hidden state.

* Medusa (Cai et al. 2024, arXiv:2401.10774): head k at position t is trained with cross-entropy on the
  target's greedy token at t + k + 1 (the token at t + k + 2), from h_t.
* EAGLE (Li et al. 2024, arXiv:2401.15077, §4.2): windows of consecutive positions;
  ``loss = SmoothL1(f_pred, f_{t+1}) + w_cls * CE(lm_head(f_pred), greedy token after t + 1)``, with
  uniform noise on the input features (the paper's remedy for feature error accumulation).
* EAGLE-3 (Li et al. 2025, arXiv:2503.01840; :mod:`specpipe.training.eagle3_task`): fused low/mid/top
  target features, training-time test over ``unroll`` steps, token loss only, step d weighted
  ``ttt_weight ** (d - 1)``; the best head by held-out mean accepted length is kept (early stopping).
* Draft model (knowledge distillation with hard self-generated labels, as in DistillSpec, Zhou et al.
  2024, arXiv:2310.08461, on-policy data): the truncated target's decoder layers and final norm are
  trained with cross-entropy on the target's greedy tokens; embeddings and the tied lm_head stay frozen.

Cross-entropy runs over the reduced draft vocabulary scored at run time by greedy drafting (FR-Spec,
arXiv:2502.14856; ``draft_vocab_size`` 0 for the full vocabulary): positions whose label is outside it
only contribute the feature loss (EAGLE) or nothing (Medusa, draft model).

Determinism and resumption: batches are drawn from a generator seeded by ``(seed, step)``; the learning
rate schedule is defined over a step count fixed when training starts (``--max-steps``, or the budget
times the speed measured over the first steps). A checkpoint (weights, optimizer, step, schedule) is
written every minute and at the end; rerunning the same command resumes from it. For a given seed and
step count the result is identical; the recipe records the step count.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from specpipe.errors import SpecpipeError
from specpipe.speculative import Method
from specpipe.training.acceptance import ACCEPTANCE_TREE, heldout_prompts, mean_accepted_length
from specpipe.training.config import CHECKPOINT_NAME, TrainConfig, TrainResult
from specpipe.training.eagle3_task import Eagle3Task
from specpipe.training.features import Features
from specpipe.training.precision import training_dtype
from specpipe.training.tasks import TASKS, vocab_maps


def _lr_at(step: int, total: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _step_generator(seed: int, step: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    return g


def train(
    target,
    features: Features,
    cfg: TrainConfig,
    out_dir: Path,
    *,
    end_ids: tuple[int, ...] = (),
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
    holdout_fraction: float = 0.05,
    resume: bool = False,
) -> TrainResult:
    """Train ``cfg.method`` against the frozen ``target`` on ``features``; resume from ``out_dir``'s
    checkpoint when one exists for the same configuration.

    Args:
        target: the target ``LlamaForCausalLM`` (fp32; not modified).
        features: :class:`Features` of the corpus.
        cfg: hyper-parameters.
        out_dir: where the resumable checkpoint is kept (created).
        end_ids: token ids always kept in the draft vocabulary.
        progress: called as ``progress(step, total_steps, {"loss": ...})`` after each step.
        resume: require the checkpoint (``--resume``); without it one of the same configuration is still
            resumed, and none starts afresh.

    Held-out acceptance (heads with a run-time drafter, EAGLE-3): every ``cfg.eval_every`` steps and at
    the end, the mean accepted length on held-out prompts through the drafter
    (:mod:`specpipe.training.acceptance`; its time is not counted in the budget); the best head is the
    result, and training stops after ``cfg.patience`` evaluations without improvement.

    Returns:
        :class:`TrainResult` (the checkpoint is removed once the result is complete).

    Raises:
        SpecpipeError: empty data, too-short sequences, bad hyper-parameters, ``resume`` without a checkpoint.
    """
    if len(features) == 0:
        raise SpecpipeError("the training data is empty: nothing to train on")
    torch.manual_seed(cfg.seed)
    train_set, held = features.split(holdout_fraction, cfg.seed)
    vocab_size = target.config.vocab_size
    vocab, inverse = vocab_maps(train_set, vocab_size, cfg.draft_vocab_size, end_ids)
    task_class = Eagle3Task if cfg.style == "eagle3" else TASKS[Method(cfg.method)]
    task = task_class(target, train_set, cfg, vocab, inverse)
    params = task.parameters() if hasattr(task, "parameters") else list(task.module.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)

    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    cfg_key = json.dumps(
        {**asdict(cfg), "checkpoint_seconds": None, "budget_minutes": None, "checkpoint_every": None}, sort_keys=True
    )
    step, total_steps, elapsed, history = 0, cfg.schedule_steps or cfg.max_steps, 0.0, []
    evals: list[dict[str, Any]] = []
    best: dict[str, Any] = {}  # {"score", "step", "module"}: the best head by held-out acceptance so far
    resumed = False
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, weights_only=False)
        if state.get("config") == cfg_key:
            task.module.load_state_dict(state["module"])
            optimizer.load_state_dict(state["optimizer"])
            step, total_steps, elapsed, history = (
                state["step"],
                state["total_steps"],
                state["elapsed"],
                state["history"],
            )
            evals, best, resumed = state.get("evals", []), state.get("best", {}), True
    if resume and not resumed:
        raise SpecpipeError(
            f"--resume: {ckpt_path} is missing or was written for other settings: rerun the "
            "interrupted command unchanged, or leave out --resume to start afresh"
        )
    prompts = heldout_prompts(held, cfg.eval_prompts) if hasattr(task, "drafter") else []

    def measure() -> None:
        was_training = task.module.training
        task.module.eval()
        result = mean_accepted_length(target, task.drafter(ACCEPTANCE_TREE), prompts, cfg.eval_tokens)
        task.module.train(was_training)
        evals.append({"step": step, "seconds": round(elapsed, 1), **result})
        if not best or result["mean_accepted_length"] > best["score"]:
            best.update(
                score=result["mean_accepted_length"],
                step=step,
                module={k: v.clone() for k, v in task.module.state_dict().items()},
            )

    def stale() -> int:
        """Evaluations since the best one."""
        return sum(1 for e in evals if e["step"] > best["step"]) if best else 0

    def save_checkpoint() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(
            {
                "config": cfg_key,
                "module": task.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "total_steps": total_steps,
                "elapsed": elapsed,
                "history": history,
                "evals": evals,
                "best": best,
            },
            tmp,
        )
        tmp.replace(ckpt_path)

    budget = cfg.budget_minutes * 60.0
    calibration, calibration_start = 50, 25
    mark = 0.0
    last_save = time.monotonic()
    while True:
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
        if cfg.max_steps is None and elapsed >= budget:
            break
        t0 = time.monotonic()
        planned = total_steps if total_steps is not None else 1000
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, planned, cfg.lr)
        loss = task.loss(_step_generator(cfg.seed, step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        elapsed += time.monotonic() - t0
        if step == calibration_start:
            mark = elapsed
        if total_steps is None and step == calibration:
            # Fix the schedule: the steps that fit the budget at the speed of steps 25..50 (the first
            # steps are slower: memory is still being touched).
            per_step = (elapsed - mark) / (calibration - calibration_start)
            total_steps = max(step + 1, step + int((budget - elapsed) / per_step))
        if step % 50 == 0 or step == 1:
            history.append({"step": step, "seconds": round(elapsed, 1), "loss": round(float(loss.detach()), 4)})
        if progress:
            progress(step, total_steps or planned, {"loss": float(loss.detach())})
        if prompts and cfg.eval_every and step % cfg.eval_every == 0:
            measure()
        if time.monotonic() - last_save >= cfg.checkpoint_seconds or (
            cfg.checkpoint_every and step % cfg.checkpoint_every == 0
        ):
            save_checkpoint()
            last_save = time.monotonic()
        if prompts and stale() >= cfg.patience:
            break  # early stop: held-out acceptance stopped improving
    if prompts and (not evals or evals[-1]["step"] != step):
        measure()
    save_checkpoint()

    if best:
        task.module.load_state_dict(best["module"])
    metrics = task.evaluate(held)
    if best:
        metrics["heldout_acceptance"] = {
            "best_step": best["step"],
            "tree": [list(p) for p in ACCEPTANCE_TREE.paths],
            **next(e for e in evals if e["step"] == best["step"]),
        }
        metrics["heldout_evaluations"] = evals
        metrics["stopped_early"] = stale() >= cfg.patience
    meta = {
        "hidden_size": target.config.hidden_size,
        "vocab_size": vocab_size,
        **task.meta(),
    }
    tensors = task.tensors()
    if vocab is not None:
        tensors["draft_vocab"] = vocab
        meta["draft_vocab_size"] = int(vocab.numel())
    meta["schedule_steps"] = int(total_steps or step)
    result = TrainResult(tensors, meta, metrics, step, round(elapsed, 1), history)
    return result


def environment() -> dict[str, Any]:
    """Software and machine facts for the recipe."""
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "training_dtype": training_dtype(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }
