"""One batched forward's inputs (:class:`BatchEntry`, one per request) and how their attention is split
into ``scaled_dot_product_attention`` calls (:func:`attention_groups`) that pad little, and whose shapes do
not depend on the batch for exact entries (a seeded sampled request, or any greedy one on a quantized
target: ``tests/runtime/cpu/test_exact_attention.py``). :class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM` runs
the calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchEntry:
    """One request's input to a batched forward.

    Attributes:
        slot: the request's cache slot (:meth:`BatchedLM.allocate`).
        token_ids: n >= 1 tokens, written to the slot's cache at ``length .. length + n - 1``.
        positions: int64 ``[n]`` position ids; ``None``: ``length .. length + n - 1`` (a chain).
        mask: bool ``[n, length + n]`` (True = may attend) over the slot's cache and these tokens;
            ``None``: causal (every cached token, then the new ones up to itself).
        exact: its rows must come out bitwise the same whatever shares the forward and however many
            tokens (at most :data:`EXACT_QUERY_ROWS`) it verifies, as a seeded sampled request needs:
            its attention runs in calls whose shapes do not depend on the batch (:func:`attention_groups`).
    """

    slot: int
    token_ids: list[int]
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    exact: bool = False


#: A padded attention call over several multi-token entries may compute at most this many times the
#: query rows they need; beyond it each entry gets its own call.
PADDING_LIMIT = 2.0
#: Exact entries of at most this many tokens share one attention call; longer ones (prompt chunks) get
#: a call each.
EXACT_QUERY_ROWS = 16
#: The shared call of exact entries has at least this many query rows per slot. PyTorch's CPU flash
#: attention (torch 2.13, 2 threads) computes a query row bitwise alike with 4 to 16 rows per slot,
#: whatever the other slots and rows, but not with 1 to 3 (with one row, a lone slot also differs from
#: two or more).
EXACT_MIN_QUERY_ROWS = 4
#: Exact entries' calls read keys in multiples of this many (the rest masked): padding the keys to any
#: other length changes a row's last bits.
EXACT_KEY_BLOCK = 64


@dataclass
class AttentionGroup:
    """Entries whose attention runs as one ``scaled_dot_product_attention`` call.

    Attributes:
        rows: int64 ``[R]``, the group's rows in the packed sequence; ``None``: every row, in order.
        slots: the cache slots read, a contiguous range (slots in it outside the group get one dummy
            query row attending to their first key).
        queries: query rows per slot (the group's longest entry).
        keys: keys read per slot (the group's longest cache including this forward's tokens).
        mask: bool ``[slots, 1, queries, keys]`` (True = may attend).
        padding: ``(slot - slots.start, row in entry)``, int64 ``[R]`` each: where each row goes in the
            padded queries; ``None`` when the range holds one row per slot, in row order.
    """

    rows: torch.Tensor | None
    slots: slice
    queries: int
    keys: int
    mask: torch.Tensor
    padding: tuple[torch.Tensor, torch.Tensor] | None


def attention_groups(entries: list[BatchEntry], starts: list[int]) -> list[AttentionGroup]:
    """Split a forward's entries into attention calls that pad little.

    One-token entries (plain decoding) share one call, one query per slot. Longer entries (chains, token
    trees, prompt chunks) share a second call over their slot range when its padding computes at most
    :data:`PADDING_LIMIT` times their rows, else get one call each: a 12-node tree then no longer pads
    every other request's query to 13 rows, which doubled the attention time of a batch of 8. Exact
    entries (:attr:`BatchEntry.exact`) of at most :data:`EXACT_QUERY_ROWS` tokens share a call with at
    least :data:`EXACT_MIN_QUERY_ROWS` query rows per slot, longer ones get a call each, both with keys
    read in multiples of :data:`EXACT_KEY_BLOCK`; their rows then come out bitwise alike whatever else
    the call holds (``tests/runtime/cpu/test_exact_attention.py``).

    Args:
        entries: the forward's entries; starts: each entry's cached tokens before it.
    """
    counts = [len(e.token_ids) for e in entries]
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)
    singles = [i for i, n in enumerate(counts) if n == 1 and not entries[i].exact]
    longer = [i for i, n in enumerate(counts) if n > 1 and not entries[i].exact]
    parts = [singles] if singles else []
    if longer:
        span = max(entries[i].slot for i in longer) - min(entries[i].slot for i in longer) + 1
        if span * max(counts[i] for i in longer) <= PADDING_LIMIT * sum(counts[i] for i in longer):
            parts.append(longer)
        else:
            parts += [[i] for i in longer]
    exact_short = [i for i, n in enumerate(counts) if n <= EXACT_QUERY_ROWS and entries[i].exact]
    if exact_short:
        parts.append(exact_short)
    parts += [[i] for i, n in enumerate(counts) if n > EXACT_QUERY_ROWS and entries[i].exact]
    return [_group(entries, starts, offsets, part, every_row=len(parts) == 1) for part in parts]


def exact_key_length(tokens: int) -> int:
    """Keys an exact entry's attention call reads for ``tokens`` cached ones: a multiple of
    :data:`EXACT_KEY_BLOCK`."""
    return -(-tokens // EXACT_KEY_BLOCK) * EXACT_KEY_BLOCK


def _group(
    entries: list[BatchEntry], starts: list[int], offsets: list[int], members: list[int], every_row: bool
) -> AttentionGroup:
    """One call's group: query rows per slot as many as its longest entry's tokens, keys as many as its
    longest cache; for exact entries (all or none of ``members``) at least :data:`EXACT_MIN_QUERY_ROWS`
    query rows and keys in multiples of :data:`EXACT_KEY_BLOCK`."""
    slots = [entries[i].slot for i in members]
    counts = [offsets[i + 1] - offsets[i] for i in members]
    first, queries = min(slots), max(counts)
    keys = max(starts[i] + n for i, n in zip(members, counts))
    if entries[members[0]].exact:
        queries, keys = max(queries, EXACT_MIN_QUERY_ROWS), exact_key_length(keys)
    mask = torch.zeros(max(slots) - first + 1, 1, queries, keys, dtype=torch.bool)
    mask[..., 0] = True  # padded query rows attend to something (their output is dropped)
    for i, slot, n in zip(members, slots, counts):
        start, entry = starts[i], entries[i]
        if entry.mask is not None:
            mask[slot - first, 0, :n, : start + n] = entry.mask
        else:
            mask[slot - first, 0, :n, :start] = True
            mask[slot - first, 0, :n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
    rows = None if every_row else torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in members])
    padding = None
    if queries > 1 or slots != list(range(first, first + len(slots))):
        padding = (
            torch.repeat_interleave(torch.tensor(slots) - first, torch.tensor(counts)),
            torch.cat([torch.arange(n) for n in counts]),
        )
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))  # converted once, not per layer
    return AttentionGroup(rows, slice(first, max(slots) + 1), queries, keys, additive, padding)
