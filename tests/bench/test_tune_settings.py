"""``specpipe tune`` without a server: candidates, the best pick, the tuning record and the next build using it."""

import json

import click
import pytest
from tiny_presets import write_tiny_presets

from specpipe.bench.tune import best_of, candidates_for
from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.cli.options import PositiveIntList
from specpipe.errors import SpecpipeError
from specpipe.speculative import SpeculativeSettings
from specpipe.tree import Tree
from specpipe.tuned import apply_tuned, read_tuned, tuned_path, write_tuned


def settings(block):
    return SpeculativeSettings.from_json(block)


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """A local tiny target preset ``tiny`` (pairs with the shipped ``ngram`` draft)."""
    return write_tiny_presets(tmp_path_factory.mktemp("presets"))


def test_lengths_and_linear_candidates():
    assert PositiveIntList().convert("1,2,2,8", None, None) == (1, 2, 8)
    with pytest.raises(click.BadParameter, match="must list positive integers"):
        PositiveIntList().convert("1,0", None, None)
    found = candidates_for(settings({"method": "ngram", "max_draft_len": 5}), (1, 4))
    assert [(c.label, c.max_draft_len, c.tree) for c in found] == [("k1", 1, None), ("k4", 4, None)]
    with pytest.raises(SpecpipeError, match="baseline"):
        candidates_for(settings({"method": "none"}), (1,))
    with pytest.raises(SpecpipeError, match="cannot tune method 'lookahead'"):
        candidates_for(settings({"method": "lookahead"}), (1,))


def test_tree_candidates_cut_the_tree_and_add_chains():
    tree = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert Tree.parse(tree).truncate(4).paths == ((0,), (1,), (2,), (0, 0))
    found = candidates_for(settings({"method": "medusa", "choices": tree, "num_medusa_heads": 2}), (1, 3))
    assert [c.label for c in found] == ["tree-1", "tree-3"]  # chain-1 is tree-1; chain-3 is deeper than the 2 heads
    eagle = candidates_for(settings({"method": "eagle", "choices": tree}), (2, 3))
    assert [c.label for c in eagle] == ["tree-2", "chain-2", "tree-3", "chain-3"]
    assert eagle[3].tree.paths == ((0,), (0, 0), (0, 0, 0)) and eagle[3].setting() == {
        "max_draft_len": 3,
        "choices": [[0], [0, 0], [0, 0, 0]],
    }


def test_best_is_the_fastest_clean_setting():
    curve = [
        {"label": "a", "output_token_throughput": 10.0, "errors": 0, "error": None},
        {"label": "b", "output_token_throughput": 30.0, "errors": 1, "error": None},
        {"label": "c", "error": "failed to load"},
        {"label": "d", "output_token_throughput": 12.5, "errors": 0, "error": None},
    ]
    assert best_of(curve)["label"] == "d"
    assert best_of(curve[1:3]) is None


def test_record_round_trip_and_checks(tmp_path):
    path = tuned_path(tmp_path, "tiny-ngram")
    assert path.name == "tiny-ngram.tuned.json" and read_tuned(path) is None
    write_tuned(
        path,
        target="tiny",
        draft="ngram",
        method="ngram",
        best={"max_draft_len": 3},
        curve=[{"label": "k3"}],
        measured_with={"prompts": "chat"},
    )
    record = read_tuned(path)
    assert record["best"] == {"max_draft_len": 3} and record["curve"] == [{"label": "k3"}] and record["format"] == 1
    path.write_text("{not json")
    with pytest.raises(SpecpipeError, match="cannot read the tuning record .*delete it or rerun 'specpipe tune'"):
        read_tuned(path)
    path.write_text(json.dumps({"format": 1, "best": {"max_draft_len": 0}}))
    with pytest.raises(SpecpipeError, match="is not a specpipe tuning record"):
        read_tuned(path)


def test_apply_fills_only_unset_settings_for_the_same_engine(tmp_path):
    request = BuildRequest(target="tiny", draft="eagle", engines_dir=tmp_path)
    write_tuned(
        tuned_path(tmp_path, "tiny-eagle"),
        target="tiny",
        draft="eagle",
        method="eagle",
        best={"max_draft_len": 2, "choices": [[0], [0, 0]]},
        curve=[],
        measured_with={},
    )
    tuned = apply_tuned(request, "tiny", "eagle")
    assert tuned.max_draft_len == 2 and tuned.choices == Tree(((0,), (0, 0)))  # a tree, not JSON text
    explicit = BuildRequest(target="tiny", draft="eagle", engines_dir=tmp_path, max_draft_len=5)
    assert apply_tuned(explicit, "tiny", "eagle") is explicit
    assert apply_tuned(request, "other", "eagle") is request  # recorded for another target: ignored
    renamed = BuildRequest(target="tiny", draft="eagle", engines_dir=tmp_path, name="mine")
    assert apply_tuned(renamed, "tiny", "eagle") is renamed  # no record for that engine name


def test_next_build_uses_the_recorded_draft_length(presets, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_PRESETS", str(presets))
    engines = tmp_path / "engines"
    engine = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=engines))
    assert json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == 5  # the preset's
    write_tuned(
        tuned_path(engines, "tiny-ngram"),
        target="tiny",
        draft="ngram",
        method="ngram",
        best={"max_draft_len": 2},
        curve=[],
        measured_with={},
    )
    engine = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=engines))
    assert json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == 2
    engine = build_cpu(BuildRequest(target="tiny", draft="ngram", engines_dir=engines, max_draft_len=4))
    assert json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == 4  # the flag wins
