"""Greedy agreement between deployments' texts (``specpipe.bench.agreement``), on hand-made runs."""

import csv
import json

import pytest

from specpipe.bench.agreement import agreement_line, first_texts, greedy_agreement, prefix_share
from specpipe.bench.records import LevelResult, RequestRecord
from specpipe.bench.report import to_json, write_results
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.table import comparison_table

TEXTS = {"p0": "The cat sat on the mat.", "p1": "Hello world", "p2": "1 2 3 4", "p3": "abcdefghij"}


def level(name, texts, concurrency=1, errors=(), **record):
    records = [
        RequestRecord(
            deployment=name,
            concurrency=concurrency,
            index=i,
            prompt_id=prompt,
            start_s=float(i),
            latency_s=0.5,
            ttft_s=0.1,
            output_tokens=4,
            text=text,
            error="server died" if prompt in errors else None,
            **record,
        )
        for i, (prompt, text) in enumerate(texts.items())
    ]
    return LevelResult(name, concurrency, records=records)


def make_run(other_texts, errors=(), **settings):
    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=(1,), max_tokens=4, num_requests=4, **settings))
    run.levels = [level("baseline", TEXTS), level("vllm", other_texts, errors=errors)]
    run.deployments = [{"name": "baseline", "kind": "triton"}, {"name": "vllm", "kind": "openai"}]
    return run


def one_differs():
    return {**TEXTS, "p3": "abcdeXXXXX"}  # common prefix 5 of 10 characters


def test_identical_texts_agree_fully_and_the_reference_gets_none():
    found = greedy_agreement(make_run(dict(TEXTS)))
    assert found["baseline", (1, None)] is None
    agreement = found["vllm", (1, None)]
    assert (agreement.identical, agreement.prompts, agreement.common_prefix, agreement.reference) == (
        1.0,
        4,
        1.0,
        "baseline",
    )


def test_one_differing_prompt_of_four():
    agreement = greedy_agreement(make_run(one_differs()))["vllm", (1, None)]
    assert agreement.identical == 0.75 and agreement.prompts == 4
    assert agreement.common_prefix == pytest.approx((1 + 1 + 1 + 0.5) / 4)


def test_failed_requests_are_left_out():
    agreement = greedy_agreement(make_run(one_differs(), errors=("p3",)))["vllm", (1, None)]
    assert agreement.identical == 1.0 and agreement.prompts == 3 and agreement.common_prefix == 1.0


def test_sampled_runs_get_no_figure():
    run = make_run(one_differs(), temperature=0.7, seed=1)
    assert set(greedy_agreement(run).values()) == {None}
    assert agreement_line(run) is None
    assert all(r["greedy_agreement"] is None for r in to_json(run)["results"])
    assert greedy_agreement(make_run(one_differs(), top_p=0.9))["vllm", (1, None)] is None


def test_first_completed_text_per_prompt_and_levels_matched_by_concurrency():
    repeated = LevelResult(
        "vllm",
        1,
        records=[
            RequestRecord("vllm", 1, index=0, prompt_id="p0", start_s=0, latency_s=1, text="lost", error="timeout"),
            RequestRecord("vllm", 1, index=3, prompt_id="p0", start_s=0, latency_s=1, text="later round", round=1),
            RequestRecord("vllm", 1, index=1, prompt_id="p0", start_s=0, latency_s=1, text="first"),
            RequestRecord("vllm", 1, index=2, prompt_id="p0", start_s=0, latency_s=1, text="second"),
        ],
    )
    assert first_texts(repeated) == {"p0": "first"}
    run = make_run(dict(TEXTS))
    run.levels.append(level("vllm", one_differs(), concurrency=4))  # the reference has no level @4
    assert greedy_agreement(run)["vllm", (4, None)] is None
    assert prefix_share("", "") == 1.0 and prefix_share("", "x") == 0.0 and prefix_share("abcd", "abcdef") == 1.0


def test_json_csv_and_table_carry_it(tmp_path):
    run = make_run(one_differs())
    paths = write_results(run, tmp_path)
    results = {r["deployment"]: r for r in json.loads(paths["bench.json"].read_text())["results"]}
    assert results["baseline"]["greedy_agreement"] is None
    assert results["vllm"]["greedy_agreement"] == {
        "identical": 0.75,
        "prompts": 4,
        "common_prefix": 0.875,
        "reference": "baseline",
    }
    rows = {r["deployment"]: r for r in csv.DictReader(paths["bench.csv"].open())}
    assert rows["baseline"]["greedy_identical"] == "" and rows["baseline"]["greedy_reference"] == ""
    assert (
        rows["vllm"]["greedy_identical"],
        rows["vllm"]["greedy_common_prefix"],
        rows["vllm"]["greedy_prompts"],
        rows["vllm"]["greedy_reference"],
    ) == ("0.75", "0.875", "4", "baseline")
    line = "greedy agreement with baseline, identical texts (mean common prefix): vllm 3/4 (88%) @1"
    assert agreement_line(run) == line

    from rich.console import Console

    console = Console(record=True, width=260)
    console.print(comparison_table(run))
    assert line in " ".join(console.export_text().split())
