"""Logits processing, token choice, and the speculative acceptance rule.

Processing order (applied identically to target and draft logits): bad-word mask, temperature,
top-k, top-p, softmax.

The acceptance rule is speculative sampling as given in Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding" (Algorithm 1), and Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling" (Algorithm 2): it commits tokens distributed exactly as
sampling from the target alone would.
"""

from __future__ import annotations

import torch

from specpipe.generation.api import SamplingParams

NEG_INF = float("-inf")


def is_greedy(params: SamplingParams) -> bool:
    """Whether a request decodes by argmax: ``greedy`` set, or ``top_k == 1`` (as in TensorRT-LLM)."""
    return params.greedy or params.top_k == 1


def single_token_bad_words(params: SamplingParams) -> tuple[int, ...]:
    """Token ids of the single-token bad words (longer bad-word sequences are not enforced)."""
    return tuple(sorted({words[0] for words in params.bad_words if len(words) == 1}))


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


class TokenSampler:
    """One request's token choice: logits processing, sampling with the request's own generator, and
    verification of draft tokens.

    Args:
        params: the request's sampling settings (validated by the caller).
        generator: the request's random generator (unused when greedy).
    """

    def __init__(self, params: SamplingParams, generator: torch.Generator):
        self.greedy = is_greedy(params)
        self.temperature = params.temperature
        self.top_k = params.top_k
        self.top_p = params.top_p
        self.generator = generator
        self.banned = torch.tensor(single_token_bad_words(params), dtype=torch.long)

    def distributions(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed float32 distributions ``[n, vocab]`` (rows sum to 1) of raw logits ``[n, vocab]``."""
        logits = mask_tokens(logits, self.banned) / self.temperature
        logits = top_p_filter(top_k_filter(logits, self.top_k), self.top_p)
        return logits.softmax(dim=-1)

    def choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """Pick the next token from one row of logits ``[1, vocab]``.

        Returns:
            the token id and, when sampling, the processed distribution it was drawn from
            (float32 ``[1, vocab]``); ``None`` when greedy.
        """
        if self.greedy:
            return int(mask_tokens(logits, self.banned).argmax(dim=-1)[0]), None
        probs = self.distributions(logits)
        return int(torch.multinomial(probs, 1, generator=self.generator)[0, 0]), probs

    def verify(
        self, target_logits: torch.Tensor, draft_tokens: list[int], draft_probs: torch.Tensor | None
    ) -> tuple[int, int]:
        """Decide how many draft tokens to accept and which token the target adds after them.

        Args:
            target_logits: float32 ``[K + 1, vocab]``; row i scores the token after draft token i
                (row 0: after the last committed token).
            draft_tokens: the K draft tokens.
            draft_probs: float32 ``[K, vocab]`` processed draft distributions, or ``None`` for a
                deterministic drafter (q one-hot on each draft token).

        Returns:
            ``(n, token)``: the first n draft tokens are accepted, then ``token`` is committed.
        """
        drafts = torch.tensor(draft_tokens, dtype=torch.long)
        if self.greedy:
            return greedy_verify(mask_tokens(target_logits, self.banned), drafts)
        return speculative_sample(self.distributions(target_logits), drafts, draft_probs, self.generator)


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: accept draft tokens while each equals the target's argmax.

    Args:
        target_logits: float32 ``[K + 1, vocab]`` (bad words already masked).
        draft_tokens: int64 ``[K]``.

    Returns:
        ``(n, token)``: n accepted draft tokens, and the target's argmax after them.
    """
    best = target_logits.argmax(dim=-1)
    matches = (best[: draft_tokens.numel()] == draft_tokens).to(torch.int64)
    accepted = int(matches.cumprod(dim=0).sum())
    return accepted, int(best[accepted])


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))``, the distribution sampled after a rejection (Leviathan et al. 2023, §2.3).

    Args:
        target_probs: p, float32 ``[vocab]``.
        draft_probs: q, float32 ``[vocab]``.

    Returns:
        float32 ``[vocab]`` summing to 1. Falls back to p when ``p <= q`` everywhere, which only rounding
        can produce (a rejection has probability 0 when p equals q).
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)
    mass = residual.sum()
    if mass <= 0:
        return target_probs
    return residual / mass


def speculative_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

    Draft token x_i is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``, in order; at the first
    rejection the replacement is drawn from ``norm(max(p_i - q_i, 0))``; when all K are accepted a bonus
    token is drawn from ``p_K``. The committed tokens are then distributed as samples from p.

    Args:
        target_probs: p, float32 ``[K + 1, vocab]`` processed target distributions.
        draft_tokens: int64 ``[K]``, drawn from q.
        draft_probs: q, float32 ``[K, vocab]``; ``None`` means one-hot on each draft token (a
            deterministic drafter such as n-gram lookup).
        generator: random source; K uniforms then one categorical draw are taken from it.

    Returns:
        ``(n, token)``: n accepted draft tokens, then the committed replacement or bonus token.
    """
    num_drafts = draft_tokens.numel()
    accepted = num_drafts
    if num_drafts:
        rows = torch.arange(num_drafts)
        p_of_draft = target_probs[rows, draft_tokens]
        q_of_draft = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones(num_drafts)
        uniforms = torch.rand(num_drafts, generator=generator)
        # u < p/q, written without the division.
        rejected = (uniforms * q_of_draft >= p_of_draft).nonzero()
        if rejected.numel():
            accepted = int(rejected[0, 0])
    if accepted == num_drafts:
        next_distribution = target_probs[num_drafts]
    else:
        if draft_probs is not None:
            q = draft_probs[accepted]
        else:
            q = torch.zeros_like(target_probs[accepted])
            q[draft_tokens[accepted]] = 1.0
        next_distribution = residual_distribution(target_probs[accepted], q)
    token = int(torch.multinomial(next_distribution, 1, generator=generator)[0])
    return accepted, token
