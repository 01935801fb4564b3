"""Training an EAGLE-3 head with training-time test (Li et al. 2025, arXiv:2503.01840, §3.2-3.3).

Step 1 of a window reads the target's fused low/mid/top features (``Features.fused``, precomputed once);
step d >= 2 reads the head's own step d-1 outputs, with the attention pattern drafting at depth d has
(:func:`~specpipe.training.tasks.unrolled_attention_mask`). Every step's token loss counts, step d
weighted ``ttt_weight ** (d - 1)`` (the authors' ``ploss_weight``, 0.8 in SafeAILab/EAGLE
``eagle/traineagle3/main.py`` @ bfeb532e); there is no feature-regression loss (EAGLE-3 predicts tokens).
Labels are the target's greedy tokens, over the head's draft vocabulary (outside it: ignored).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.drafters.eagle3 import Eagle3TreeDrafter
from specpipe.runtime.cpu.drafters.eagle3_head import Eagle3Head, capture_layers
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig
from specpipe.training.config import TrainConfig
from specpipe.training.features import Features
from specpipe.training.precision import mixed_precision
from specpipe.training.tasks import _PositionSampler, unroll_head


class Eagle3Task:
    """EAGLE-3 head trained on ``cfg.unroll`` training-time-test steps per window.

    Raises:
        SpecpipeError: features without the captured layers, or a target too shallow for EAGLE-3.
    """

    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
        layers = capture_layers(target.config.num_hidden_layers)
        if features.fused is None or features.layers != layers:
            raise SpecpipeError(
                f"EAGLE-3 training needs the target's layers {layers} in the features "
                f"(have {features.layers}): build the corpus with capture_layers={layers}"
            )
        self.cfg, self.features, self.inverse = cfg, features, inverse
        self.config = EagleConfig.from_target(target.config)
        vocab = vocab if vocab is not None else torch.arange(target.config.vocab_size)
        self.module = Eagle3Head(self.config, layers, vocab)
        self.module.reset_parameters(
            target.get_output_embeddings().weight, generator=torch.Generator().manual_seed(cfg.seed)
        )
        self.embed = target.get_input_embeddings().weight.detach()
        self.target = target
        self.sampler = _PositionSampler(features, cfg.window + cfg.unroll, cfg.answer_weight)

    def _unroll(self, feats: Features, starts: torch.Tensor, steps: int):
        """Yield ``(d, head outputs [B, L, H], root positions [B, L])`` for d = 1..steps."""
        window = self.cfg.window
        idx = starts[:, None] + torch.arange(window)[None, :]
        f_in = feats.fused[idx].float()
        for d, out in unroll_head(self.module, self.embed, feats.tokens, f_in, idx, steps):
            yield d, out, idx

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        starts = self.sampler.sample(cfg.batch, generator)
        total, weights = torch.zeros(()), 0.0
        with mixed_precision():
            for d, out, idx in self._unroll(self.features, starts, cfg.unroll):
                label = self.inverse[self.features.labels[idx + d]]
                logits = self.module.logits(out)
                w = cfg.ttt_weight ** (d - 1)
                total = total + w * F.cross_entropy(logits.float().flatten(0, 1), label.flatten(), ignore_index=-100)
                weights += w
        return total / weights

    @torch.no_grad()
    def evaluate(self, held: Features, depth: int = 3) -> dict[str, Any]:
        """Top-1 of the head at depth 1..depth along the target's greedy text (teacher-forced tokens, the
        head's own features from depth 2), on held-out answer positions."""
        window = self.cfg.window
        index = torch.arange(len(held))
        ok = (index + window + depth < held.seq_end) & (index % window == 0)
        starts = index[ok][:200]
        if starts.numel() == 0:
            return {"positions": 0}
        correct = []
        for d, out, idx in self._unroll(held, starts, depth):
            top1 = self.module.to_target_ids(self.module.logits(out).argmax(-1))
            correct.append(top1 == held.labels[idx + d])
        answer = held.is_answer[idx]
        mask = answer if bool(answer.any()) else torch.ones_like(answer)
        chain = torch.stack(correct).long().cumprod(0).sum(0).double()
        return {
            "positions": int(mask.sum()),
            "top1_by_depth": [round(float(c[mask].double().mean()), 4) for c in correct],
            "chain_tokens_per_forward": round(1.0 + float(chain[mask].mean()), 4),
        }

    def drafter(self, tree) -> Eagle3TreeDrafter:
        """The run-time drafter over the head being trained (for held-out acceptance)."""
        return Eagle3TreeDrafter(self.module, self.embed, tree)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.module.state_dict(), "draft_vocab": self.module.draft_vocab}

    def meta(self) -> dict[str, Any]:
        return {
            "num_layers": 1,
            "style": "eagle3",
            "capture_layers": list(self.module.layers),
            "draft_vocab_size": int(self.module.draft_vocab.numel()),
            **asdict(self.config),
        }
