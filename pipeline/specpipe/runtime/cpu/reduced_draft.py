"""Draft-target speculation with a reduced draft vocabulary (FR-Spec, Zhao et al. 2025, arXiv:2502.14856).

On 2 CPU cores the 49152 x 576 lm_head of SmolLM2 costs ~10 ms per call, more than four decoder layers
of a distilled draft. Greedy drafting only needs the argmax, so the draft scores only its most frequent
tokens (8192 rows: ~1/6 of the cost) and maps the winner back to a target id. The target still verifies
over its full vocabulary, so the output is unchanged (a draft token outside the list is simply never
proposed). Sampled requests use the full draft distribution, as speculative sampling needs q over the
whole vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpipe.runtime.cpu.drafters import Draft, DraftModelDrafter
from specpipe.runtime.cpu.sampling import TokenSampler


class ReducedVocabDraftModelDrafter(DraftModelDrafter):
    """:class:`~specpipe.runtime.cpu.drafters.DraftModelDrafter` whose greedy proposals score only
    ``draft_vocab`` (int64 target ids).

    Args:
        draft_model: a ``LlamaForCausalLM``-style draft with the target's vocabulary, eval mode.
        draft_vocab: int64 ``[V']`` token ids the greedy draft may propose.
    """

    def __init__(self, draft_model, draft_vocab: torch.Tensor):
        super().__init__(draft_model)
        self.draft_vocab = draft_vocab.to(torch.long)
        self._weight = draft_model.lm_head.weight.detach()[self.draft_vocab].float().contiguous()

    @torch.inference_mode()
    def _last_hidden(self, token_ids: list[int]) -> torch.Tensor:
        lm = self.lm
        start = lm.length
        positions = torch.arange(start, start + len(token_ids), dtype=torch.long)[None]
        out = lm.model.model(
            input_ids=torch.tensor([token_ids], dtype=torch.long), position_ids=positions, use_cache=True,
            **{lm._cache_argument: lm.cache},
        )
        return out.last_hidden_state[0, -1]

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        if not sampler.greedy:
            return super().propose(context_ids, k, sampler)
        self._keep_common_prefix(context_ids)
        unseen = context_ids[len(self._cached_ids) :]
        tokens: list[int] = []
        for _ in range(k):
            hidden = self._last_hidden(unseen)
            self._cached_ids.extend(unseen)
            token = int(self.draft_vocab[int((self._weight @ hidden).argmax())])
            tokens.append(token)
            unseen = [token]
        return Draft(tokens)


def load_draft_vocab(draft_dir: Path) -> torch.Tensor | None:
    """The frequent-token list beside a distilled draft checkpoint, or ``None``."""
    from specpipe.training.export import DRAFT_VOCAB_FILE

    path = Path(draft_dir) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))["draft_vocab"]
