"""Which kernel runs a linear layer for few rows: measured at load, like the forward cost model.

A :class:`~specpipe.runtime.cpu.prepack.PrepackedLinear` built with a dense copy can compute inputs of
at most ``dense_rows`` rows as ``x @ W^T`` on that copy (MKL) instead of oneDNN's packed kernel. Which
is faster depends on the CPU and its libraries: on 2 cores of an Intel Xeon (AVX-512, AMX) the dense
copy makes a one-token SmolLM2 forward about 25 % faster and loses from about 8 rows on (see
:mod:`~specpipe.runtime.cpu.prepack`), and a CPU whose packed kernel is fast for one row gains
nothing. :func:`choose_dense_rows` times the target's batched forward both ways at 1, 2, 4, 8 and 12
rows, keeps the dense copies for the row counts where they are faster by a margin, and drops them
(their memory, the decoder's weights once more) where they are never faster.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specpipe.runtime.cpu.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.drafters import DraftModelDrafter
from specpipe.runtime.cpu.prepack import drop_dense_copies, set_dense_rows
from specpipe.runtime.cpu.weights_memory import release_freed_memory

#: Row counts timed by :func:`choose_dense_rows` (12: an EAGLE tree verification).
MEASURED_ROWS = (1, 2, 4, 8, 12)

#: The dense kernel is used for a row count only where it takes at most this fraction of the packed time.
MARGIN = 0.95


@dataclass(frozen=True)
class DenseRowsChoice:
    """The outcome of :func:`choose_dense_rows`.

    Attributes:
        rows: inputs of at most this many rows use the dense copies (0: copies dropped).
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
            return "no dense copies loaded: packed kernels only"
        timings = ", ".join(f"{n} rows {d:.1f} vs {p:.1f} ms" for n, d, p in zip(self.measured_rows, self.dense_ms, self.packed_ms))
        verdict = (f"dense copies used up to {self.rows} rows ({self.copy_bytes / 2**20:.0f} MiB kept)" if self.rows
                   else f"dense copies dropped ({self.copy_bytes / 2**20:.0f} MiB freed)")
        return f"{verdict}; forward with dense copies vs packed only: {timings}"


def rows_from_timings(measured_rows: Sequence[int], dense_ms: Sequence[float], packed_ms: Sequence[float],
                      margin: float = MARGIN) -> int:
    """The largest measured row count up to which the dense kernel is faster at every measured count
    (``dense <= margin * packed``), or 0 when it is not faster at the smallest one."""
    rows = 0
    for n, dense, packed in zip(measured_rows, dense_ms, packed_ms):
        if dense > margin * packed:
            break
        rows = n
    return rows


def choose_dense_rows(engine, measured_rows: Sequence[int] = MEASURED_ROWS, context: int = 64,
                      repeats: int = 3) -> DenseRowsChoice:
    """Time the target's batched forward (plus ``lm_head``) with and without its dense copies at each
    row count in ``measured_rows`` (one token per request, each after ``context`` cached tokens; one
    warm-up round, then ``repeats`` interleaved rounds, medians), then set the row threshold
    (:func:`rows_from_timings`) on the target and on a draft model (whose drafting steps are one row),
    or drop all their dense copies. Runs on the serving thread, before the forward cost model is
    measured (that measures the kernels chosen here).

    Args:
        engine: a loaded engine (:func:`~specpipe.runtime.cpu.loader.load_engine` with ``dense_copy=True``).

    Returns:
        the choice, with the timings (for the log).
    """
    target = engine.target.model
    models = _models(engine)
    if not set_dense_rows(target, 0):
        return DenseRowsChoice(0, (), (), (), 0)  # loaded without dense copies: nothing to choose
    lm = BatchedLM(target, max_batch_size=max(measured_rows))
    slots = [lm.allocate() for _ in range(max(measured_rows))]
    runs: dict[tuple[int, bool], list[float]] = {(n, dense): [] for n in measured_rows for dense in (True, False)}
    lm.hidden([BatchEntry(s, [0] * context) for s in slots])
    for round_index in range(repeats + 1):
        for n in measured_rows:
            for dense in (True, False):
                set_dense_rows(target, max(measured_rows) if dense else 0)
                start = time.perf_counter()
                lm.project(lm.hidden([BatchEntry(s, [1]) for s in slots[:n]]))
                if round_index:
                    runs[(n, dense)].append((time.perf_counter() - start) * 1e3)
                for s in slots[:n]:
                    lm.truncate(s, context)
    dense_ms = tuple(statistics.median(runs[(n, True)]) for n in measured_rows)
    packed_ms = tuple(statistics.median(runs[(n, False)]) for n in measured_rows)
    rows = rows_from_timings(measured_rows, dense_ms, packed_ms)
    return DenseRowsChoice(rows, tuple(measured_rows), dense_ms, packed_ms, _use_or_drop(models, rows))


def parse_dense_rows(setting: str | None) -> int | None:
    """The ``dense_rows`` setting: ``None`` for ``"auto"`` (or empty), else the row count.

    Raises:
        ValueError: anything but ``auto`` or a row count >= 0 in ASCII digits, naming the accepted values.
    """
    text = (setting or "auto").strip().lower()
    if text == "auto":
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"dense_rows must be 'auto' or a row count >= 0 (0: packed kernels only), got {setting!r}")
    return int(text)


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
    if rows == 0:
        return f"dense copies off (dense_rows 0; {copy_bytes / 2**20:.0f} MiB freed)"
    return f"dense copies used up to {rows} rows (dense_rows {rows}; {copy_bytes / 2**20:.0f} MiB)"


def _use_or_drop(models, rows: int) -> int:
    """Use the models' dense copies up to ``rows`` rows, or drop them (and free their memory) for 0;
    returns the bytes of copies kept or dropped."""
    if rows:
        return sum(set_dense_rows(module, rows) for module in models)
    dropped = sum(drop_dense_copies(module) for module in models)
    release_freed_memory()
    return dropped


def _models(engine) -> list:
    """The engine's models with dense copies: the target and a draft model."""
    drafter = getattr(engine, "drafter", None)
    return [engine.target.model] + ([drafter.lm.model] if isinstance(drafter, DraftModelDrafter) else [])
