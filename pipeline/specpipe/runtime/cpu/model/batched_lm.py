"""A Llama-style target run over many requests' KV caches in one forward pass (in-flight batching).

Why not transformers' own continuous batching: ``transformers.generation.continuous_batching``
(``PagedAttentionCache``, 5.x) builds block-diagonal *causal* masks from cumulative sequence lengths and
has no way to drop cache entries once written, whereas token-tree verification needs an arbitrary
mask per request and both chain and tree speculation need rollback (chain: truncate; tree: compact the
accepted path). So this module keeps a slot-based static cache and runs the decoder layers itself,
with the model's own weights (``embed_tokens``, norms, ``q/k/v/o_proj``, ``mlp``, ``lm_head``: the
prepacked layers of :mod:`~specpipe.runtime.cpu.model.prepack` when the loader prepacked them). Each layer's
kernels are looked up once (:class:`LayerOps`) and called on 2-D rows: at batch 1 the linear layers
stream 540 MB in about 20 ms and everything else is per-call overhead, which module calls, reshapes and
index tensors had made 10 % of a step (:mod:`~specpipe.runtime.cpu.model.layer_ops`).

Layout:

* cache: one float tensor for keys and one for values, ``[layers, slots, kv_heads, capacity, head_dim]``
  (slot = one request; ``capacity`` grows by doubling); :attr:`BatchedLM.lengths` gives each slot's
  cached tokens;
* a forward packs every request's new tokens into one sequence of ``T`` rows, so each linear layer
  is one GEMM ``[T, H] x [H, *]`` for the whole batch (vLLM-style token packing, Kwon et al. 2023);
* attention reads each slot's keys in place ``[slots, kv_heads, L_max, d]`` (a contiguous range of
  slots) with queries padded per slot, ``[slots, heads, n_max, d]``, and a bool mask
  ``[slots, 1, n_max, L_max]`` (causal for a chain or a prompt chunk, the request's own tree mask for
  a tree), grouped-query heads shared (``enable_gqa``); plain-decoding requests share one
  ``scaled_dot_product_attention`` call per layer and multi-token ones a second call, or one each
  where sharing would pad too much (:func:`attention_groups`).

Numerics: fp32 throughout. A request's rows go through GEMMs whose row count depends on the batch, and
through attention over padded keys (masked to exact zeros); the results agree with the one-request
:class:`~specpipe.runtime.cpu.model.cached_lm.CachedLM` path to float32 rounding, and greedy argmaxes were
identical in every test (see ``tests/runtime/cpu/test_batched_scheduler.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specpipe.runtime.cpu.model.argmax_screen import MAX_SCREENED_ROWS, ArgmaxScreen
from specpipe.runtime.cpu.model.attention_groups import AttentionGroup, BatchEntry, attention_groups, exact_key_length
from specpipe.runtime.cpu.model.layer_ops import LayerOps, norm_op
from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear
from specpipe.runtime.cpu.model.weights_memory import trim_heap


class BatchedLM:
    """The target decoder over a slot-based KV cache shared by up to ``max_batch_size`` requests.

    Args:
        model: a ``LlamaForCausalLM``-style model (``model.model.layers[i].self_attn.{q,k,v,o}_proj``,
            ``mlp``, ``input_layernorm``, ``post_attention_layernorm``, ``model.model.norm``,
            ``rotary_emb``, ``embed_tokens``; ``model.lm_head``), fp32, eval.
        max_batch_size: cache slots (requests decoded together), >= 1.
        capacity: initial tokens per slot (grows as needed).
        argmax_screen: score greedy rows through an
            :class:`~specpipe.runtime.cpu.model.argmax_screen.ArgmaxScreen` (a bf16 copy of a tied lm_head,
            ``vocab x hidden x 2`` bytes) where :meth:`ArgmaxScreen.for_model` offers one; never for a
            weight-only quantized lm_head.
        capture_layers: decoder layers whose outputs :meth:`hidden` also returns (as
            :attr:`CachedLM.capture_layers <specpipe.runtime.cpu.model.cached_lm.CachedLM>`, for EAGLE-3 drafters).

    Attributes:
        quantized: the lm_head (and so the decoder) is a weight-only quantized ``QuantizedLinear``.

    Not thread-safe: one scheduler thread owns it.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        max_batch_size: int,
        capacity: int = 128,
        argmax_screen: bool = True,
        capture_layers: tuple[int, ...] = (),
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        config = model.config
        self.model = model
        self.decoder = model.model
        self.max_batch_size = max_batch_size
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.num_layers = len(self.decoder.layers)
        self._layers = [LayerOps.of(layer) for layer in self.decoder.layers]
        self._final_norm = norm_op(self.decoder.norm)
        self.hidden_size = int(config.hidden_size)
        self.capture_layers = tuple(capture_layers)
        self.lengths = [0] * max_batch_size
        self._free = list(range(max_batch_size))
        self._capacity = 0
        half = self.head_dim // 2
        self._rotate_sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)])
        self.keys = self.values = torch.empty(0)
        self._grow(capacity)
        self.quantized = isinstance(model.lm_head, QuantizedLinear)  # greedy: argmax of the quantized logits themselves
        self.argmax_screen = ArgmaxScreen.for_model(model) if argmax_screen and not self.quantized else None

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """A free slot (the lowest, which keeps the used slots dense), emptied.

        Raises:
            RuntimeError: every slot is in use.
        """
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        self._free.sort()
        slot = self._free.pop(0)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back (its entries are simply overwritten later)."""
        self.lengths[slot] = 0
        if slot not in self._free:
            self._free.append(slot)

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached tokens of ``slot`` (chain rollback)."""
        self.lengths[slot] = min(self.lengths[slot], length)

    def _grow(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        capacity = max(needed, 2 * self._capacity, 16)
        shape = (self.num_layers, self.max_batch_size, self.num_kv_heads, capacity, self.head_dim)
        keys, values = torch.zeros(shape), torch.zeros(shape)
        if self._capacity:
            keys[..., : self._capacity, :] = self.keys
            values[..., : self._capacity, :] = self.values
        outgrown = self._capacity > 0
        self.keys, self.values, self._capacity = keys, values, capacity
        if outgrown:
            trim_heap()  # the previous cache's memory goes back to the system

    @torch.inference_mode()
    def hidden(self, entries: list[BatchEntry]) -> torch.Tensor:
        """One decoder pass over every entry's tokens, appending their keys/values to their slots.

        Returns:
            float32 ``[T, H]`` final hidden states (after the final norm), the entries' rows packed in
            entry order (``T`` = total tokens); with :attr:`capture_layers` ``[T, (1 + k) H]``, each
            captured layer's output after the final hidden state.

        Raises:
            ValueError: no entries, an empty entry, or a slot listed twice.
        """
        if not entries or any(not e.token_ids for e in entries) or len({e.slot for e in entries}) != len(entries):
            raise ValueError("a batched forward needs distinct slots with at least one token each")
        counts = [len(e.token_ids) for e in entries]
        starts = [self.lengths[e.slot] for e in entries]
        needed = max(s + n for s, n in zip(starts, counts))
        self._grow(exact_key_length(needed) if any(e.exact for e in entries) else needed)

        token_ids = torch.tensor([t for e in entries for t in e.token_ids], dtype=torch.long)
        if len(entries) == 1:  # one request: its cache rows are one slice
            cache_rows = (entries[0].slot, slice(starts[0], starts[0] + counts[0]))
        else:
            cache_rows = (
                torch.repeat_interleave(torch.tensor([e.slot for e in entries]), torch.tensor(counts)),
                torch.cat([torch.arange(s, s + n) for s, n in zip(starts, counts)]),
            )
        positions = torch.cat(
            [
                e.positions if e.positions is not None else torch.arange(s, s + n)
                for e, s, n in zip(entries, starts, counts)
            ]
        )
        groups = attention_groups(entries, starts)

        x = self.decoder.embed_tokens(token_ids)  # [T, H]
        cos, sin = self.decoder.rotary_emb(x, positions[None])
        rotary = (cos[0, :, None, :], (sin * self._rotate_sign)[0, :, None, :])  # [T, 1, d] each
        captured = []
        for layer_index, ops in enumerate(self._layers):
            x = x + self._attention(ops, layer_index, x, rotary, cache_rows, groups)
            x = x + ops.mlp(ops.post_norm(x))
            captured += [x] * self.capture_layers.count(layer_index)
        for e, s, n in zip(entries, starts, counts):
            self.lengths[e.slot] = s + n
        if self.capture_layers:  # in the order of capture_layers (ascending, as EAGLE-3 heads read them)
            return torch.cat([self._final_norm(x), *captured], dim=-1)
        return self._final_norm(x)

    def _attention(
        self, ops: LayerOps, layer_index: int, x: torch.Tensor, rotary, cache_rows, groups: list["AttentionGroup"]
    ) -> torch.Tensor:
        total, d, heads = x.shape[0], self.head_dim, self.num_heads
        h = ops.input_norm(x)
        # queries and keys rotated together: x * cos + rotate_half(x) * sin, with rotate_half(x) =
        # roll(x, d/2) * [-1.., +1..] (the sign folded into sin once per forward; the same float32 values
        # as transformers' apply_rotary_pos_emb, in 4 ops instead of 12)
        qkv = ops.qkv(h)
        qk = qkv[:, : (heads + self.num_kv_heads) * d].view(total, heads + self.num_kv_heads, d)
        cos, signed_sin = rotary
        qk = qk * cos + qk.roll(d // 2, dims=-1) * signed_sin
        q, k = qk[:, :heads], qk[:, heads:]
        v = qkv[:, (heads + self.num_kv_heads) * d :].view(total, self.num_kv_heads, d)
        keys, values = self.keys[layer_index], self.values[layer_index]
        slot, rows = cache_rows
        if isinstance(slot, int):
            keys[slot, :, rows] = k.transpose(0, 1)
            values[slot, :, rows] = v.transpose(0, 1)
        else:
            keys[slot, :, rows] = k
            values[slot, :, rows] = v
        out = None if len(groups) == 1 else q.new_empty(total, heads * d)
        for g in groups:
            group_q = q if g.rows is None else q[g.rows]
            if g.padding is None:  # one query per slot, slots in row order
                padded_q = group_q.reshape(-1, 1, heads, d)
            else:
                padded_q = q.new_zeros(g.slots.stop - g.slots.start, g.queries, heads, d)
                padded_q[g.padding] = group_q
            group_out = F.scaled_dot_product_attention(
                padded_q.transpose(1, 2),
                keys[g.slots, :, : g.keys],
                values[g.slots, :, : g.keys],
                attn_mask=g.mask,
                scale=ops.scaling,
                enable_gqa=heads != self.num_kv_heads,
            ).transpose(1, 2)  # [slots, n, heads, d]
            group_out = (
                group_out.reshape(-1, heads * d) if g.padding is None else group_out[g.padding].reshape(-1, heads * d)
            )
            if out is None:
                out = group_out
            else:
                out[g.rows] = group_out
        return ops.o(out)

    @torch.inference_mode()
    def project(self, hidden: torch.Tensor, argmax_only: list[bool] | None = None) -> torch.Tensor:
        """float32 logits ``[n, vocab]`` of hidden states ``[n, H]`` (the target's ``lm_head``).

        ``argmax_only[i]``: row i is only reduced to its argmax (plain greedy), so where :attr:`argmax_screen`
        exists it holds the exact logits of the tokens that can be the argmax, ``-inf`` elsewhere (for at most
        ``MAX_SCREENED_ROWS`` such rows, unless the screen leaves it out: :meth:`ArgmaxScreen.logits`).
        Wide rows of :meth:`hidden` are read up to ``H``.
        """
        if hidden.shape[-1] != self.hidden_size:
            hidden = hidden[:, : self.hidden_size].contiguous()
        if self.argmax_screen is None or argmax_only is None or not 0 < sum(argmax_only) <= MAX_SCREENED_ROWS:
            return self.model.lm_head(hidden).float()
        if all(argmax_only):  # plain greedy decoding: the screen's output is the whole result
            out, left_out = self.argmax_screen.logits(hidden)
            if bool(left_out.any()):
                out[left_out] = self.model.lm_head(hidden[left_out]).float()
            return out
        full = ~torch.tensor(argmax_only)  # rows for the full lm_head: sampled, and those the screen leaves out
        screened = (~full).nonzero()[:, 0]
        out = hidden.new_empty(len(hidden), self.argmax_screen.weight.shape[0])
        out[screened], left_out = self.argmax_screen.logits(hidden[screened])
        full[screened[left_out]] = True
        if bool(full.any()):
            out[full] = self.model.lm_head(hidden[full]).float()
        return out

    def keep_paths(self, paths: list[tuple[int, int, list[int]]]) -> None:
        """After tree forwards, keep each slot's context, root and accepted nodes, contiguous.

        Args:
            paths: ``(slot, context, path)`` per request: ``context`` cached tokens before the root
                (root at cache index ``context``, node i at ``context + 1 + i``), ``path`` the accepted
                node indices; all requests' moves run as one gather/scatter over all layers.
        """
        slots, sources, targets = [], [], []
        for slot, context, path in paths:
            for depth, node in enumerate(path):
                if node != depth:
                    slots.append(slot)
                    sources.append(context + 1 + node)
                    targets.append(context + 1 + depth)
            self.lengths[slot] = context + 1 + len(path)
        if slots:
            slot_index, source, target = (torch.tensor(v, dtype=torch.long) for v in (slots, sources, targets))
            self.keys[:, slot_index, :, target] = self.keys[:, slot_index, :, source]
            self.values[:, slot_index, :, target] = self.values[:, slot_index, :, source]
