"""``specpipe tune`` for real: rebuild, serve and measure a tiny n-gram engine per draft length, record the best."""

import json

import pytest
from click.testing import CliRunner
from tiny_presets import write_tiny_presets

from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.cli import main

pytestmark = pytest.mark.e2e


def test_tune_measures_each_length_and_the_next_build_uses_the_best(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_PRESETS", str(write_tiny_presets(tmp_path / "presets")))
    engines = tmp_path / "engines"
    build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=engines))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1 2 3 4 5 6 1 2 3"}\n{"prompt": "The quick brown fox"}\n')
    result = CliRunner().invoke(
        main,
        [
            *"tune tiny-ngram --engines-dir".split(),
            str(engines),
            "--prompts",
            str(prompts),
            *"--max-draft-len 1,3 --num-requests 2 --max-tokens 8".split(),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│ k")]
    assert len(rows) == 2 and sum("best" in row for row in rows) == 1

    record = json.loads((engines / "tiny-ngram.tuned.json").read_text())
    assert (record["target"], record["draft"], record["method"]) == ("tiny", "ngram", "ngram")
    assert [p["max_draft_len"] for p in record["curve"]] == [1, 3]
    for entry in record["curve"]:
        assert entry["error"] is None and entry["completed"] == 2 and entry["output_token_throughput"] > 0
        assert entry["acceptance_rate"] is None or 0.0 <= entry["acceptance_rate"] <= 1.0
    fastest = max(record["curve"], key=lambda p: p["output_token_throughput"])
    assert record["best"] == {"max_draft_len": fastest["max_draft_len"]}
    assert record["measured_with"] == {
        "prompts": str(prompts),
        "concurrency": 1,
        "max_tokens": 8,
        "num_requests": 2,
        "warmup": 1,
    }
    assert not (engines / ".tune-tiny-ngram").exists()  # candidates' engines, repositories and logs removed

    engine = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=engines))
    assert (
        json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == fastest["max_draft_len"]
    )
