"""Method-specific training pieces: per method a module to train, a loss for one step, an evaluation on
held-out positions, and the tensors to save (see :mod:`specpipe.training.train` for the objectives)."""

from __future__ import annotations

import copy
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead, frequent_tokens
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig, EagleHead
from specpipe.runtime.cpu.drafters.medusa import MedusaHeads
from specpipe.speculative import Method
from specpipe.training.config import TrainConfig
from specpipe.training.features import Features
from specpipe.training.precision import mixed_precision


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


def vocab_maps(
    features: Features, vocab_size: int, size: int, end_ids: tuple[int, ...]
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The draft vocabulary of a run and its inverse map.

    Returns:
        (int64 ``[size]`` target ids, or ``None`` for the full vocabulary; int64 ``[vocab_size]`` map from a
        target id to its draft index, ``-100`` (ignored by cross-entropy) outside the draft vocabulary).
    """
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


class MedusaTask:
    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
        self.cfg, self.features, self.inverse = cfg, features, inverse
        self.module = MedusaHeads(target.config.hidden_size, cfg.num_heads, cfg.num_layers)
        self.lm = ReducedLMHead(target.get_output_embeddings().weight, vocab)
        self.sampler = _PositionSampler(features, cfg.num_heads + 1, cfg.answer_weight)

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        f, k = self.features, self.cfg.num_heads
        pos = self.sampler.sample(self.cfg.batch, generator)
        h = f.hidden[pos].float()
        with mixed_precision():
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


def unroll_head(module, embed: torch.Tensor, tokens: torch.Tensor, inputs: torch.Tensor, idx: torch.Tensor, steps: int):
    """Run an EAGLE head ``steps`` times over a training window, each step fed the previous one's outputs
    (the training-time test, :func:`unrolled_attention_mask`).

    Args:
        module: the head: ``module(inputs, embeddings, positions, past_k, past_v, mask) -> (out, past_k, past_v)``.
        embed: the target's input embeddings, ``[V, H]``.
        tokens: the corpus token ids, int64 ``[N]``.
        inputs: step 1's input features, float32 ``[B, L, F]``.
        idx: corpus position of each root, int64 ``[B, L]``.
        steps: unrolled steps.

    Yields:
        ``(d, out)`` for d = 1..steps, ``out`` the head's outputs ``[B, L, H]`` at step d.
    """
    window = idx.shape[1]
    past_k = past_v = None
    for d in range(1, steps + 1):
        mask = unrolled_attention_mask(window, d) if d > 1 else None
        out, past_k, past_v = module(inputs, embed[tokens[idx + d]], torch.arange(window) + d - 1, past_k, past_v, mask)
        yield d, out
        inputs = out


class EagleTask:
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
        self.rms = float(features.hidden[:50_000].float().pow(2).mean().sqrt())

    def _unroll(self, feats: Features, starts: torch.Tensor, steps: int, noise: torch.Generator | None = None):
        """Yield ``(d, predicted features [B, L, H], window index [B, L])`` for d = 1..steps."""
        window = self.cfg.window
        idx = starts[:, None] + torch.arange(window)[None, :]  # [B, L] root positions t
        f_in = feats.hidden[idx].float()
        if noise is not None and self.cfg.noise > 0:
            f_in = f_in + (torch.rand(f_in.shape, generator=noise) * 2 - 1) * (self.cfg.noise * self.rms)
        for d, pred in unroll_head(self.module, self.embed, feats.tokens, f_in, idx, steps):
            yield d, pred, idx

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        starts = self.sampler.sample(cfg.batch, generator)
        total = torch.zeros(())
        with mixed_precision():
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


class DraftModelTask:
    def __init__(self, target, features: Features, cfg: TrainConfig, vocab, inverse):
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
        with mixed_precision():
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


#: The trainer of every method ``specpipe train-draft`` trains (``MethodSpec.trainable``).
TASKS = {Method.MEDUSA: MedusaTask, Method.EAGLE: EagleTask, Method.DRAFT_MODEL: DraftModelTask}
