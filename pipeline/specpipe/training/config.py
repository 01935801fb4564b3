"""Hyper-parameters of ``specpipe train-draft`` and what a run produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specpipe.errors import SpecpipeError
from specpipe.speculative import METHODS, Method, entry_for

#: Methods ``specpipe train-draft`` trains, from the registry (``MethodSpec.trainable``).
TRAINABLE = tuple(method.value for method, spec in METHODS.items() if spec.trainable)
CHECKPOINT_NAME = ".train-checkpoint.pt"
#: EAGLE head styles ``--style`` trains (the registry's EAGLE flavours).
EAGLE_STYLES = METHODS[Method.EAGLE].flavours
#: Methods whose ``--style`` picks the head's layout (:data:`STYLE_DEFAULTS`).
STYLED = frozenset({Method.EAGLE})
#: Each trainable method's hyper-parameters where they differ from :class:`TrainConfig`'s (Medusa's): EAGLE
#: and the draft model learn from windows of consecutive tokens, Medusa from single positions.
TRAINING_DEFAULTS: dict[Method, dict[str, Any]] = {
    Method.EAGLE: {"batch": 16, "window": 64, "lr": 1e-3, "unroll": 3},
    Method.MEDUSA: {},
    Method.DRAFT_MODEL: {"batch": 8, "window": 128, "lr": 2e-4},
}
#: What each ``--style`` of a styled method changes on top of the method's defaults.
STYLE_DEFAULTS: dict[str, dict[str, Any]] = {"eagle1": {}, "eagle3": {"unroll": 4, "eval_every": 250}}


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
        style: EAGLE head style, ``eagle1`` (EAGLE-1/2 layout) or ``eagle3`` (fused features, own lm_head).
        ttt_weight: EAGLE-3's loss weight of training-time-test step d is ``ttt_weight ** (d - 1)``.
        checkpoint_every: also write the resumable checkpoint every this many steps (``0``: by time only).
        eval_every: measure held-out acceptance (mean accepted length through the drafter) every this many
            steps (``0``: only at the end); the best head is kept.
        patience: stop early after this many evaluations without a better held-out acceptance.
        eval_prompts, eval_tokens: held-out prompts and greedy tokens per prompt of that measurement.
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
    style: str = "eagle1"
    ttt_weight: float = 0.8
    checkpoint_every: int = 0
    eval_every: int = 0
    patience: int = 3
    eval_prompts: int = 8
    eval_tokens: int = 48

    def __post_init__(self) -> None:
        if self.method not in TRAINABLE:
            raise SpecpipeError(f"unknown method {self.method!r}: choose one of {', '.join(TRAINABLE)}")
        if self.style not in EAGLE_STYLES or (self.style != "eagle1" and self.method != "eagle"):
            raise SpecpipeError(
                f"--style {self.style} is not an EAGLE head style for --method {self.method}: use "
                f"--method eagle with --style {' or '.join(EAGLE_STYLES)}"
            )
        if min(self.checkpoint_every, self.eval_every) < 0 or self.patience < 1:
            raise SpecpipeError("--checkpoint-every and --eval-every must be >= 0 and --patience >= 1")
        if not self.budget_minutes > 0:
            raise SpecpipeError(f"--budget must be a positive number of minutes, got {self.budget_minutes}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise SpecpipeError(f"--max-steps must be positive, got {self.max_steps}")
        if self.unroll < 1:
            raise SpecpipeError(f"unroll must be at least 1 (one EAGLE step), got {self.unroll}")

    @classmethod
    def defaults_for(cls, method: str, **overrides: Any) -> "TrainConfig":
        """The method's defaults (:data:`TRAINING_DEFAULTS`, then :data:`STYLE_DEFAULTS` of its ``style``),
        then ``overrides`` (``None`` values ignored).

        Raises:
            SpecpipeError: an untrainable method, a style the method does not take, bad values.
            MethodTableError: a trainable method without an entry in :data:`TRAINING_DEFAULTS`.
        """
        base: dict[str, Any] = {"method": method}
        if method in TRAINABLE:  # others are refused by __post_init__
            base.update(entry_for(TRAINING_DEFAULTS, method, "training.config.TRAINING_DEFAULTS"))
            if Method(method) in STYLED:  # an unknown style is refused by __post_init__
                base.update(STYLE_DEFAULTS.get(overrides.get("style") or cls.style, {}))
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
