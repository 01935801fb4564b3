"""One copy of the weights: after loading, a CPU engine's tensors hold each weight once (the prepacked
linear layers, plus the embedding that a tied lm_head's packed copy is made from), and none of them still
views the checkpoint file's memory map (which kept every page prepacking read resident)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_engine import make_tiny_engine
from tiny_models import tiny_llama

from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter
from specpipe.runtime.cpu.drafters.reduced_draft import ReducedVocabDraftModelDrafter
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.prepack import PrepackedLinear, prepack_available
from specpipe.runtime.cpu.model.weights_memory import own_memory, tensor_bytes

pytestmark = pytest.mark.usefixtures("single_thread")


def reachable_roots(obj, seen: set[int] | None = None) -> list[torch.nn.Module | torch.Tensor]:
    """The modules and tensors reachable from ``obj`` through attributes, lists and dicts (target,
    drafter, heads, caches), each once; a module is not looked into."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, (torch.Tensor, torch.nn.Module)):
        return [obj]
    if isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = list(vars(obj).values())
    else:
        return []
    return [root for child in children for root in reachable_roots(child, seen)]


def engine_modules(engine) -> list[torch.nn.Module]:
    """Every module reachable from ``engine``, submodules included."""
    return [
        module for root in reachable_roots(engine) if isinstance(root, torch.nn.Module) for module in root.modules()
    ]


def engine_tensors(engine) -> list[torch.Tensor]:
    """Every tensor reachable from ``engine``: outside modules, and the parameters, buffers and tensor
    attributes of every module."""
    found = [root for root in reachable_roots(engine) if isinstance(root, torch.Tensor)]
    for module in engine_modules(engine):
        found += list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        found += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    return found


def file_mappings(paths: list[Path]) -> list[tuple[int, int]]:
    """Address ranges of this process's memory maps of ``paths`` (``/proc/self/maps``)."""
    names = {str(p.resolve()) for p in paths}
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] in names:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def check_one_copy(engine_dir: Path, engine) -> None:
    tensors = engine_tensors(engine)
    files = sorted(engine_dir.rglob("*.safetensors"))
    mapped = file_mappings(files)
    for tensor in tensors:
        if not tensor.is_mkldnn:
            address = tensor.untyped_storage().data_ptr()
            assert not any(start <= address < end for start, end in mapped), (
                f"a tensor {tuple(tensor.shape)} {tensor.dtype} still views a checkpoint file"
            )
    target = engine.target.model
    assert not any(type(m) is torch.nn.Linear for m in target.modules()), "an nn.Linear was left unpacked"
    from safetensors import safe_open

    weight_bytes = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            weight_bytes += sum(_numel(f.get_slice(k).get_shape()) * 4 for k in f.keys())
    drafter = engine.drafter
    models = [target] + ([drafter.lm.model] if isinstance(drafter, DraftModelDrafter) else [])
    allowed = weight_bytes
    for model in models:  # a tied lm_head: the dense embedding (for lookups) and the packed lm_head (for matmuls)
        if model.config.tie_word_embeddings and isinstance(model.lm_head, PrepackedLinear):
            allowed += model.lm_head.out_features * model.lm_head.in_features * 4
    lm = getattr(drafter, "lm", None)
    if isinstance(lm, ReducedLMHead):
        assert lm.weight is None, "the reduced draft lm_head kept its dense copy beside the packed one"
        allowed += lm.size * target.config.hidden_size * 4  # rows copied out of the lm_head
    if isinstance(drafter, ReducedVocabDraftModelDrafter):
        allowed += drafter._weight.numel() * 4  # the draft's lm_head rows over its draft vocabulary
    packed_sizes = {
        id(m.weight): m.in_features * m.out_features * m.weight.element_size()
        for m in engine_modules(engine)
        if isinstance(m, PrepackedLinear) and m.weight is not None
    }
    held = tensor_bytes(tensors, packed_sizes)
    assert held <= allowed * 1.02, f"the engine holds {held / 2**20:.0f} MiB for {allowed / 2**20:.0f} MiB of weights"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def test_own_memory_keeps_tied_weights_tied_and_skips_linear_only_weights():
    model = tiny_llama()
    model.lm_head.weight = model.model.embed_tokens.weight
    linear = model.model.layers[0].mlp.up_proj.weight
    before_linear, before_embed = linear.data_ptr(), model.model.embed_tokens.weight.data_ptr()
    own_memory(model, skip_prepackable=True)
    assert linear.data_ptr() == before_linear  # left for prepacking to replace
    assert model.model.embed_tokens.weight.data_ptr() != before_embed  # copied: also held by the embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.skipif(not prepack_available(), reason="this PyTorch build has no oneDNN backend")
def test_tiny_engine_holds_one_copy(tmp_path):
    engine_dir = make_tiny_engine(tmp_path)
    engine, _ = load_engine(engine_dir)
    check_one_copy(engine_dir, engine)


@pytest.mark.model
@pytest.mark.skipif(not prepack_available(), reason="this PyTorch build has no oneDNN backend")
@pytest.mark.parametrize("draft", ["none", "eagle", "medusa", "smollm2-draft"])
def test_smollm2_engine_holds_one_copy(smollm2_engines, draft):
    engine_dir = Path(smollm2_engines[draft])
    engine, _ = load_engine(engine_dir)
    check_one_copy(engine_dir, engine)


def test_growing_the_kv_cache_keeps_entries_and_hands_the_old_cache_back(monkeypatch):
    """Capacity doubles as requests grow; each growth copies every slot's entries and then trims the
    heap, so the outgrown cache's memory leaves the process instead of staying in glibc's free lists."""
    from specpipe.runtime.cpu.model import batched_lm

    trims = []
    monkeypatch.setattr(batched_lm, "trim_heap", lambda: trims.append(1))
    lm = BatchedLM(tiny_llama(0), 2, capacity=16)
    assert trims == []  # the first allocation frees nothing
    slot = lm.allocate()
    lm.hidden([BatchEntry(slot, list(range(1, 11)))])
    before = lm.keys[:, slot, :, :10].clone()
    lm.hidden([BatchEntry(slot, list(range(11, 31)))])  # 30 tokens: 16 -> 32
    assert lm.keys.shape[3] == 32 and len(trims) == 1
    assert torch.equal(lm.keys[:, slot, :, :10], before)
    lm.hidden([BatchEntry(slot, [31, 32, 33])])  # 33 tokens: 32 -> 64
    assert lm.keys.shape[3] == 64 and len(trims) == 2
