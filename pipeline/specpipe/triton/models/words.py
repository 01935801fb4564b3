"""Word lists (stop words, bad words) in TensorRT-LLM's ``[2, N]`` token-id layout.

Layout (``stop_words_list`` / ``bad_words_list`` inputs of TensorRT-LLM's ``tensorrt_llm`` model,
``STOP_WORDS_IDS`` / ``BAD_WORDS_IDS`` outputs of its ``preprocessing`` model; NVIDIA/TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm``, 2a9abd95): an INT32 array of shape ``[2, N]``.
Row 0 holds the token ids of all words back to back, padded with 0; row 1 holds the exclusive end
offset of each word in row 0, padded with -1. ``N = max(1, total ids, number of words)``.
Example: words ``[[5, 6], [7]]`` -> ``[[5, 6, 7], [2, 3, -1]]``. No words -> ``[[0], [-1]]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def to_words_layout(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Pack token-id sequences into the ``[2, N]`` INT32 layout (empty sequences are dropped)."""
    words = [list(map(int, w)) for w in words if len(w) > 0]
    flat = [t for w in words for t in w]
    width = max(1, len(flat), len(words))
    layout = np.zeros((2, width), dtype=np.int32)
    layout[1, :] = -1
    layout[0, : len(flat)] = flat
    layout[1, : len(words)] = np.cumsum([len(w) for w in words], dtype=np.int64)
    return layout


def from_words_layout(layout: np.ndarray | None) -> tuple[tuple[int, ...], ...]:
    """Unpack a ``[2, N]`` layout (any leading batch/beam dims of size 1 are ignored) into token-id
    tuples. ``None`` or an empty array gives ``()``.

    Raises:
        ValueError: the array is not ``[2, N]`` or its offsets are not increasing within row 0.
    """
    if layout is None or np.asarray(layout).size == 0:
        return ()
    array = np.asarray(layout)
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[0] != 2:
        raise ValueError(f"a word list must have shape [2, N], got {list(np.asarray(layout).shape)}")
    ids, offsets = array[0].tolist(), array[1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if not start < end <= len(ids):
            raise ValueError(f"word list offsets must increase within [1, {len(ids)}], got {offsets}")
        words.append(tuple(int(t) for t in ids[start:end]))
        start = end
    return tuple(words)
