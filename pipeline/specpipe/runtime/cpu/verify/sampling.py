"""Logits processing and token choice.

Processing order (applied identically to target and draft logits): bad-word mask (a multi-token bad
word bans its last token wherever the tokens before the row end with the rest of it, TensorRT-LLM's
``banBadWords``), temperature,
penalties (repetition, presence, frequency; then the ``min_tokens`` end-id mask), top-k, top-p,
softmax. Greedy requests skip the temperature and the filters. Penalties need the token history of
each scored position: the sampler holds the request's live context (prompt + committed output), and
every scored row adds the draft tokens before it (``paths``), so a verification step penalises each
position exactly as plain decoding of the same tokens would, which keeps speculative output identical
to the baseline's under greedy and the committed tokens distributed as the penalised target.
Which drafts a step accepts is :mod:`~specpipe.runtime.cpu.verify.accept`'s to decide.
"""

from __future__ import annotations

import torch

from specpipe.generation.api import SamplingParams

NEG_INF = float("-inf")


def is_greedy(params: SamplingParams) -> bool:
    """Whether a request decodes by argmax: ``greedy`` set, or ``top_k == 1`` (as in TensorRT-LLM)."""
    return params.greedy or params.top_k == 1


def single_token_bad_words(params: SamplingParams) -> tuple[int, ...]:
    """Token ids of the single-token bad words (masked everywhere)."""
    return tuple(sorted({words[0] for words in params.bad_words if len(words) == 1}))


def multi_token_bad_words(params: SamplingParams) -> tuple[tuple[int, ...], ...]:
    """The bad words of two tokens or more: each bans its last token after the rest of it."""
    return tuple(tuple(words) for words in params.bad_words if len(words) > 1)


def mask_tokens(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Copy of ``logits`` (``[n, vocab]``) with the columns ``token_ids`` (int64 ``[m]``) set to -inf."""
    if token_ids.numel() == 0:
        return logits
    return logits.index_fill(-1, token_ids, NEG_INF)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep, in each row of ``logits`` (``[n, vocab]``), the tokens scoring at least the k-th largest
    logit (ties at the threshold are kept); set the others to -inf. ``k <= 0`` or ``k >= vocab``:
    unchanged."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"): keep, in
    each row of ``logits`` (``[n, vocab]``), the smallest set of most likely tokens whose probability
    sums to at least ``p``; set the others to -inf. The most likely token is always kept; among equal
    logits, the cut follows the sort order. ``p >= 1``: unchanged."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """TensorRT-LLM's penalties (``batchApplyPenalty``, ``cpp/tensorrt_llm/kernels/penaltyKernels.cu``).

    Args:
        logits: float32 ``[n, vocab]`` (temperature already applied when sampling).
        counts: int64 ``[n, vocab]``: occurrences of each token in the history of each row.
        params: ``repetition_penalty`` (positive logits divided, negative multiplied),
            ``presence_penalty`` (subtracted once), ``frequency_penalty`` (subtracted per occurrence);
            each applies only to tokens with ``counts > 0``.

    Returns:
        the penalised logits (a new tensor).
    """
    seen = counts > 0
    out = logits
    if params.repetition_penalty != 1.0:
        scaled = torch.where(out < 0, out * params.repetition_penalty, out / params.repetition_penalty)
        out = torch.where(seen, scaled, out)
    if params.presence_penalty != 0.0:
        out = out - seen.to(out.dtype) * params.presence_penalty
    if params.frequency_penalty != 0.0:
        out = out - counts.to(out.dtype) * params.frequency_penalty
    return out


class TokenSampler:
    """One request's token choice: logits processing, sampling with the request's own generator, and
    verification of draft tokens.

    Args:
        params: the request's sampling settings (validated by the caller).
        generator: the request's random generator (unused when greedy).
        history: the request's committed tokens (prompt + output), a list the engine extends in place;
            needed for the penalties and ``min_tokens`` (``None``: treated as empty). Its length when
            the sampler is made is the prompt length.
        end_ids: the end ids ``min_tokens`` masks (default: ``params.end_id`` when set).
    """

    def __init__(
        self,
        params: SamplingParams,
        generator: torch.Generator,
        history: list[int] | None = None,
        end_ids: frozenset[int] | None = None,
    ):
        self.params = params
        self.greedy = is_greedy(params)
        self.temperature = params.temperature
        self.top_k = params.top_k
        self.top_p = params.top_p
        self.generator = generator
        self.banned = torch.tensor(single_token_bad_words(params), dtype=torch.long)
        self.bad_sequences = multi_token_bad_words(params)
        self.history = history if history is not None else []
        self.prompt_len = len(self.history)
        if end_ids is None:
            end_ids = params.end_ids(frozenset())
        self.end_ids = torch.tensor(sorted(end_ids), dtype=torch.long)

    @property
    def argmax_only(self) -> bool:
        """Whether the choice is the argmax of the raw logits: greedy, with no bad words, penalties or
        ``min_tokens`` (such a request's logits may be screened,
        :class:`~specpipe.runtime.cpu.model.argmax_screen.ArgmaxScreen`)."""
        return (
            self.greedy
            and not self.banned.numel()
            and not self.bad_sequences
            and not self.params.penalised
            and self.params.min_tokens <= 0
        )

    def _bad_words(self, logits: torch.Tensor, paths: list[list[int]] | None) -> torch.Tensor:
        """Bad words masked: single tokens everywhere; a longer word's last token in each row whose
        history (``history + paths[i]``, prompt included) ends with the word's other tokens."""
        logits = mask_tokens(logits, self.banned)
        if not self.bad_sequences:
            return logits
        paths = paths if paths is not None else [[] for _ in range(logits.shape[0])]
        longest = max(len(words) for words in self.bad_sequences) - 1
        recent = self.history[-longest:]
        rows, columns = [], []
        for row, path in enumerate(paths):
            tail = (recent + list(path))[-longest:]
            for words in self.bad_sequences:
                before = len(words) - 1
                if len(tail) >= before and tail[len(tail) - before :] == list(words[:-1]):
                    rows.append(row)
                    columns.append(words[-1])
        if rows:
            logits = logits.clone()
            logits[torch.tensor(rows), torch.tensor(columns)] = NEG_INF
        return logits

    def _history_rules(self, logits: torch.Tensor, paths: list[list[int]] | None) -> torch.Tensor:
        """Penalties and the ``min_tokens`` mask; row i's history is ``history + paths[i]``
        (``paths=None``: row i follows the first i tokens of nothing, i.e. every row after ``history``)."""
        params = self.params
        if not params.penalised and params.min_tokens <= 0:
            return logits
        rows = logits.shape[0]
        paths = paths if paths is not None else [[] for _ in range(rows)]
        if params.penalised:
            vocab = logits.shape[-1]
            history = torch.tensor([t for t in self.history if 0 <= t < vocab], dtype=torch.long)
            base = torch.bincount(history, minlength=vocab)[:vocab]
            counts = base.unsqueeze(0).repeat(rows, 1)
            for row, path in enumerate(paths):
                for token in path:
                    counts[row, token] += 1
            logits = apply_penalties(logits, counts, params)
        if params.min_tokens > 0 and self.end_ids.numel():
            produced = len(self.history) - self.prompt_len
            short = [row for row, path in enumerate(paths) if produced + len(path) < params.min_tokens]
            if short:
                logits = logits.clone()
                logits[torch.tensor(short)[:, None], self.end_ids[None, :]] = NEG_INF
        return logits

    def greedy_logits(self, logits: torch.Tensor, paths: list[list[int]] | None = None) -> torch.Tensor:
        """Logits ``[n, vocab]`` whose argmax is the greedy choice: bad words masked, penalties and
        ``min_tokens`` applied (``paths`` as in :meth:`distributions`)."""
        return self._history_rules(self._bad_words(logits, paths), paths)

    def distributions(self, logits: torch.Tensor, paths: list[list[int]] | None = None) -> torch.Tensor:
        """Processed float32 distributions ``[n, vocab]`` (rows sum to 1) of raw logits ``[n, vocab]``.

        ``paths[i]``: the tokens between the committed history and row i (draft tokens before it);
        ``None``: every row directly follows the history.
        """
        logits = self._bad_words(logits, paths) / self.temperature
        logits = self._history_rules(logits, paths)
        logits = top_p_filter(top_k_filter(logits, self.top_k), self.top_p)
        return logits.softmax(dim=-1)

    def choose(self, logits: torch.Tensor, path: list[int] | tuple[int, ...] = ()) -> tuple[int, torch.Tensor | None]:
        """Pick the next token from one row of logits ``[1, vocab]`` that follows ``history + path``.

        Returns:
            the token id and, when sampling, the processed distribution it was drawn from
            (float32 ``[1, vocab]``); ``None`` when greedy.
        """
        paths = [list(path)]
        if self.greedy:
            return int(self.greedy_logits(logits, paths).argmax(dim=-1)[0]), None
        probs = self.distributions(logits, paths)
        return int(torch.multinomial(probs, 1, generator=self.generator)[0, 0]), probs
