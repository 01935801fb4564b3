"""``specpipe build --runtime cpu`` on a tiny local target: manifest, skipping, atomicity, checks."""

import json

import pytest
from tiny_engine import make_tiny_engine
from tiny_presets import ARCH, write_tiny_presets

from specpipe.build_cpu import build_cpu
from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, PresetError, SpecpipeError
from specpipe.manifest import sha256_file


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    root = write_tiny_presets(tmp_path_factory.mktemp("presets"))
    (root / "drafts" / "tiny-draft.toml").write_text(
        'kind = "draft-model"\nfor_targets = ["tiny"]\n[source]\nkind = "truncate-target"\nnum_layers = 1\n'
        "[speculative]\nmax_draft_len = 3\n"
    )
    (root / "drafts" / "too-deep.toml").write_text(
        'kind = "draft-model"\n[source]\nkind = "truncate-target"\nnum_layers = 2\n[speculative]\nmax_draft_len = 3\n'
    )
    return root


@pytest.fixture
def build(presets, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_PRESETS", str(presets))

    def run(draft, **kwargs):
        return build_cpu(BuildRequest(target="tiny", draft=draft, engines_dir=tmp_path / "engines", **kwargs))

    return run


def test_manifest_records_sources_hashes_and_settings(build):
    engine = build("tiny-draft")
    assert engine.name == "tiny-tiny-draft"
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["runtime"] == "cpu" and manifest["specpipe_version"] == "0.1.0"
    assert manifest["speculative"] == {"method": "draft-model", "max_draft_len": 3}
    assert manifest["target"]["source"]["kind"] == "local"
    for part in ("target", "draft"):
        files = manifest[part]["files"]
        assert "model.safetensors" in files and "tokenizer.json" in files
        for rel, digest in files.items():
            assert sha256_file(engine / manifest[part]["path"] / rel) == digest
    draft_config = json.loads((engine / "draft" / "config.json").read_text())
    assert draft_config["num_hidden_layers"] == 1
    assert [p.name for p in engine.parent.iterdir()] == ["tiny-tiny-draft"]


def test_same_inputs_skip_and_changed_inputs_rebuild(build, capsys):
    engine = build("ngram")
    first = (engine / "manifest.json").read_text()
    build("ngram")
    assert (engine / "manifest.json").read_text() == first
    assert "nothing rebuilt" in capsys.readouterr().err
    build("ngram", max_draft_len=7)
    assert json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == 7


def test_file_changed_on_disk_is_rebuilt(build, capsys):
    engine = build("none")
    weights = engine / "target" / "model.safetensors"
    good = sha256_file(weights)
    weights.unlink()
    weights.write_bytes(b"corrupt")
    build("none")
    assert "missing or changed" in capsys.readouterr().err
    assert sha256_file(engine / "target" / "model.safetensors") == good


def test_interrupted_build_leaves_nothing_and_keeps_old_engine(build, monkeypatch):
    engine = build("tiny-draft")
    before = (engine / "manifest.json").read_text()

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("specpipe.build_cpu_drafts.truncate_target", boom)
    with pytest.raises(KeyboardInterrupt):
        build("tiny-draft", force=True)
    assert [p.name for p in engine.parent.iterdir()] == ["tiny-tiny-draft"]
    assert (engine / "manifest.json").read_text() == before


def test_truncation_must_leave_a_smaller_model(build, tmp_path):
    with pytest.raises(PresetError, match="between 1 and 1"):
        build("too-deep")
    assert list((tmp_path / "engines").iterdir()) == []


def test_draft_model_with_other_vocabulary_is_refused(build, tmp_path):
    other = make_tiny_engine(tmp_path / "other", "o") / "target"
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] += 5
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompatibilityError, match="draft vocabulary .* differs from the target's"):
        build("tiny-draft", draft_model=str(other))
    assert list((tmp_path / "engines").iterdir()) == []


def test_missing_local_checkpoint(presets, tmp_path, monkeypatch):
    target = tmp_path / "gone.toml"
    target.write_text(f'name = "gone"\n[source]\nkind = "local"\npath = "{tmp_path / "nowhere"}"\n{ARCH}')
    with pytest.raises(SpecpipeError, match="does not exist"):
        build_cpu(BuildRequest(target=str(target), draft="ngram", engines_dir=tmp_path / "engines"))


def test_corrupt_cached_checkpoint_is_named(tmp_path, monkeypatch):
    from specpipe.models import fetch

    final = tmp_path / "ckpt"
    fetch._write_cache_entry(final, lambda d: (d / "model.safetensors").write_bytes(b"weights"))
    assert fetch.verify_cached_checkpoint(final) == {"model.safetensors": sha256_file(final / "model.safetensors")}
    (final / "model.safetensors").write_bytes(b"truncat")
    with pytest.raises(SpecpipeError, match="model.safetensors is corrupt .* delete"):
        fetch.verify_cached_checkpoint(final)


def test_draft_length_beyond_what_the_cpu_runtime_verifies_is_refused(build, presets, tmp_path):
    from specpipe.build_cpu_settings import CPU_MAX_DRAFT_LEN
    from specpipe.runtime.cpu.scheduler.forward_cost import MEASURED_TOKENS

    assert CPU_MAX_DRAFT_LEN == max(MEASURED_TOKENS)  # the forward cost is measured up to this many tokens
    (presets / "drafts" / "long-draft.toml").write_text(
        'kind = "draft-model"\nfor_targets = ["tiny"]\n[source]\nkind = "truncate-target"\nnum_layers = 1\n'
        f"[speculative]\nmax_draft_len = {CPU_MAX_DRAFT_LEN + 1}\n"
    )
    with pytest.raises(PresetError, match=f"the draft preset's max_draft_len {CPU_MAX_DRAFT_LEN + 1} is more than"):
        build("long-draft")
    engine = build("ngram", max_draft_len=CPU_MAX_DRAFT_LEN)
    assert json.loads((engine / "manifest.json").read_text())["speculative"]["max_draft_len"] == CPU_MAX_DRAFT_LEN
    assert not (tmp_path / "engines" / "tiny-long-draft").exists()
