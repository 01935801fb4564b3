"""The target's view of a training corpus (:class:`Features`): per position its token, final hidden state
and greedy next token, flattened over sequences, and :func:`extract_features`, which runs the frozen target
to collect them (for the corpora of :mod:`specpipe.training.data`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Features:
    """The target's view of a corpus, flattened over sequences.

    Attributes:
        tokens: int64 ``[N]`` token ids of all sequences, concatenated.
        hidden: float16 ``[N, hidden]`` the target's final hidden state (after the final RMSNorm, the
            input of ``lm_head``) at each position.
        labels: int64 ``[N]`` the target's greedy next token at each position (argmax of its logits).
        seq_end: int64 ``[N]`` index one past the last position of the position's sequence.
        is_answer: bool ``[N]`` the position belongs to a self-distilled answer (not prompt or text).
        fused: float16 ``[N, k * hidden]`` the outputs of the target's decoder layers ``layers`` at each
            position, concatenated (EAGLE-3's input), or ``None``.
        layers: the captured decoder layers (``()`` without ``fused``).
    """

    tokens: torch.Tensor
    hidden: torch.Tensor
    labels: torch.Tensor
    seq_end: torch.Tensor
    is_answer: torch.Tensor
    fused: torch.Tensor | None = None
    layers: tuple[int, ...] = ()

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(self.__dict__, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Features":
        state = torch.load(path, weights_only=True)
        return cls(**{**state, "layers": tuple(state.get("layers", ()))})

    def split(self, holdout_fraction: float, seed: int) -> tuple["Features", "Features"]:
        """Split by whole sequences: (train, held-out)."""
        ends = torch.unique(self.seq_end).tolist()
        starts = [0, *ends[:-1]]
        spans = list(zip(starts, ends))
        random.Random(seed).shuffle(spans)
        n_hold = max(1, int(len(spans) * holdout_fraction))
        return self._subset(spans[n_hold:]), self._subset(spans[:n_hold])

    def _subset(self, spans: list[tuple[int, int]]) -> "Features":
        spans = sorted(spans)
        index = torch.cat([torch.arange(a, b) for a, b in spans])
        lengths = torch.tensor([b - a for a, b in spans])
        ends = torch.cumsum(lengths, 0)
        seq_end = torch.repeat_interleave(ends, lengths)
        fused = None if self.fused is None else self.fused[index]
        return Features(
            self.tokens[index],
            self.hidden[index],
            self.labels[index],
            seq_end,
            self.is_answer[index],
            fused,
            self.layers,
        )


@torch.inference_mode()
def extract_features(
    model,
    sequences: list[tuple[list[int], int]],
    batch_tokens: int = 2048,
    progress=None,
    capture_layers: tuple[int, ...] = (),
) -> Features:
    """Run the frozen target over ``sequences`` and collect hidden states and greedy labels.

    Args:
        model: the target ``LlamaForCausalLM`` (fp32, eval).
        sequences: ``(token_ids, answer_start)`` pairs; positions ``>= answer_start`` are answers
            (``answer_start = len(ids)`` for plain text).
        batch_tokens: at most this many tokens per forward, padding included (sequences of similar
            length are batched, right-padded: under causal attention a position never sees the
            padding after it, so its features are its own sequence's).
        capture_layers: decoder layers whose outputs also go into :attr:`Features.fused` (same forward).

    Returns:
        :class:`Features` over all sequences in the given order.
    """
    tokens, hidden, labels, ends, answers = [], [], [], [], []
    total = 0
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    results: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
    i = 0
    while i < len(order):
        group = [order[i]]  # ascending lengths: the last sequence of a group is its longest
        while (
            i + len(group) < len(order) and (len(group) + 1) * len(sequences[order[i + len(group)]][0]) <= batch_tokens
        ):
            group.append(order[i + len(group)])
        lengths = [len(sequences[j][0]) for j in group]
        ids = torch.zeros(len(group), lengths[-1], dtype=torch.long)  # right padding: causal attention hides it
        for row, j in enumerate(group):
            ids[row, : lengths[row]] = torch.tensor(sequences[j][0], dtype=torch.long)
        out = model.model(input_ids=ids, output_hidden_states=bool(capture_layers))
        h = out.last_hidden_state
        best = model.lm_head(h).argmax(-1)
        fused = torch.cat([out.hidden_states[k + 1] for k in capture_layers], -1) if capture_layers else None
        for row, (j, n) in enumerate(zip(group, lengths)):
            results[j] = (
                h[row, :n].to(torch.float16),
                best[row, :n],
                None if fused is None else fused[row, :n].to(torch.float16),
            )
        i += len(group)
        if progress:
            progress(sum(lengths))
    fused_rows = []
    for j, (ids, answer_start) in enumerate(sequences):
        h, best, fused = results[j]
        fused_rows.append(fused)
        n = len(ids)
        tokens.append(torch.tensor(ids, dtype=torch.long))
        hidden.append(h)
        labels.append(best.long())
        total += n
        ends.append(torch.full((n,), total, dtype=torch.long))
        answers.append(torch.arange(n) >= answer_start)
    return Features(
        torch.cat(tokens),
        torch.cat(hidden),
        torch.cat(labels),
        torch.cat(ends),
        torch.cat(answers),
        torch.cat(fused_rows) if capture_layers else None,
        tuple(capture_layers),
    )
