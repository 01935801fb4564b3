"""``specpipe bench`` output from a hand-made run: table, JSON, CSV, plot, and the incomplete marking."""

import csv
import json

import pytest

from specpipe.bench.records import LevelResult, RequestRecord
from specpipe.bench.report import plot_figure, write_results
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.table import comparison_table, format_bytes


def level(name, concurrency, tokens_per_request, latency, memory=None):
    records = [
        RequestRecord(
            deployment=name,
            concurrency=concurrency,
            index=i,
            prompt_id=f"p{i}",
            start_s=float(i),
            latency_s=latency,
            ttft_s=latency / 4,
            output_tokens=tokens_per_request,
            draft_tokens=0 if name == "baseline" else 8,
            accepted_draft_tokens=0 if name == "baseline" else 6,
            text="x" * tokens_per_request,
        )
        for i in range(2)
    ]
    return LevelResult(
        name, concurrency, records=records, memory_peak_bytes=memory, memory_kind="cpu" if memory else None
    )


def make_run():
    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=(1, 2), max_tokens=16, num_requests=2))
    # windows: 1 + latency seconds for both levels (starts 0 and 1)
    run.levels = [
        level("baseline", 1, 10, 1.0, 3 * 2**30),
        level("baseline", 2, 10, 3.0),
        level("ngram", 1, 10, 0.5),
        level("ngram", 2, 10, 1.5),
    ]
    run.deployments = [{"name": "baseline", "kind": "triton"}, {"name": "ngram", "kind": "triton"}]
    return run


def test_files_hold_aggregates_records_and_speedups(tmp_path):
    paths = write_results(make_run(), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bench.csv",
        "bench.json",
        "bench.png",
        "profile_export-baseline.json",
        "profile_export-ngram.json",
        "requests.csv",
    ]
    data = json.loads(paths["bench.json"].read_text())
    assert data["incomplete"] is False and data["settings"]["concurrencies"] == [1, 2]
    assert "inter_token_latency_ms" in data["metric_definitions"] and len(data["records"]) == 8
    results = {(r["deployment"], r["concurrency"]): r for r in data["results"]}
    # baseline @1: 20 tokens over 2 s; ngram @1: 20 tokens over 1.5 s
    assert results["baseline", 1]["aggregate"]["output_token_throughput"] == pytest.approx(10.0)
    assert results["ngram", 1]["aggregate"]["output_token_throughput"] == pytest.approx(20 / 1.5)
    assert results["ngram", 1]["speedup_vs_baseline"] == pytest.approx((20 / 1.5) / 10.0)
    assert results["ngram", 2]["speedup_vs_baseline"] == pytest.approx((20 / 2.5) / 5.0)
    assert results["baseline", 2]["speedup_vs_baseline"] == 1.0
    assert results["ngram", 1]["aggregate"]["acceptance_rate"] == 0.75
    assert results["baseline", 1]["memory_peak_bytes"] == 3 * 2**30
    rows = list(csv.DictReader(paths["bench.csv"].open()))
    assert [(r["deployment"], r["concurrency"]) for r in rows] == [
        ("baseline", "1"),
        ("baseline", "2"),
        ("ngram", "1"),
        ("ngram", "2"),
    ]
    assert float(rows[2]["output_token_throughput"]) == pytest.approx(20 / 1.5)
    assert float(rows[2]["ttft_ms_p50"]) == pytest.approx(125.0) and rows[2]["incomplete"] == "False"
    requests = list(csv.DictReader(paths["requests.csv"].open()))
    assert len(requests) == 8 and "text" not in requests[0] and requests[0]["output_tokens"] == "10"


def test_table_shows_speedup_memory_and_acceptance():
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(comparison_table(make_run()))
    text = console.export_text()
    lines = [line for line in text.splitlines() if "│ ngram" in line or "│ baseline" in line]
    assert len(lines) == 4
    assert "1.33x" in lines[2] and "1.60x" in lines[3] and lines[0].count("1.00x") == 1
    assert "3.00 GiB CPU" in lines[0] and "0.75" in lines[2]


def test_plot_has_one_line_per_deployment(tmp_path):
    from matplotlib.image import imread

    figure = plot_figure(make_run())
    throughput, ttft = figure.axes
    assert [line.get_label() for line in throughput.get_lines()] == ["baseline", "ngram"]
    assert list(throughput.get_lines()[1].get_xdata()) == [1, 2]
    assert list(throughput.get_lines()[0].get_ydata()) == pytest.approx([10.0, 5.0])
    assert list(ttft.get_lines()[0].get_ydata()) == pytest.approx([250.0, 750.0])
    assert throughput.get_xlabel().startswith("concurrency") and ttft.get_ylabel() == "TTFT p50, ms"
    path = write_results(make_run(), tmp_path)["bench.png"]
    image = imread(path)
    assert image.shape[0] >= 400 and image.shape[1] >= 1000 and image.std() > 0.05  # a real picture, not a blank page


def test_incomplete_run_is_marked_everywhere(tmp_path):
    run = make_run()
    run.levels[-1].incomplete, run.levels[-1].reason = True, "the server stopped answering"
    run.mark_incomplete("ngram: the server stopped answering")
    data = json.loads(write_results(run, tmp_path)["bench.json"].read_text())
    assert data["incomplete"] is True and data["reasons"] == ["ngram: the server stopped answering"]
    assert data["results"][-1]["incomplete"] is True and data["results"][0]["incomplete"] is False
    assert "[INCOMPLETE]" in plot_figure(run)._suptitle.get_text()
    assert "INCOMPLETE" in comparison_table(run).caption


def test_no_baseline_means_no_speedup_column():
    run = make_run()
    run.levels = run.levels[2:]
    table = comparison_table(run)
    assert "speed-up" not in [c.header for c in table.columns] and "no deployment named 'baseline'" in table.caption
    assert format_bytes(None) == "-" and format_bytes(512 * 2**20, "gpu") == "512 MiB GPU"


def test_committed_json_renders_as_readme_tables(tmp_path):
    from specpipe.bench.markdown import load_table

    run = make_run()
    run.command = "specpipe bench --url baseline=h:1 --url ngram=h:2 --concurrency 1,2"
    paths = write_results(run, tmp_path / "out")
    assert json.loads(paths["bench.json"].read_text())["command"] == run.command
    text = load_table(paths["bench.json"])
    assert text.startswith(f"`{run.command}` (chat prompts, 16 new tokens")
    lines = text.splitlines()
    # baseline @1: 10.0 tok/s; ngram @1: 13.3 tok/s = 1.33x; @2: baseline 5.0, ngram 8.0 = 1.60x
    assert "| baseline | 10.0 (1.00×) | 5.0 (1.00×) |" in lines
    assert "| ngram | 13.3 (1.33×) | 8.0 (1.60×) |" in lines
    # TTFT p50 = latency / 4: baseline 250 ms @1, 750 ms @2; memory only where measured (3 GiB)
    assert "| baseline | 250 | 750 | 1.00 | 1.00 | 3,072 host-wide |" in lines
    assert any(line.startswith("| ngram | 125 | 375 |") and line.endswith("| — |") for line in lines)
    # a second run (another concurrency) joins the tables, and its command is listed
    more = make_run()
    more.command = "specpipe bench --url baseline=h:1 --url ngram=h:2 --concurrency 8"
    for level in more.levels:
        level.concurrency = 8
    merged = load_table(paths["bench.json"], write_results(more, tmp_path / "c8")["bench.json"]).splitlines()
    assert merged[0].startswith(f"`{run.command}` and `{more.command}` (chat prompts")
    assert "| deployment | concurrency 1 | concurrency 2 | concurrency 8 |" in merged


def test_the_run_records_its_command_line(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/venv/bin/specpipe", "bench", "--url", "a b=h:1"])
    run = BenchRun(settings=BenchSettings(prompts="chat", concurrencies=(1,)))
    assert run.command == "specpipe bench --url 'a b=h:1'"


def test_interleaved_table_gives_gain_and_drafting_share(tmp_path):
    from specpipe.bench.markdown import interleaved_table

    rows = [
        {"deployment": "none", "concurrency": 1, "output_tok_s": 30.0, "speedup": 1.0, "draft_lengths": {"0": 10}},
        {
            "deployment": "ngram",
            "concurrency": 1,
            "output_tok_s": 33.0,
            "speedup": 1.1,
            "draft_lengths": {"0": 6, "1": 3, "2": 1},
        },
    ]
    path = tmp_path / "interleaved.json"
    path.write_text(json.dumps({"command": "python b.py", "date": "2026-12-01", "torch": "2.13.0", "levels": rows}))
    table = interleaved_table(path)
    assert table.startswith("`python b.py` (measured 2026-12-01, torch 2.13.0):")
    assert "| ngram | 33.0 (1.10×, drafts in 40 %) |" in table and "| none | 30.0 (1.00×, drafts in 0 %) |" in table


def test_interleaved_table_marks_levels_a_lane_sat_out(tmp_path):
    from specpipe.bench.markdown import interleaved_table

    rows = [
        {"deployment": "none", "concurrency": c, "output_tok_s": 30.0 * c, "speedup": 1.0, "draft_lengths": {"0": 10}}
        for c in (1, 2)
    ]
    rows.append(
        {"deployment": "llama.cpp", "concurrency": 1, "output_tok_s": 40.0, "speedup": 1.333, "draft_lengths": {"0": 9}}
    )
    path = tmp_path / "interleaved.json"
    path.write_text(json.dumps({"command": "python b.py", "date": "2026-12-02", "torch": "2.13.0", "levels": rows}))
    table = interleaved_table(path)
    assert "| llama.cpp | 40.0 (1.33×, drafts in 0 %) | — |" in table
    assert "| none | 30.0 (1.00×, drafts in 0 %) | 60.0 (1.00×, drafts in 0 %) |" in table


def test_ngram_ceiling_table_puts_drafters_in_rows_and_prompt_sets_in_columns(tmp_path):
    from specpipe.bench.markdown import ngram_ceiling_table

    results = [
        {"prompts": p, "drafter": d, "tokens_per_forward": t, "predicted_speedup": s, "steps_drafted": 0.5}
        for p, d, t, s in [
            ("chat", "ngram k=2", 1.221, 1.115),
            ("code", "ngram k=2", 1.239, 1.126),
            ("chat", "oracle", 1.954, 1.827),
            ("code", "oracle", 2.013, 1.869),
        ]
    ]
    path = tmp_path / "ceiling.json"
    path.write_text(
        json.dumps(
            {
                "command": "python c.py",
                "date": "2026-12-01",
                "answer_tokens": 128,
                "prompts_per_set": {"chat": 24, "code": 22},
                "results": results,
            }
        )
    )
    table = ngram_ceiling_table(path).splitlines()
    assert table[0].startswith("`python c.py` (measured 2026-12-01; 128 greedy tokens per answer;")
    assert table[2] == "| drafter | chat (24 prompts) | code (22 prompts) |"
    assert table[4:] == ["| ngram k=2 | 1.22 (1.11×) | 1.24 (1.13×) |", "| oracle | 1.95 (1.83×) | 2.01 (1.87×) |"]
