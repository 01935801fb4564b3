"""load_engine: engine directory (manifest + checkpoints) to a working SpeculativeEngine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specpipe import __version__
from specpipe.errors import CompatibilityError, ManifestError, SpecpipeError
from specpipe.manifest import FORMAT_VERSION, write_manifest
from specpipe.runtime.cpu.api import SamplingParams
from specpipe.runtime.cpu.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.reference import greedy_reference
from specpipe.runtime.cpu.tiny import tiny_llama

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = [3, 4, 5, 3, 4, 5, 3]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    tiny_llama(seed=0).save_pretrained(root / "target")
    tiny_llama(seed=1, num_layers=1).save_pretrained(root / "draft")
    tiny_llama(seed=2, vocab_size=80).save_pretrained(root / "other-vocab")
    return root


def write_engine(tmp_path: Path, checkpoints: Path, speculative: dict, draft: str | None = None) -> Path:
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    (engine_dir / "target").symlink_to(checkpoints / "target")
    draft_entry = None
    if draft is not None:
        (engine_dir / "draft").symlink_to(checkpoints / draft)
        draft_entry = {"preset": "tiny", "kind": "draft-model", "source": {}, "path": "draft", "files": {}}
    write_manifest(
        engine_dir,
        {
            "format_version": FORMAT_VERSION,
            "specpipe_version": __version__,
            "name": "tiny",
            "runtime": "cpu",
            "target": {"preset": "tiny", "source": {}, "path": "target", "files": {}},
            "draft": draft_entry,
            "speculative": speculative,
        },
    )
    return engine_dir


@pytest.mark.parametrize(
    "speculative, draft, drafter_type",
    [
        ({"method": "none", "max_draft_len": 0}, None, NoDrafter),
        ({"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 2}, None, NgramDrafter),
        ({"method": "draft-model", "max_draft_len": 3}, "draft", DraftModelDrafter),
    ],
)
def test_loads_a_working_engine(speculative, draft, drafter_type, tmp_path, checkpoints):
    engine, manifest = load_engine(write_engine(tmp_path, checkpoints, speculative, draft))
    assert manifest["speculative"] == speculative
    assert isinstance(engine.drafter, drafter_type)
    assert engine.max_draft_len == speculative["max_draft_len"]
    if drafter_type is NgramDrafter:
        assert engine.drafter.max_matching_ngram_size == 2
    target = engine.target.model
    assert not target.training and next(target.parameters()).dtype == torch.float32
    tokens, _ = engine.generate_all(PROMPT, SamplingParams(max_tokens=12))
    assert tokens == greedy_reference(target, PROMPT, 12)


def test_missing_target_checkpoint(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "none", "max_draft_len": 0})
    (engine_dir / "target").unlink()
    with pytest.raises(SpecpipeError, match=r"target checkpoint .*target.*specpipe build --force"):
        load_engine(engine_dir)


def test_corrupt_weights(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "none", "max_draft_len": 0})
    (engine_dir / "target").unlink()
    (engine_dir / "target").mkdir()
    (engine_dir / "target" / "config.json").write_bytes((checkpoints / "target" / "config.json").read_bytes())
    (engine_dir / "target" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SpecpipeError, match="cannot be loaded.*specpipe build --force"):
        load_engine(engine_dir)


def test_missing_draft_checkpoint(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "draft-model", "max_draft_len": 3}, "draft")
    (engine_dir / "draft").unlink()
    with pytest.raises(SpecpipeError, match="draft checkpoint"):
        load_engine(engine_dir)


@pytest.mark.parametrize("method", ["lookahead", None])
def test_unsupported_method(method, tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": method, "max_draft_len": 3})
    with pytest.raises(SpecpipeError, match="not supported by the CPU runtime"):
        load_engine(engine_dir)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_head_method_without_draft_entry(method, tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": method, "max_draft_len": 3})
    with pytest.raises(ManifestError, match=f"method '{method}' needs a 'draft' entry"):
        load_engine(engine_dir)


def test_draft_model_method_without_draft_entry(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "draft-model", "max_draft_len": 3})
    with pytest.raises(ManifestError, match="'draft' entry"):
        load_engine(engine_dir)


def test_draft_with_another_vocabulary(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "draft-model", "max_draft_len": 3}, "other-vocab")
    with pytest.raises(CompatibilityError, match="vocabulary"):
        load_engine(engine_dir)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError):
        load_engine(tmp_path)
