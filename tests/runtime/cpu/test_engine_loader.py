"""load_engine: engine directory (manifest + checkpoints) to a working Deployment, served by the scheduler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference_decoding import greedy_reference
from tiny_models import tiny_llama

from specpipe.errors import CompatibilityError, ManifestError, SpecpipeError
from specpipe.generation.api import SamplingParams
from specpipe.manifest import Manifest, Part, write_manifest
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.speculative import Runtime, SpeculativeSettings

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
    draft_part = None
    if draft is not None:
        (engine_dir / "draft").symlink_to(checkpoints / draft)
        draft_part = Part(preset="tiny", method="draft-model", source={}, path="draft")
    write_manifest(
        engine_dir,
        Manifest(
            name="tiny",
            runtime=Runtime.CPU,
            inputs_hash="",
            target=Part(preset="tiny", source={}, path="target"),
            draft=draft_part,
            speculative=SpeculativeSettings.from_json(speculative),
        ),
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
    assert manifest.speculative.to_json() == speculative
    assert isinstance(engine.drafter, drafter_type)
    assert engine.max_draft_len == speculative["max_draft_len"]
    if drafter_type is NgramDrafter:
        assert engine.drafter.max_matching_ngram_size == 2
    target = engine.target.model
    assert not target.training and next(target.parameters()).dtype == torch.float32
    tokens, _ = generate_all(solo_scheduler(engine), PROMPT, SamplingParams(max_tokens=12))
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


def test_unsupported_method(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "lookahead", "max_draft_len": 3})
    with pytest.raises(SpecpipeError, match="not supported by the CPU runtime"):
        load_engine(engine_dir)


def test_manifest_without_a_method_is_refused(tmp_path, checkpoints):
    engine_dir = write_engine(tmp_path, checkpoints, {"method": "none", "max_draft_len": 0})
    data = json.loads((engine_dir / "manifest.json").read_text())
    data["speculative"]["method"] = None  # written by hand: the typed manifest cannot hold it
    write_manifest(engine_dir, data)
    with pytest.raises(ManifestError, match="speculative settings are not valid.*specpipe build --force"):
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
