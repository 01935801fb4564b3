"""Greedy agreement: how often two deployments, decoding greedily, generate the same text for a prompt.

Speculative decoding does not change what greedy decoding produces, so two deployments of one spec
(the TensorRT-LLM and the vLLM deployment, or a drafted one and its baseline) should mostly write the
same texts. Mostly, not always: different kernels round differently, and where the two best tokens are
a near-tie one engine may pick the other token, after which the texts diverge. So agreement is
*reported*, never required: a low figure is worth a look, not a failure.

The reference is the first deployment of the run (``BenchRun.deployments`` order, the first one
measured; usually the baseline). Every other deployment gets, per load level (same concurrency and
request rate), over the prompts both completed at that level:

- ``identical``: the share of prompts whose generated text equals the reference's;
- ``common_prefix``: the mean, over those prompts, of the length of the common prefix in characters
  divided by the reference text's length (1.0 when both are empty, 0.0 when only the reference is);
- ``prompts``: how many prompts were compared; ``reference``: the reference's name.

A prompt sent several times at a level (several requests per prompt, rounds) counts once, with the
first completed text of each side: the completed record with the lowest ``(round, index)``. Failed
requests are left out. Records keep text, not token ids, hence characters.

The reference itself gets no figure (``None``: it would be 1.0 by definition), nor does a sampled run
(temperature or top-p: the texts differ by design, so any figure would mislead), nor a level with no
prompt completed by both sides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from os.path import commonprefix
from typing import Any

from specpipe.bench.records import LevelResult


@dataclass(frozen=True)
class Agreement:
    """Greedy agreement of one deployment's level with the reference's level (module doc)."""

    identical: float
    prompts: int
    common_prefix: float
    reference: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_texts(level: LevelResult) -> dict[str, str]:
    """The first completed text per prompt id of ``level`` (lowest ``(round, index)``)."""
    texts: dict[str, str] = {}
    for record in sorted((r for r in level.records if r.ok), key=lambda r: (r.round, r.index)):
        texts.setdefault(record.prompt_id, record.text)
    return texts


def prefix_share(reference: str, other: str) -> float:
    """Length of the common prefix of ``reference`` and ``other`` / the reference's length, in [0, 1]."""
    if not reference:
        return 1.0 if not other else 0.0
    return len(commonprefix([reference, other])) / len(reference)


def compare(reference: dict[str, str], other: dict[str, str], name: str) -> Agreement | None:
    """Agreement of ``other``'s texts with ``reference``'s (both by prompt id), ``None`` when no prompt is shared."""
    shared = [p for p in reference if p in other]
    if not shared:
        return None
    return Agreement(
        identical=sum(reference[p] == other[p] for p in shared) / len(shared),
        prompts=len(shared),
        common_prefix=sum(prefix_share(reference[p], other[p]) for p in shared) / len(shared),
        reference=name,
    )


def reference_deployment(run) -> str | None:
    """The first deployment of ``run`` that has levels (``None`` when nothing was measured)."""
    measured = {level.deployment for level in run.levels}
    names = [d["name"] for d in run.deployments] + [level.deployment for level in run.levels]
    return next((name for name in names if name in measured), None)


def greedy_agreement(run) -> dict[tuple[str, tuple[int, float | None]], Agreement | None]:
    """Per ``(deployment, level key)`` of ``run`` (a :class:`~specpipe.bench.runner.BenchRun`): its
    :class:`Agreement` with the reference, or ``None`` (the reference, a sampled run, nothing shared)."""
    found: dict[tuple[str, tuple[int, float | None]], Agreement | None] = {
        (level.deployment, level.key): None for level in run.levels
    }
    reference = reference_deployment(run)
    if run.settings.sampled or reference is None:
        return found
    texts = {level.key: first_texts(level) for level in run.levels if level.deployment == reference}
    for level in run.levels:
        if level.deployment != reference and level.key in texts:
            found[level.deployment, level.key] = compare(texts[level.key], first_texts(level), reference)
    return found


def _at(level: LevelResult) -> str:
    if level.request_rate is None:
        return f"@{level.concurrency}"
    return f"@{level.request_rate:g} req/s"


def agreement_line(run, agreements: dict | None = None) -> str | None:
    """``greedy agreement with baseline, identical texts (mean common prefix): eagle 3/4 (93%) @1, 4/4 (100%) @4``,
    or ``None`` when no deployment has a figure (sampled run, a single deployment)."""
    agreements = greedy_agreement(run) if agreements is None else agreements
    by_deployment: dict[str, list[str]] = {}
    reference = None
    for level in run.levels:
        if (found := agreements.get((level.deployment, level.key))) is not None:
            reference = found.reference
            same = round(found.identical * found.prompts)
            by_deployment.setdefault(level.deployment, []).append(
                f"{same}/{found.prompts} ({found.common_prefix:.0%}) {_at(level)}"
            )
    if not by_deployment:
        return None
    cells = "; ".join(f"{name} {', '.join(parts)}" for name, parts in by_deployment.items())
    return f"greedy agreement with {reference}, identical texts (mean common prefix): {cells}"
