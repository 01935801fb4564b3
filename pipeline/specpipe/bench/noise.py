"""Was the machine quiet enough for a run's speed-ups? The control rule, on recorded results only.

A *control* is a second server of the baseline's own repository, measured like every other deployment
(``BenchSettings.control``). Two identical deployments differ only by the noise of the machine, so
the control's throughput against the baseline's is a direct sample of the error every speed-up of
that level carries: each speed-up is, like the control's ratio, one deployment's tokens/s over the
baseline's, measured in the same rounds under the same treatment. Ratios are compared in log space,
so that 0.91x and 1.10x are equally far from 1.

Per load level (one concurrency) the rule is:

1. **The control's ratio.** The level is *busy* when control/baseline throughput lies outside
   ``[1 / BUSY_RATIO, BUSY_RATIO]`` (10 %). The committed control runs on 2 shared cores
   (in ``benchmarks/results/deployment_speed_triton/``: ``methods_with_control*``,
   ``fused_projections_c4_with_control`` and ``ngram_margin8_c8``, 14 levels, 6 to 16 rounds, 16 to
   48 requests) measured the control at 0.94-1.075x: 10 % is beyond every quiet level, and a ratio
   error above it is as large as most gains the CPU methods reach there (0.93-1.31x), so figures
   would mislead.
2. **Round-to-round spread** (runs in rounds: ``RequestRecord.round``). Each round of a deployment is
   paired with the baseline's same round (both sent the same prompts), and the ratio of its fastest
   round to its slowest is its spread. A spread above ``ROUND_SPREAD_LIMIT`` (4) means a round ran at
   a quarter of the pace of another: a busy stretch during that deployment's turns which the control
   need not have overlapped. The same committed runs never went above 2.68 (n-gram, 16 rounds of one
   request each, whose acceptance changes with the prompt); the failure this catches ran 6x slower
   (ITL 259 ms against 42 ms). The control's own spread above the limit makes the whole level busy;
   another deployment's makes only its figure busy.
3. **Within the noise.** On a quiet level a speed-up no farther from 1 than the control's ratio
   (``|log s| <= |log control/baseline|``) cannot be told from what an identical deployment measured;
   it is printed, marked ``noise``. This is a one-draw (about one standard error) comparison, not a
   significance test: an unmarked figure only stands out from the control's error.

Why not "busy when the control differs by more than the smallest gain": a method that truly gains
nothing at a level (the committed runs hold several at 0.98-1.02x) would make every quiet run busy.

A level without a usable control (none configured: no verdict at all; or the control's or the
baseline's level missing, incomplete, or without throughput) is *unchecked*: figures are reported as
measured, said to be unchecked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from specpipe.bench.records import LevelResult
from specpipe.bench.stats import level_aggregate

#: The control's throughput ratio to the baseline beyond which a level is busy (either way).
BUSY_RATIO = 1.10
#: A deployment's fastest round against its slowest (each paired with the baseline's round) beyond which it was busy.
ROUND_SPREAD_LIMIT = 4.0

#: Verdicts of a level.
QUIET, BUSY, UNCHECKED = "quiet", "busy", "unchecked"
#: Verdicts of one speed-up figure (besides ``busy`` and ``unchecked``).
OK, NOISE, CONTROL = "ok", "noise", "control"


def round_throughputs(level: LevelResult) -> dict[int, float]:
    """Output tokens/s of each round of ``level``: the completed requests' tokens over the round's span
    (its first send to its last response; ``start_s`` runs on the level's summed timeline). Rounds
    without a token count or a span are left out."""
    found: dict[int, float] = {}
    for number in sorted({r.round for r in level.records}):
        records = [r for r in level.records if r.round == number]
        span = max(r.end_s for r in records) - min(r.start_s for r in records)
        tokens = sum(r.output_tokens for r in records if r.ok and r.output_tokens is not None)
        if span > 0 and tokens:
            found[number] = tokens / span
    return found


def round_ratios(level: LevelResult, baseline: LevelResult) -> list[float]:
    """Per round both levels measured: ``level``'s tokens/s over the baseline's in the same round."""
    own, base = round_throughputs(level), round_throughputs(baseline)
    return [own[n] / base[n] for n in sorted(own) if n in base]


def spread(ratios: list[float]) -> float | None:
    """Fastest over slowest of ``ratios`` (>= 1); ``None`` for fewer than 2 rounds."""
    return max(ratios) / min(ratios) if len(ratios) >= 2 else None


def _throughput(level: LevelResult | None) -> float | None:
    """The level's output tokens/s as reported (:mod:`specpipe.bench.stats`); ``None`` when missing or incomplete."""
    return None if level is None or level.incomplete else level_aggregate(level).output_token_throughput


@dataclass(frozen=True)
class LevelNoise:
    """The rule's finding at one concurrency.

    Attributes:
        concurrency: requests in flight.
        verdict: ``quiet``, ``busy`` or ``unchecked`` (module doc).
        control_ratio: control tokens/s over the baseline's over the whole level (``None``: unchecked).
        round_ratios: per deployment (the control included), each round's tokens/s over the baseline's
            same round.
        spreads: per deployment with 2 rounds or more, fastest over slowest of its ``round_ratios``.
        busy: deployments whose speed-up is not a result (every one on a busy level).
        reasons: one line per finding that made the level or a deployment busy, or left it unchecked.
    """

    concurrency: int
    verdict: str
    control_ratio: float | None = None
    round_ratios: dict[str, list[float]] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    busy: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoiseReport:
    """The rule over a whole run: one :class:`LevelNoise` per concurrency (none without a control)."""

    baseline: str
    control: str | None
    levels: dict[int, LevelNoise] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        """Some figure of the run is not a result (a busy level or a busy deployment)."""
        return any(n.verdict == BUSY or n.busy for n in self.levels.values())

    def figure(self, deployment: str, concurrency: int, speedup: float | None) -> str | None:
        """The verdict of one speed-up figure: ``ok``, ``noise``, ``busy``, ``unchecked``, ``control`` (the
        control's own ratio), or ``None`` when the run has no control (figures as measured)."""
        if self.control is None:
            return None
        found = self.levels.get(concurrency)
        if found is None or found.verdict == UNCHECKED:
            return UNCHECKED
        if deployment == self.control:
            return CONTROL
        if found.verdict == BUSY or deployment in found.busy:
            return BUSY
        if deployment == self.baseline or speedup is None or not speedup > 0:
            return OK
        return NOISE if abs(math.log(speedup)) <= abs(math.log(found.control_ratio)) else OK

    def messages(self) -> list[str]:
        """Every finding as one line, lowest concurrency first (empty when all was quiet)."""
        return [reason for c in sorted(self.levels) for reason in self.levels[c].reasons]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the limits used, and each level's finding keyed by concurrency."""
        return {
            "baseline": self.baseline,
            "control": self.control,
            "busy_ratio": BUSY_RATIO,
            "round_spread_limit": ROUND_SPREAD_LIMIT,
            "busy": self.busy,
            "levels": [asdict(self.levels[c]) for c in sorted(self.levels)],
        }


def assess(levels: list[LevelResult], baseline: str, control: str | None) -> NoiseReport:
    """Apply the control rule (module doc) to a run's levels.

    Args:
        levels: every deployment's :class:`LevelResult`, any order (``BenchRun.levels``).
        baseline: the deployment speed-ups are computed against.
        control: the second deployment of the baseline's repository; ``None``: no verdicts.
    """
    if control is None:
        return NoiseReport(baseline, None)
    by_level: dict[int, dict[str, LevelResult]] = {}
    for level in levels:
        by_level.setdefault(level.concurrency, {})[level.deployment] = level
    return NoiseReport(
        baseline, control, {c: _assess_level(c, found, baseline, control) for c, found in sorted(by_level.items())}
    )


def _assess_level(concurrency: int, levels: dict[str, LevelResult], baseline: str, control: str) -> LevelNoise:
    where = f"concurrency {concurrency}"
    base, ctrl = _throughput(levels.get(baseline)), _throughput(levels.get(control))
    if base is None or ctrl is None:
        missing = [name for name, value in ((baseline, base), (control, ctrl)) if value is None]
        why = "; ".join(f"{name}: {_failure(levels.get(name))}" for name in missing)
        return LevelNoise(
            concurrency, UNCHECKED, reasons=(f"{where}: speed-ups unchecked, no control to compare ({why})",)
        )
    ratio = ctrl / base
    ratios = {
        name: round_ratios(level, levels[baseline])
        for name, level in levels.items()
        if name != baseline and not level.incomplete
    }
    spreads = {name: value for name, r in ratios.items() if (value := spread(r)) is not None}
    reasons, busy = [], []
    if abs(math.log(ratio)) > math.log(BUSY_RATIO):
        reasons.append(
            f"{where}: the machine was too busy: the control (the baseline served twice) measured "
            f"{ratio:.2f}x the baseline (quiet: {1 / BUSY_RATIO:.2f}-{BUSY_RATIO:.2f}x)"
        )
    for name, value in spreads.items():
        if value > ROUND_SPREAD_LIMIT:
            low, high = min(ratios[name]), max(ratios[name])
            reasons.append(
                f"{where}: the machine was busy during {name}'s turns: its rounds measured "
                f"{low:.2f}-{high:.2f}x the baseline's (quiet: within {ROUND_SPREAD_LIMIT:.0f}x of each other)"
            )
            busy.append(name)
    level_busy = bool(reasons) and (abs(math.log(ratio)) > math.log(BUSY_RATIO) or control in busy)
    if level_busy:
        busy = [name for name in levels if name != baseline]
    return LevelNoise(concurrency, BUSY if level_busy else QUIET, ratio, ratios, spreads, tuple(busy), tuple(reasons))


def _failure(level: LevelResult | None) -> str:
    if level is None:
        return "not measured"
    if level.incomplete:
        return f"incomplete ({level.reason})" if level.reason else "incomplete"
    return "no output tokens"
