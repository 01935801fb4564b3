"""Recorded benchmark levels with chosen per-round timings, for the noise rule's and the demo's tests."""

from __future__ import annotations

from specpipe.bench.records import LevelResult, RequestRecord

TOKENS = 100


def level(name: str, seconds_per_round: list[float], concurrency: int = 1, per_round: int = 2) -> LevelResult:
    """``per_round`` requests of TOKENS tokens in each round, one after another, each taking that round's seconds;
    times on the level's summed timeline, as the runner records them."""
    records, clock, index = [], 0.0, 0
    for number, seconds in enumerate(seconds_per_round):
        for _ in range(per_round):
            records.append(
                RequestRecord(
                    deployment=name,
                    concurrency=concurrency,
                    index=index,
                    prompt_id=f"p{index}",
                    start_s=clock,
                    latency_s=seconds,
                    ttft_s=seconds / 10,
                    output_tokens=TOKENS,
                    round=number,
                )
            )
            clock, index = clock + seconds, index + 1
    return LevelResult(name, concurrency, records=records)
