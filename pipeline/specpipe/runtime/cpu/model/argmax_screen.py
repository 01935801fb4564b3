"""Greedy logits for half the lm_head's memory traffic: a bf16 screen, then exact scores for the few
tokens that can still be the argmax.

At batch 1 the fp32 ``lm_head`` streams ``vocab x hidden x 4`` bytes a step (113 MB for SmolLM2, a fifth
of what the decoder reads) only for greedy decoding to take its argmax. :class:`ArgmaxScreen` scores
every token with a bf16 copy of the weight instead (half the bytes; oneDNN's bf16 kernels, AVX-512 BF16
or AMX), bounds each score's error, keeps the tokens whose score could be the largest, and scores those
exactly (float64 dot products of the fp32 weight rows and hidden state). The argmax over the result is
the argmax over exact scores, whatever the screen's rounding, and it does not depend on which other rows
share the call.

The error bound, for one token with fp32 weight row ``w`` and hidden state ``x`` (``n`` = hidden size,
``u = 2**-8`` the unit roundoff of bf16's 8-bit significand, ``g = n * 2**-24`` fp32 accumulation): the
kernel multiplies ``bf16(w_i) * bf16(x_i)`` (each factor within a relative ``u``) and sums in fp32, then
rounds the sum to bf16, so

    |screen - w.x| <= ((2u + u^2) + g (1 + u)^2) * sum_i |w_i| |x_i|  +  u / (1 - u) * |screen|

(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sections 2.2 and 3.1), with
``sum_i |w_i||x_i| <= ||w||_2 ||x||_2`` (Cauchy-Schwarz). One bound serves a whole row: it takes the
largest ``||w||_2`` of the vocabulary (computed once) and the row's largest ``|screen|``, which costs two
passes over the screen instead of six for a bound per token. The relative terms assume no underflow: the
kernel may flush subnormal inputs, products and outputs to zero (below ``2**-126``), so the bound adds
``2**-126 * (sqrt(n) ||w||_2 + n + 1)`` for them, and ``||x||_2`` is computed in float64 (in float32 the
squares of a row below about 1e-19 underflow to a zero norm). A token whose screen is more than twice
the bound below the row's best screen cannot be the argmax; on SmolLM2's chat answers the median row
keeps 13 of its 49,152 tokens.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specpipe.runtime.cpu.model.prepack import PrepackedLinear, bf16_prepack_available

_BF16_ROUNDOFF = 2.0**-8
_FP32_ROUNDOFF = 2.0**-24
_SMALLEST_NORMAL = 2.0**-126
#: Margin on the bound for the arithmetic that computes it and its rounding to float32.
_SLACK = 1.01
#: Most tokens a row may keep: past it the row is left to the full lm_head (rescoring a few hundred
#: tokens in float64 costs about what one row of the fp32 lm_head does; inputs like a repeated token
#: keep hundreds).
MAX_CANDIDATES = 256
#: Most rows worth screening in one call: the screen passes over ``rows x vocab`` scores several times,
#: so its lead over the fp32 lm_head shrinks with the rows; beyond this many the full lm_head is used.
MAX_SCREENED_ROWS = 16


class ArgmaxScreen:
    """Logits that keep only the tokens that can be the argmax of ``hidden @ weight.T`` (module doc).

    Args:
        weight: the fp32 lm_head weight ``[vocab, hidden]``, held by reference (for a tied lm_head the
            input embedding, which stays dense), plus a bf16 copy (``vocab x hidden x 2`` bytes).

    Raises:
        ValueError: ``weight`` is not a 2-D float32 tensor.
    """

    def __init__(self, weight: torch.Tensor):
        if weight.dim() != 2 or weight.dtype != torch.float32:
            raise ValueError(
                f"ArgmaxScreen needs a float32 [vocab, hidden] weight, got {weight.dtype} {tuple(weight.shape)}"
            )
        self.weight = weight.detach()
        self.screen = PrepackedLinear.from_weight(self.weight.to(torch.bfloat16))
        self.largest_row_norm = float(self.weight.double().norm(dim=1).max())
        u, n = _BF16_ROUNDOFF, self.weight.shape[1]
        self._product_error = _SLACK * (2 * u + u * u + n * _FP32_ROUNDOFF * (1 + u) ** 2)
        self._output_error = _SLACK * u / (1 - u)
        self._underflow_error = _SLACK * _SMALLEST_NORMAL * (n**0.5 * self.largest_row_norm + n + 1)

    @classmethod
    def for_model(cls, model: PreTrainedModel) -> "ArgmaxScreen | None":
        """The screen of a causal LM whose ``lm_head`` is tied to its fp32 input embedding, where this CPU
        runs bf16 linear layers natively (:func:`~specpipe.runtime.cpu.model.prepack.bf16_prepack_available`);
        ``None`` otherwise (an untied lm_head keeps no dense fp32 copy to score candidates with)."""
        embedding = model.get_input_embeddings().weight
        if not (
            bf16_prepack_available()
            and getattr(model.config, "tie_word_embeddings", False)
            and embedding.dtype == torch.float32
        ):
            return None
        return cls(embedding)

    def error_bound(self, hidden: torch.Tensor, screen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's best screen and a bound on ``|screen - hidden @ weight.T|`` for all its tokens, float32
        ``[n, 1]`` each, for hidden states float32 ``[n, hidden]`` and their screen ``[n, vocab]``
        (:attr:`screen`'s bf16 output, or that widened to float32: the same values): the module doc's bound at
        the largest row norm and largest ``|screen|``."""
        screen = screen.float()  # exact; float32 max/min reductions are vectorised, bf16 ones and aminmax are not
        best = screen.amax(dim=1, keepdim=True)
        largest = torch.maximum(best.abs(), screen.amin(dim=1, keepdim=True).abs())
        bound = (
            hidden.double().norm(dim=1, keepdim=True) * (self._product_error * self.largest_row_norm)
            + largest.double() * self._output_error
            + self._underflow_error
        )
        return best, bound.float()  # >= 2**-117: a normal float32, its rounding inside _SLACK

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Screened logits of hidden states float32 ``[n, hidden]``, and which rows the screen left out.

        Returns:
            float32 ``[n, vocab]``: exact logits (float64 dot products, rounded once) at the tokens that
            can be the row's argmax, ``-inf`` elsewhere; its row-wise argmax is the exact argmax (ties to
            the lowest id) and the values serve nothing else. Rows left out are all ``-inf``. The exact
            scores are rounded to float32 once, so tokens within a float32 rounding of each other (a
            relative gap below about 6e-8) tie and the lower id wins, where the full lm_head's float32
            GEMM may order them the other way: in such a near-tie a greedy token can depend on whether
            its row was screened (at most :data:`MAX_SCREENED_ROWS` greedy rows in a call).
            bool ``[n]``: the rows left out (no token kept, which a screen that is not finite gives, or
            more than :data:`MAX_CANDIDATES` kept), for the caller to score with the full lm_head. Both
            depend on the row alone, not on the others.

        A token can be the argmax only if its screen is within twice the bound of the row's best screen
        (its exact logit is at most its screen plus the bound, the best token's at least its screen minus
        it)."""
        hidden = hidden.float().contiguous()
        screen = self.screen(hidden).float()
        best, bound = self.error_bound(hidden, screen)
        rows, tokens = (screen >= best - 2 * bound).nonzero(as_tuple=True)
        if len(hidden) == 1:  # counted without tensor ops: at batch 1 they cost as much as the rest
            left_out = torch.tensor([not 0 < len(rows) <= MAX_CANDIDATES])
        else:
            counts = torch.bincount(rows, minlength=len(hidden))
            left_out = (counts == 0) | (counts > MAX_CANDIDATES)
        if bool(left_out.any()):
            kept = ~left_out[rows]
            rows, tokens = rows[kept], tokens[kept]
        out = screen.fill_(float("-inf"))  # the widened screen's buffer, no longer needed
        out[rows, tokens] = (self.weight[tokens].double() * hidden[rows].double()).sum(dim=1).float()
        return out, left_out
