"""Training loops for ``specpipe train-draft``: EAGLE head, Medusa heads, distilled draft model.

All three are self-distillation against the frozen target: labels are the target's own greedy tokens
(argmax of its logits) at each position of the corpus (:func:`specpipe.training.data.build_corpus`), and
EAGLE also regresses the target's next hidden state.

* Medusa (Cai et al. 2024, arXiv:2401.10774): head k at position t is trained with cross-entropy on the
  target's greedy token at t + k + 1 (the token at t + k + 2), from h_t.
* EAGLE (Li et al. 2024, arXiv:2401.15077, §4.2): windows of consecutive positions;
  ``loss = SmoothL1(f_pred, f_{t+1}) + w_cls * CE(lm_head(f_pred), greedy token after t + 1)``, with
  uniform noise on the input features (the paper's remedy for feature error accumulation).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.heads import EagleConfig, EagleHead, MedusaHeads, ReducedLMHead, frequent_tokens
from specpipe.training.data import Features

METHODS = ("eagle", "medusa", "draft-model")
CHECKPOINT_NAME = ".train-checkpoint.pt"


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults: the shipped SmolLM2 recipe).

    Attributes:
        method: ``eagle``, ``medusa`` or ``draft-model``.
        budget_minutes: wall-clock training budget (> 0); data preparation is not counted.
        max_steps: fixed number of optimizer steps (overrides the budget's estimate; exact reproduction).
        seed: seeds initialisation, batch sampling and the held-out split.
        lr: peak AdamW learning rate (warm-up 20 steps, cosine decay to 10 %).
        batch: positions (Medusa), windows (EAGLE, draft model) per step.
        window: tokens per window (EAGLE, draft model).
        draft_vocab_size: reduced vocabulary scored by the heads (``0``: full vocabulary).
        num_heads, num_layers: Medusa heads and residual blocks per head.
        draft_layers: decoder layers kept in the distilled draft model.
        cls_weight: EAGLE's weight of the token loss against the feature loss.
        noise: EAGLE's uniform input-feature noise, as a fraction of the features' RMS.
        unroll: EAGLE steps unrolled per window in training (1: the EAGLE-1 objective; more: each
            deeper step reads the head's own predictions, as drafting at that depth does).
        answer_weight: sampling weight of self-distilled answer positions against other positions.
        checkpoint_seconds: interval between resumable checkpoints.
        schedule_steps: steps of the learning-rate schedule (warm-up + cosine); ``None``: fixed after 50
            steps from the measured speed so that the schedule fills the budget. After it the rate stays
            at its final value (10 % of ``lr``) while budget remains.
    """

    method: str
    budget_minutes: float = 12.0
    max_steps: int | None = None
    seed: int = 0
    lr: float = 1e-3
    batch: int = 256
    window: int = 64
    draft_vocab_size: int = 8192
    num_heads: int = 3
    num_layers: int = 1
    draft_layers: int = 4
    cls_weight: float = 0.5
    noise: float = 0.1
    unroll: int = 1
    answer_weight: float = 3.0
    checkpoint_seconds: float = 60.0
    schedule_steps: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpecpipeError(f"unknown method {self.method!r}: choose one of {', '.join(METHODS)}")
        if not self.budget_minutes > 0:
            raise SpecpipeError(f"--budget must be a positive number of minutes, got {self.budget_minutes}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise SpecpipeError(f"--max-steps must be positive, got {self.max_steps}")
        if self.unroll < 1:
            raise SpecpipeError(f"unroll must be at least 1 (one EAGLE step), got {self.unroll}")

    @classmethod
    def defaults_for(cls, method: str, **overrides: Any) -> "TrainConfig":
        """Per-method defaults (EAGLE and the draft model use windows, Medusa single positions)."""
        base: dict[str, Any] = {"method": method}
        if method == "eagle":
            base.update(batch=16, window=64, lr=1e-3, unroll=3)
        elif method == "draft-model":
            base.update(batch=8, window=128, lr=2e-4)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass
class TrainResult:
    """What a run produced: tensors for the compact file, metrics and the facts for the recipe."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    metrics: dict[str, Any]
    steps: int
    train_seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


def _lr_at(step: int, total: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _step_generator(seed: int, step: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    return g


class _PositionSampler:
    """Draws positions ``i`` with ``i + span < seq_end[i]`` (so targets up to ``i + span`` exist), with
    self-distilled answer positions weighted ``answer_weight``."""

    def __init__(self, features: Features, span: int, answer_weight: float):
        index = torch.arange(len(features))
        valid = index + span < features.seq_end
        if not bool(valid.any()):
            raise SpecpipeError(
                f"the training data has no sequence longer than {span + 1} tokens: give longer texts or prompts"
            )
        weights = torch.where(features.is_answer, answer_weight, 1.0).double() * valid.double()
        self.cumulative = torch.cumsum(weights, 0)
        self.total = float(self.cumulative[-1])

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        draws = torch.rand(n, generator=generator, dtype=torch.float64) * self.total
        return torch.searchsorted(self.cumulative, draws, right=True).clamp_max(self.cumulative.numel() - 1)


def _vocab_maps(features: Features, vocab_size: int, size: int, end_ids: tuple[int, ...]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(draft vocabulary or None, map target id -> draft index with -100 outside)."""
    if size <= 0 or size >= vocab_size:
        return None, torch.arange(vocab_size)
    labels = features.labels[features.is_answer] if bool(features.is_answer.any()) else features.labels
    vocab = frequent_tokens(torch.cat([labels, features.labels]), vocab_size, size, end_ids)
    inverse = torch.full((vocab_size,), -100, dtype=torch.long)
    inverse[vocab] = torch.arange(vocab.numel())
    return vocab, inverse


# ---------------------------------------------------------------------------------------------------
# Method-specific pieces: a module to train, a loss for one step, an evaluation, and the tensors to save.
# ---------------------------------------------------------------------------------------------------


class _MedusaTask:
    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
        self.cfg, self.features, self.inverse = cfg, features, inverse
        self.module = MedusaHeads(target.config.hidden_size, cfg.num_heads, cfg.num_layers)
        self.lm = ReducedLMHead(target.get_output_embeddings().weight, vocab)
        self.sampler = _PositionSampler(features, cfg.num_heads + 1, cfg.answer_weight)

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        f, k = self.features, self.cfg.num_heads
        pos = self.sampler.sample(self.cfg.batch, generator)
        h = f.hidden[pos].float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = self.lm.logits(self.module(h))  # [k, B, V']
        targets = torch.stack([self.inverse[f.labels[pos + j + 1]] for j in range(k)])
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)

    @torch.no_grad()
    def evaluate(self, held: Features) -> dict[str, Any]:
        k = self.cfg.num_heads
        index = torch.arange(len(held))
        pos = index[held.is_answer & (index + k + 1 < held.seq_end)]
        if pos.numel() == 0:
            pos = index[index + k + 1 < held.seq_end]
        feats = self.module(held.hidden[pos].float())
        top = self.lm.to_target_ids(self.lm.logits(feats).topk(4, dim=-1).indices)  # [k, P, 4]
        truth = torch.stack([held.labels[pos + j + 1] for j in range(k)])  # [k, P]
        top1 = top[..., 0] == truth
        top4 = (top == truth[..., None]).any(-1)
        chain = top1.long().cumprod(0).sum(0).double()
        return {
            "positions": int(pos.numel()),
            "top1": [round(float(x), 4) for x in top1.double().mean(1)],
            "top4": [round(float(x), 4) for x in top4.double().mean(1)],
            "chain_tokens_per_forward": round(1.0 + float(chain.mean()), 4),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict_flat()

    def meta(self) -> dict[str, Any]:
        return {"num_heads": self.cfg.num_heads, "num_layers": self.cfg.num_layers}


def unrolled_attention_mask(window: int, step: int) -> torch.Tensor:
    """Attention of unrolled EAGLE step ``step`` (1-based) over the keys of steps ``1..step``.

    At run time a node at depth d >= 2 attends to the head's stable entries up to its root position t
    (inputs built from the target's own features) and to its own chain of draft entries, one per
    earlier depth. Over a training window of length L that is, for the query at t: step-1 keys at
    positions <= t, and for every later step the key at t only (the "training-time test" of EAGLE-3,
    Li et al. 2025, arXiv:2503.01840, §3.2).

    Returns:
        bool ``[1, 1, L, step * L]`` (True = may attend).
    """
    blocks = [torch.ones(window, window, dtype=torch.bool).tril()]
    blocks += [torch.eye(window, dtype=torch.bool)] * (step - 1)
    return torch.cat(blocks, dim=1)[None, None]


class _EagleTask:
    """EAGLE-1 head trained on ``cfg.unroll`` unrolled steps: step 1 reads the target's features, step
    d >= 2 its own step d-1 predictions (with the run-time attention pattern, see
    :func:`unrolled_attention_mask`), so that deeper drafts are trained on what they see when deployed."""

    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
        self.cfg, self.features, self.inverse = cfg, features, inverse
        self.config = EagleConfig.from_target(target.config)
        self.module = EagleHead(self.config)
        self.module.reset_parameters(generator=torch.Generator().manual_seed(cfg.seed))
        self.embed = target.get_input_embeddings().weight.detach()
        self.lm = ReducedLMHead(target.get_output_embeddings().weight, vocab)
        self.sampler = _PositionSampler(features, cfg.window + cfg.unroll, cfg.answer_weight)
        self.rms = float(features.hidden[: 50_000].float().pow(2).mean().sqrt())

    def _unroll(self, feats: Features, starts: torch.Tensor, steps: int, noise: torch.Generator | None = None):
        """Yield ``(d, predicted features [B, L, H], window index [B, L])`` for d = 1..steps."""
        window = self.cfg.window
        idx = starts[:, None] + torch.arange(window)[None, :]  # [B, L] root positions t
        f_in = feats.hidden[idx].float()
        if noise is not None and self.cfg.noise > 0:
            f_in = f_in + (torch.rand(f_in.shape, generator=noise) * 2 - 1) * (self.cfg.noise * self.rms)
        past_k = past_v = None
        for d in range(1, steps + 1):
            emb = self.embed[feats.tokens[idx + d]]
            mask = unrolled_attention_mask(window, d) if d > 1 else None
            pred, past_k, past_v = self.module(f_in, emb, torch.arange(window) + d - 1, past_k, past_v, mask)
            yield d, pred, idx
            f_in = pred

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        starts = self.sampler.sample(cfg.batch, generator)
        total = torch.zeros(())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for d, pred, idx in self._unroll(self.features, starts, cfg.unroll, noise=generator):
                logits = self.lm.logits(pred)
                reg = F.smooth_l1_loss(pred.float(), self.features.hidden[idx + d].float())
                label = self.inverse[self.features.labels[idx + d]]
                cls = F.cross_entropy(logits.float().flatten(0, 1), label.flatten(), ignore_index=-100)
                total = total + reg + cfg.cls_weight * cls
        return total / cfg.unroll

    @torch.no_grad()
    def evaluate(self, held: Features, depth: int = 3) -> dict[str, Any]:
        """Top-1 of the head at depth 1..depth along the target's greedy text, drafting from its own
        features for depth >= 2 (as at run time), and the implied chain tokens per target forward."""
        window = self.cfg.window
        index = torch.arange(len(held))
        ok = (index + window + depth < held.seq_end) & (index % window == 0)
        starts = index[ok][:200]
        if starts.numel() == 0:
            return {"positions": 0}
        correct = []
        for d, pred, idx in self._unroll(held, starts, depth):
            top1 = self.lm.to_target_ids(self.lm.logits(pred).argmax(-1))
            correct.append(top1 == held.labels[idx + d])
        answer = held.is_answer[idx]
        stack = torch.stack(correct)  # [depth, B, L]
        mask = answer if bool(answer.any()) else torch.ones_like(answer)
        chain = stack.long().cumprod(0).sum(0).double()
        return {
            "positions": int(mask.sum()),
            "top1_by_depth": [round(float(c[mask].double().mean()), 4) for c in correct],
            "chain_tokens_per_forward": round(1.0 + float(chain[mask].mean()), 4),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.module.state_dict())

    def meta(self) -> dict[str, Any]:
        return {"num_layers": 1, **asdict(self.config)}


class _DraftModelTask:
    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
        import copy

        self.cfg, self.features = cfg, features
        total = target.config.num_hidden_layers
        if not 1 <= cfg.draft_layers < total:
            raise SpecpipeError(f"--draft-layers must be between 1 and {total - 1}, got {cfg.draft_layers}")
        draft = copy.deepcopy(target)
        draft.model.layers = draft.model.layers[: cfg.draft_layers]
        draft.config = copy.deepcopy(target.config)
        draft.config.num_hidden_layers = cfg.draft_layers
        if getattr(draft.config, "layer_types", None):
            draft.config.layer_types = draft.config.layer_types[: cfg.draft_layers]
        for p in draft.parameters():
            p.requires_grad_(False)
        for p in [*draft.model.layers.parameters(), *draft.model.norm.parameters()]:
            p.requires_grad_(True)
        self.draft = draft.train()
        self.module = draft
        self.sampler = _PositionSampler(features, cfg.window, cfg.answer_weight)
        # Cross-entropy over the draft vocabulary (the tokens greedy drafting scores at run time):
        # 1/6 of the full lm_head's cost per step, so several times more steps fit the budget.
        self.inverse = inverse if vocab is not None else None
        self.lm = ReducedLMHead(target.get_output_embeddings().weight, vocab) if vocab is not None else None

    def parameters(self):
        return [p for p in self.draft.parameters() if p.requires_grad]

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        starts = self.sampler.sample(cfg.batch, generator)
        idx = starts[:, None] + torch.arange(cfg.window)[None, :]
        labels = self.features.labels[idx]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = self.draft.model(input_ids=self.features.tokens[idx]).last_hidden_state
            if self.lm is not None:
                logits, labels = self.lm.logits(hidden), self.inverse[labels]
            else:
                logits = self.draft.lm_head(hidden)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)

    @torch.no_grad()
    def evaluate(self, held: Features, gamma: int = 4) -> dict[str, Any]:
        self.draft.eval()
        index = torch.arange(len(held))
        ok = (index + self.cfg.window <= held.seq_end) & (index % self.cfg.window == 0)
        starts = index[ok][:100]
        if starts.numel() == 0:
            return {"positions": 0}
        idx = starts[:, None] + torch.arange(self.cfg.window)[None, :]
        hidden = self.draft.model(input_ids=held.tokens[idx]).last_hidden_state
        if self.lm is not None:  # as greedy drafting runs: argmax over the draft vocabulary
            best = self.lm.to_target_ids(self.lm.logits(hidden).argmax(-1))
        else:
            best = self.draft.lm_head(hidden).argmax(-1)
        correct = best == held.labels[idx]
        mask = held.is_answer[idx]
        if not bool(mask.any()):
            mask = torch.ones_like(mask)
        # Chain of gamma draft tokens after position t, teacher-forced on the target's greedy text.
        runs = torch.zeros_like(correct, dtype=torch.long)
        for j in range(gamma):
            shifted = torch.zeros_like(correct)
            shifted[:, : correct.shape[1] - j] = correct[:, j:]
            runs = torch.where(runs == j, runs + shifted.long(), runs)
        self.draft.train()
        return {
            "positions": int(mask.sum()),
            "top1": round(float(correct[mask].double().mean()), 4),
            f"chain_tokens_per_forward_gamma{gamma}": round(1.0 + float(runs[mask].double().mean()), 4),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        names = {n for n, p in self.draft.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.draft.state_dict().items() if k in names}

    def meta(self) -> dict[str, Any]:
        return {"num_layers": self.cfg.draft_layers}


_TASKS = {"medusa": _MedusaTask, "eagle": _EagleTask, "draft-model": _DraftModelTask}


def train(
    target,
    features: Features,
    cfg: TrainConfig,
    out_dir: Path,
    *,
    end_ids: tuple[int, ...] = (),
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
    holdout_fraction: float = 0.05,
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

    Returns:
        :class:`TrainResult` (the checkpoint is removed once the result is complete).

    Raises:
        SpecpipeError: empty data, too-short sequences, bad hyper-parameters.
    """
    if len(features) == 0:
        raise SpecpipeError("the training data is empty: nothing to train on")
    torch.manual_seed(cfg.seed)
    train_set, held = features.split(holdout_fraction, cfg.seed)
    vocab_size = target.config.vocab_size
    vocab, inverse = _vocab_maps(train_set, vocab_size, cfg.draft_vocab_size, end_ids)
    task = _TASKS[cfg.method](target, train_set, cfg, vocab, inverse)
    params = task.parameters() if hasattr(task, "parameters") else list(task.module.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)

    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    cfg_key = json.dumps({**asdict(cfg), "checkpoint_seconds": None, "budget_minutes": None}, sort_keys=True)
    step, total_steps, elapsed, history = 0, cfg.schedule_steps or cfg.max_steps, 0.0, []
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, weights_only=False)
        if state.get("config") == cfg_key:
            task.module.load_state_dict(state["module"])
            optimizer.load_state_dict(state["optimizer"])
            step, total_steps, elapsed, history = state["step"], state["total_steps"], state["elapsed"], state["history"]

    def save_checkpoint() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(
            {"config": cfg_key, "module": task.module.state_dict(), "optimizer": optimizer.state_dict(),
             "step": step, "total_steps": total_steps, "elapsed": elapsed, "history": history},
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
        if time.monotonic() - last_save >= cfg.checkpoint_seconds:
            save_checkpoint()
            last_save = time.monotonic()
    save_checkpoint()

    metrics = task.evaluate(held)
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
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def train_draft(
    target_name: str,
    method: str,
    *,
    data: str | None = None,
    budget_minutes: float = 12.0,
    out_dir: Path | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    schedule_steps: int | None = None,
    num_prompts: int | None = None,
    stdlib_tokens: int | None = None,
    export_trtllm: bool = True,
    command: str = "",
) -> Path:
    """The whole ``specpipe train-draft`` flow: load the target, build (or reuse) the corpus, train,
    evaluate, and write the compact file, ``recipe.json`` and the TensorRT-LLM converter layout.

    Returns:
        the output folder.

    Raises:
        SpecpipeError: unknown target, bad budget/steps, empty data, unwritable output.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specpipe.models.fetch import ensure_target_checkpoint
    from specpipe.paths import cache_dir
    from specpipe.presets import load_target
    from specpipe.progress import console
    from specpipe.training import export
    from specpipe.training.data import CorpusSpec, build_corpus

    cfg = TrainConfig.defaults_for(method, budget_minutes=budget_minutes, max_steps=max_steps, seed=seed, schedule_steps=schedule_steps)
    preset = load_target(target_name)
    out_dir = Path(out_dir) if out_dir else Path("heads") / preset.name / ("draft" if method == "draft-model" else method)
    if data:
        from specpipe.training.data import read_user_data

        read_user_data(Path(data))  # fail on missing, empty or malformed data before writing anything
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecpipeError(f"cannot create output folder {out_dir} ({exc.strerror}): choose another with --out") from exc
    spec = CorpusSpec(seed=seed, user_data=str(Path(data).resolve()) if data else None)
    if num_prompts is not None:
        spec = CorpusSpec(**{**spec.__dict__, "num_prompts": num_prompts})
    if stdlib_tokens is not None:
        spec = CorpusSpec(**{**spec.__dict__, "stdlib_tokens": stdlib_tokens})

    torch.set_num_threads(min(torch.get_num_threads(), 2) or 1)
    model_dir = ensure_target_checkpoint(preset)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)

    started = time.time()
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bars:
        def factory(description: str, total: int):
            task_id = bars.add_task(description, total=total, info="")
            return lambda n: bars.advance(task_id, n)

        features = build_corpus(target, tokenizer, model_dir, spec, cache_dir() / "training" / preset.name, factory)
        train_id = bars.add_task(f"Training {method} ({cfg.budget_minutes:g} min budget)", total=None, info="")

        def on_step(step: int, total: int, info: dict[str, float]) -> None:
            bars.update(train_id, completed=step, total=total, info=f"loss {info['loss']:.3f}")

        end_ids = tuple(i for i in (tokenizer.eos_token_id,) if i is not None)
        result = train(target, features, cfg, out_dir, end_ids=end_ids, progress=on_step)

    meta = {**result.meta, "target": preset.name}
    export.save_compact(out_dir, method, result.tensors, meta)
    if export_trtllm:
        layout = out_dir / "trtllm"
        if method == "eagle":
            export.write_eagle_layout(layout, result.tensors, target)
        elif method == "medusa":
            export.write_medusa_layout(layout, result.tensors, target, cfg.num_heads, cfg.num_layers)
    recipe = {
        "command": command or f"specpipe train-draft --target {preset.name} --method {method} --budget {budget_minutes:g} --seed {seed}",
        "reproduce_exactly": f"add --max-steps {result.steps} --schedule-steps {result.meta['schedule_steps']} (same seed, same corpus)",
        "target": preset.name,
        "method": method,
        "seed": seed,
        "steps": result.steps,
        "train_seconds": result.train_seconds,
        "wall_seconds_total": round(time.time() - started, 1),
        "config": asdict(cfg),
        "data": {
            **spec.__dict__,
            "positions": len(features),
            "answer_positions": int(features.is_answer.sum()),
            "sources": [
                "CPython standard library .py files (Python Software Foundation License), "
                f"{spec.stdlib_tokens} tokens in {spec.chunk_len}-token chunks",
                f"{spec.num_prompts} built-in prompts (specpipe.training.data) in the target's chat template, "
                f"answered by the target (greedy, up to {spec.max_new_tokens} tokens)",
            ] + ([f"user data {spec.user_data}"] if spec.user_data else []),
        },
        "heldout_metrics": result.metrics,
        "loss_history": result.history,
        "environment": environment(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    (out_dir / export.RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    (out_dir / CHECKPOINT_NAME).unlink(missing_ok=True)
    console.print(f"[green]✓[/green] {method} for {preset.name}: {result.steps} steps in {result.train_seconds:.0f} s; "
                  f"held-out {json.dumps(result.metrics)}; wrote {out_dir}")
    return out_dir
