"""Draft-target speculation with a reduced draft vocabulary (FR-Spec, Zhao et al. 2025, arXiv:2502.14856).

On 2 CPU cores the 49152 x 576 lm_head of SmolLM2 costs ~10 ms per call, more than four decoder layers
of a distilled draft. Greedy drafting only needs the argmax, so the draft scores only its most frequent
tokens (8192 rows: ~1/6 of the cost) and maps the winner back to a target id. The target still verifies
over its full vocabulary, so the output is unchanged (a draft token outside the list is simply never
proposed). Sampled requests use the full draft distribution, as speculative sampling needs q over the
whole vocabulary.
"""

from __future__ import annotations

import torch

from specpipe.runtime.cpu.drafters.drafters import Draft, DraftModelDrafter
from specpipe.runtime.cpu.verify.sampling import TokenSampler


class ReducedVocabDraftModelDrafter(DraftModelDrafter):
    """:class:`~specpipe.runtime.cpu.drafters.drafters.DraftModelDrafter` whose greedy proposals score only
    ``draft_vocab`` (int64 target ids).

    Args:
        draft_model: a ``LlamaForCausalLM``-style draft with the target's vocabulary, eval mode.
        draft_vocab: int64 ``[V']`` token ids the greedy draft may propose.
    """

    def __init__(self, draft_model, draft_vocab: torch.Tensor):
        super().__init__(draft_model)
        self.draft_vocab = draft_vocab.to(torch.long).clone()  # not a view of the heads file's memory map
        weight = draft_model.lm_head.weight.detach()
        self._weight = weight[self.draft_vocab].to(weight.dtype).contiguous()  # the draft's dtype (fp32 or bf16)

    @torch.inference_mode()
    def propose_chain(self, context_ids: list[int], k: int, sampler: TokenSampler) -> Draft:
        if not sampler.greedy:
            return super().propose_chain(context_ids, k, sampler)
        self._keep_common_prefix(context_ids)
        unseen = context_ids[len(self._cached_ids) :]
        tokens: list[int] = []
        for _ in range(k):
            hidden = self.lm.hidden(unseen)[-1]
            self._cached_ids.extend(unseen)
            token = int(self.draft_vocab[int((self._weight @ hidden).argmax())])
            tokens.append(token)
            unseen = [token]
        return Draft(tokens)
