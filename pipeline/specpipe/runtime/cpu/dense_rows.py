"""Which kernel runs a linear layer: decided at load, like the forward cost model.

A :class:`~specpipe.runtime.cpu.model.prepack.PrepackedLinear` built with a dense copy can compute inputs of
at most ``dense_rows`` rows with ``F.linear`` on that copy instead of its packed kernel.

Where the packed kernel is MKL's packed GEMM (:func:`~specpipe.runtime.cpu.model.prepack.mkl_packed_gemm_available`),
``auto`` loads no copies (:func:`dense_copies_wanted`): it is within a few percent of the dense copy for
1-3 rows and faster from 4 rows on (a verification, a batch, a prompt chunk), with one copy of the
weights.

Where it is oneDNN's, which is faster for few rows depends on the CPU (figures in
``docs/experiments.md``). :func:`choose_dense_rows` then times the target's batched forward both ways at 1, 2,
4, 8 and 12 rows (one token per request) and at 32 and 128 rows (a prompt chunk), and keeps one of
three layouts:

* **dense only** where the dense copy is not slower on average (geometric mean of the time ratios over
  the measured row counts at most 1.05, none above 1.25): the packed weights are dropped and every
  input runs on the copy (one copy of the weights, as loaded);
* **both** where the copy is faster by 5 % for few rows but clearly slower for more: the copy up to
  the largest such row count, the packed kernel above it (the decoder's weights twice);
* **packed only** where the copy is never faster: the copies are dropped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.prepack import (
    ALL_ROWS,
    drop_dense_copies,
    drop_packed_weights,
    mkl_packed_gemm_available,
    set_dense_rows,
)
from specpipe.runtime.cpu.model.weights_memory import release_freed_memory

#: Row counts timed by :func:`choose_dense_rows` as one token per request (12: an EAGLE tree verification).
MEASURED_ROWS = (1, 2, 4, 8, 12)

#: Row counts timed as one request's prompt chunk.
CHUNK_ROWS = (32, 128)

#: Both copies are kept for a row count only where the dense kernel takes at most this fraction of the
#: packed time (the second copy has to pay for its memory).
MARGIN = 0.95

#: The packed weights are dropped where the dense kernel's time over the packed one, geometric mean over
#: the measured row counts, is at most this (a single count's ratio is too noisy on a shared machine:
#: the same server measures ±15 % apart from one load to the next) ...
ONE_COPY_MARGIN = 1.05

#: ... and where it is at most this at every measured row count.
ONE_COPY_WORST = 1.25


@dataclass(frozen=True)
class DenseRowsChoice:
    """The outcome of :func:`choose_dense_rows`.

    Attributes:
        rows: inputs of at most this many rows use the dense copies (0: copies dropped;
            :data:`~specpipe.runtime.cpu.model.prepack.ALL_ROWS`: packed weights dropped, dense only).
        measured_rows: the row counts timed.
        dense_ms / packed_ms: median forward time (ms) at each row count with / without the dense copies.
        copy_bytes: bytes of dense copies kept (``rows`` > 0) or freed (``rows`` = 0).
    """

    rows: int
    measured_rows: tuple[int, ...]
    dense_ms: tuple[float, ...]
    packed_ms: tuple[float, ...]
    copy_bytes: int

    def describe(self) -> str:
        """One line for the server log."""
        if not self.measured_rows:
            kernel = "MKL's packed GEMM" if mkl_packed_gemm_available() else "oneDNN"
            return f"no dense copies loaded: packed kernels only ({kernel}, one copy of the weights)"
        timings = ", ".join(
            f"{n} rows {d:.1f} vs {p:.1f} ms" for n, d, p in zip(self.measured_rows, self.dense_ms, self.packed_ms)
        )
        if self.rows >= ALL_ROWS:
            verdict = f"dense weights only, packed copies dropped ({self.copy_bytes / 2**20:.0f} MiB freed)"
        elif self.rows:
            verdict = f"dense copies used up to {self.rows} rows ({self.copy_bytes / 2**20:.0f} MiB kept)"
        else:
            verdict = f"dense copies dropped ({self.copy_bytes / 2**20:.0f} MiB freed)"
        return f"{verdict}; forward with dense copies vs packed only: {timings}"


def rows_from_timings(
    measured_rows: Sequence[int],
    dense_ms: Sequence[float],
    packed_ms: Sequence[float],
    margin: float = MARGIN,
    one_copy_margin: float = ONE_COPY_MARGIN,
    one_copy_worst: float = ONE_COPY_WORST,
) -> int:
    """:data:`~specpipe.runtime.cpu.model.prepack.ALL_ROWS` (dense weights only) when the dense kernel's time
    over the packed one has a geometric mean of at most ``one_copy_margin`` and is at most
    ``one_copy_worst`` at every measured count; else the largest measured row count up to which it is
    faster at every measured count (``dense <= margin * packed``), or 0 when it is not faster at the
    smallest."""
    ratios = [dense / packed for dense, packed in zip(dense_ms, packed_ms)]
    if ratios and statistics.geometric_mean(ratios) <= one_copy_margin and max(ratios) <= one_copy_worst:
        return ALL_ROWS
    rows = 0
    for n, dense, packed in zip(measured_rows, dense_ms, packed_ms):
        if dense > margin * packed:
            break
        rows = n
    return rows


def dense_copies_wanted(rows: int | None) -> bool:
    """Whether to load the engine with dense weight copies for the parsed ``dense_rows`` setting
    ``rows`` (:func:`parse_dense_rows`): for a row count or ``all``, and for ``auto`` (``None``) only
    where the packed kernel is oneDNN's (module doc)."""
    if rows is None:
        return not mkl_packed_gemm_available()
    return rows != 0


def choose_dense_rows(
    engine,
    measured_rows: Sequence[int] = MEASURED_ROWS,
    context: int = 64,
    repeats: int = 3,
    chunk_rows: Sequence[int] = CHUNK_ROWS,
) -> DenseRowsChoice:
    """Time the target's batched forward (plus ``lm_head``) with and without its dense copies at each
    row count in ``measured_rows`` (one token per request, each after ``context`` cached tokens) and
    ``chunk_rows`` (one request's prompt chunk; one warm-up round, then ``repeats`` interleaved rounds,
    medians), then apply :func:`rows_from_timings` to the target and to a draft model (whose drafting
    steps are one row): keep the copies only, both, or the packed weights only. Runs on the serving
    thread, before the forward cost model is measured (that measures the kernels chosen here).

    Args:
        engine: a loaded engine (:func:`~specpipe.runtime.cpu.loader.load_engine` with ``dense_copy=True``).

    Returns:
        the choice, with the timings (for the log).
    """
    target = engine.target.model
    models = _models(engine)
    if not set_dense_rows(target, 0):
        return DenseRowsChoice(0, (), (), (), 0)  # loaded without dense copies: nothing to choose
    all_rows = (*measured_rows, *chunk_rows)
    lm = BatchedLM(target, max_batch_size=max(measured_rows), argmax_screen=False)  # times the full lm_head only
    slots = [lm.allocate() for _ in range(max(measured_rows))]
    runs: dict[tuple[int, bool], list[float]] = {(n, dense): [] for n in all_rows for dense in (True, False)}
    lm.hidden([BatchEntry(s, [0] * context) for s in slots])
    for round_index in range(repeats + 1):
        for n in all_rows:
            entries = [BatchEntry(s, [1]) for s in slots[:n]] if n in measured_rows else [BatchEntry(slots[0], [1] * n)]
            for dense in (True, False):
                set_dense_rows(target, max(all_rows) if dense else 0)
                start = time.perf_counter()
                lm.project(lm.hidden(entries))
                if round_index:
                    runs[(n, dense)].append((time.perf_counter() - start) * 1e3)
                for entry in entries:
                    lm.truncate(entry.slot, context)
    dense_ms = tuple(statistics.median(runs[(n, True)]) for n in all_rows)
    packed_ms = tuple(statistics.median(runs[(n, False)]) for n in all_rows)
    rows = rows_from_timings(all_rows, dense_ms, packed_ms)
    return DenseRowsChoice(rows, all_rows, dense_ms, packed_ms, _use_or_drop(models, rows))


#: The largest row-count threshold accepted: beyond a prompt chunk plus a full batch's drafts, a count
#: keeps both copies of the weights while only the dense one is ever used.
MAX_ROW_COUNT = 4096


def parse_dense_rows(setting: str | None) -> int | None:
    """The ``dense_rows`` setting: ``None`` for ``"auto"`` (or empty), :data:`~specpipe.runtime.cpu.model.prepack.ALL_ROWS`
    for ``"all"`` (dense weights only), else the row count.

    Raises:
        ValueError: anything but ``auto``, ``all`` or a row count 0 - :data:`MAX_ROW_COUNT` in ASCII
            digits, naming the accepted values.
    """
    text = (setting or "auto").strip().lower()
    if text == "auto":
        return None
    if text == "all":
        return ALL_ROWS
    if not (text.isascii() and text.isdigit()):
        raise ValueError(
            f"dense_rows must be 'auto', 'all' (dense weights only) or a row count >= 0 "
            f"(0: packed kernels only), got {setting!r}"
        )
    rows = int(text)
    if rows > MAX_ROW_COUNT:
        raise ValueError(
            f"dense_rows {rows} is more rows than a forward has (at most {MAX_ROW_COUNT} is "
            f"meaningful): give 'all' for the dense weights only"
        )
    return rows


def apply_dense_rows(engine, rows: int | None) -> str:
    """Apply a parsed ``dense_rows`` setting (:func:`parse_dense_rows`) to a loaded engine.

    Args:
        engine: loaded with ``dense_copy=True`` unless ``rows`` is 0.
        rows: ``None``: :func:`choose_dense_rows`; else that threshold (0 drops the copies).

    Returns:
        a line for the server log.
    """
    if rows is None:
        return choose_dense_rows(engine).describe()
    copy_bytes = _use_or_drop(_models(engine), rows)
    if rows >= ALL_ROWS:
        return f"dense weights only (dense_rows all; {copy_bytes / 2**20:.0f} MiB of packed copies freed)"
    if rows == 0:
        return f"dense copies off (dense_rows 0; {copy_bytes / 2**20:.0f} MiB freed)"
    return f"dense copies used up to {rows} rows (dense_rows {rows}; {copy_bytes / 2**20:.0f} MiB)"


def _use_or_drop(models, rows: int) -> int:
    """Use the models' dense copies up to ``rows`` rows, or drop them (and free their memory) for 0, or
    drop the packed weights for :data:`~specpipe.runtime.cpu.model.prepack.ALL_ROWS`; returns the bytes of
    copies kept or dropped."""
    if rows >= ALL_ROWS:
        dropped = sum(drop_packed_weights(module) for module in models)
        release_freed_memory()
        return dropped
    if rows:
        return sum(set_dense_rows(module, rows) for module in models)
    dropped = sum(drop_dense_copies(module) for module in models)
    release_freed_memory()
    return dropped


def _models(engine) -> list:
    """The engine's models with dense copies: the target and a draft model."""
    return [engine.target.model, *engine.drafter.draft_models()]
