"""Weight-only int8 / int4 CPU engines (manifest ``quantization``): every linear layer of the target and
the drafts is quantized at load, and each speculative method's greedy output equals the quantized
baseline's, token for token (tiny models; SmolLM2 in test_quantized_smollm2.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference_decoding import greedy_reference
from tiny_heads import random_heads
from tiny_models import tiny_llama

from specpipe import heads_format
from specpipe.errors import ManifestError
from specpipe.generation.api import SamplingParams
from specpipe.manifest import Manifest, Part, write_manifest
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.prepack import PrepackedLinear
from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.speculative import Method, Runtime, SpeculativeSettings
from specpipe.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = ([3, 4, 5, 3, 4, 5, 3], [9, 1, 17, 33, 2], [50, 50, 50, 12])
SCHEMES = ("int8-wo", "int4-wo")
TREE = [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 1]]
SPECULATIVE = {
    "none": SpeculativeSettings(Method.NONE, max_draft_len=0),
    "ngram": SpeculativeSettings(Method.NGRAM, max_draft_len=4, max_matching_ngram_size=2),
    "draft-model": SpeculativeSettings(Method.DRAFT_MODEL, max_draft_len=3),
    "medusa": SpeculativeSettings(Method.MEDUSA, max_draft_len=6, tree=Tree.parse(TREE)),
    "eagle": SpeculativeSettings(Method.EAGLE, max_draft_len=6, tree=Tree.parse(TREE)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    target = tiny_llama(seed=6, tie_word_embeddings=True)
    target.save_pretrained(root / "target")
    target.save_pretrained(root / "draft-model")  # the target as its own draft: its proposals get accepted
    eagle, medusa = random_heads(target, 2)
    meta = {"hidden_size": 32, "vocab_size": 64, "num_heads": 3, "num_layers": 1}
    for method, tensors in (("medusa", medusa.state_dict_flat()), ("eagle", dict(eagle.state_dict()))):
        heads_format.save_compact(root / method, method, {**tensors, "draft_vocab": torch.arange(0, 64, 2)}, meta)
    return root


def write_engine(root: Path, checkpoints: Path, method: str, quantization: str | None) -> Path:
    engine_dir = root / f"{method}-{quantization or 'fp32'}"
    engine_dir.mkdir()
    (engine_dir / "target").symlink_to(checkpoints / "target")
    draft = None
    if method in ("draft-model", "medusa", "eagle"):
        (engine_dir / "draft").symlink_to(checkpoints / method)
        draft = Part(preset=method, method=method, source={}, path="draft")
    write_manifest(
        engine_dir,
        Manifest(
            name="tiny",
            runtime=Runtime.CPU,
            inputs_hash="",
            target=Part(preset="tiny", source={}, path="target"),
            draft=draft,
            speculative=SPECULATIVE[method],
            quantization=quantization,
        ),
    )
    return engine_dir


def greedy(engine, prompt, n=24) -> list[int]:
    return generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=n))[0]


def linear_kinds(module: torch.nn.Module) -> set[str]:
    kinds = {type(m).__name__ for m in module.modules() if isinstance(m, (torch.nn.Linear, PrepackedLinear))}
    return kinds | {m.scheme for m in module.modules() if isinstance(m, QuantizedLinear)}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_method_matches_the_quantized_baseline(scheme, checkpoints, tmp_path):
    baseline, manifest = load_engine(write_engine(tmp_path, checkpoints, "none", scheme))
    assert manifest.quantization == scheme
    target = baseline.target.model
    assert linear_kinds(target) == {scheme}  # fused qkv, o, gate_up, down and the lm_head: all quantized
    assert isinstance(target.lm_head, QuantizedLinear)
    assert target.get_input_embeddings().weight.dtype == torch.float32  # the embedding stays as loaded
    expected = [greedy(baseline, p) for p in PROMPTS]
    # the quantized model itself, recomputed from scratch each token (transformers' forward, no cache)
    assert expected == [greedy_reference(target, p, 24) for p in PROMPTS]
    fp32, _ = load_engine(write_engine(tmp_path, checkpoints, "none", None))
    assert [greedy(fp32, p) for p in PROMPTS] != expected  # the quantization changed the model
    for method in ("ngram", "draft-model", "medusa", "eagle"):
        engine, _ = load_engine(write_engine(tmp_path, checkpoints, method, scheme))
        drafter = engine.drafter
        if method == "draft-model":
            assert linear_kinds(drafter.lm.model) == {scheme}
        if method in ("medusa", "eagle"):
            assert engine.tree
            modules = [v for v in vars(drafter).values() if isinstance(v, torch.nn.Module)]
            assert modules and all(linear_kinds(m) == {scheme} for m in modules)
            assert isinstance(drafter.lm._packed, QuantizedLinear) and drafter.lm.size == 32
        accepted = 0
        for prompt, want in zip(PROMPTS, expected):
            tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=24))
            assert tokens == want, (method, prompt)
            accepted += stats.total_accepted_draft_tokens
        if method in ("ngram", "draft-model"):  # random heads may propose nothing the target accepts
            assert accepted > 0, method


@pytest.mark.parametrize("scheme", SCHEMES)
def test_batched_forward_rows_do_not_depend_on_the_batch(scheme, checkpoints, tmp_path):
    """Exact entries (batch-invariant attention) through quantized layers: a request's logits are bitwise
    the same alone and beside three others."""
    engine, _ = load_engine(write_engine(tmp_path, checkpoints, "none", scheme))
    lm = BatchedLM(engine.target.model, max_batch_size=4)
    assert lm.argmax_screen is None  # greedy rows take the argmax of the quantized lm_head itself
    slots = [lm.allocate() for _ in range(4)]
    prompts = [[5, 9, 13], [2, 7], [40, 41, 42, 43], [1]]
    lm.hidden([BatchEntry(s, p) for s, p in zip(slots, prompts)])
    alone = []
    for slot, token in zip(slots, (3, 4, 5, 6)):
        alone.append(lm.project(lm.hidden([BatchEntry(slot, [token, token + 1], exact=True)])))
        lm.truncate(slot, len(prompts[slot]))
    together = lm.project(lm.hidden([BatchEntry(s, [t, t + 1], exact=True) for s, t in zip(slots, (3, 4, 5, 6))]))
    assert torch.equal(together, torch.cat(alone))


def test_a_quantization_the_cpu_runtime_does_not_run_is_refused(checkpoints, tmp_path):
    engine_dir = write_engine(tmp_path, checkpoints, "none", None)
    data = json.loads((engine_dir / "manifest.json").read_text())
    (engine_dir / "manifest.json").write_text(json.dumps({**data, "quantization": "fp8"}))
    with pytest.raises(ManifestError, match="quantization 'fp8' is not run by the CPU runtime.*int8-wo or int4-wo"):
        load_engine(engine_dir)
