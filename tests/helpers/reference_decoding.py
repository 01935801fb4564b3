"""Plain autoregressive decoding without KV cache: the ground truth the speculative engine must match."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


@torch.inference_mode()
def next_token_logits(model: PreTrainedModel, token_ids: list[int]) -> torch.Tensor:
    """float32 logits ``[vocab]`` for the token after ``token_ids``, from a full forward pass (no cache)."""
    return model(torch.tensor([token_ids], dtype=torch.long)).logits[0, -1].float()


def greedy_reference(
    model: PreTrainedModel,
    prompt_ids: list[int],
    max_tokens: int,
    banned_ids: tuple[int, ...] = (),
    bad_words: tuple[tuple[int, ...], ...] = (),
) -> list[int]:
    """Greedy decoding, recomputing the whole sequence each token (O(n²), for tests and checks).

    Args:
        model: causal LM.
        prompt_ids: prompt token ids.
        max_tokens: tokens to generate (no end id is honoured).
        banned_ids: token ids never chosen.
        bad_words: token-id sequences never completed: a sequence's last token is not chosen where the
            sequence so far (prompt included) ends with its other tokens.

    Returns:
        the ``max_tokens`` generated token ids.
    """
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        logits = next_token_logits(model, ids)
        if banned_ids:
            logits = logits.index_fill(0, torch.tensor(banned_ids), float("-inf"))
        for words in bad_words:
            if len(ids) >= len(words) - 1 and ids[len(ids) - len(words) + 1 :] == list(words[:-1]):
                logits = logits.index_fill(0, torch.tensor([words[-1]]), float("-inf"))
        ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]
