"""EAGLE-3 heads on the CPU runtime, on tiny random 6-layer targets: the target hands over the captured
layers' outputs in the forward it runs anyway (one-sequence and batched paths agree with transformers'
own hidden states), the drafter serves through the tree engine, the batch scheduler and an engine
directory, and greedy output stays identical to plain decoding."""

import pytest
import torch
from batch_helpers import prompts, run_batch
from tiny_models import tiny_llama

from specpipe import heads_format
from specpipe.errors import SpecpipeError
from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import NoDrafter
from specpipe.runtime.cpu.drafters.eagle3 import Eagle3TreeDrafter
from specpipe.runtime.cpu.drafters.eagle3_head import Eagle3Head, capture_layers
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.cached_lm import CachedLM
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.tree import Tree

TREE = Tree.parse([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


def random_head(model, seed=0, vocab_step=2):
    vocab = torch.arange(0, model.config.vocab_size, vocab_step)
    head = Eagle3Head(EagleConfig.from_target(model.config), capture_layers(model.config.num_hidden_layers), vocab)
    g = torch.Generator().manual_seed(seed)
    head.reset_parameters(model.lm_head.weight, std=0.3, generator=g)
    return head.eval()


def baseline(model, prompt, n):
    return generate_all(solo_scheduler(Deployment(model, NoDrafter(), 0)), prompt, SamplingParams(max_tokens=n))[0]


def test_captured_layers_are_tensorrt_llms_defaults():
    assert capture_layers(30) == (1, 14, 26)  # SmolLM2-135M
    assert capture_layers(32) == (1, 15, 28)  # Llama-3.1-8B
    assert capture_layers(6) == (1, 2, 2)
    with pytest.raises(SpecpipeError, match="only 5 decoder layers"):
        capture_layers(5)


def test_targets_hand_over_the_captured_layers_in_the_same_forward():
    model = tiny_llama(1, vocab_size=64, num_layers=6)
    ids = [5, 9, 13, 2, 7, 30, 31]
    with torch.no_grad():
        ref = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    layers = (1, 2, 3)
    expected = torch.cat([ref.last_hidden_state[0], *(ref.hidden_states[i + 1][0] for i in layers)], -1)
    lm = CachedLM(model)
    lm.capture_layers = layers
    wide = lm.hidden(ids)
    assert wide.shape == (7, 4 * 32)
    torch.testing.assert_close(wide, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lm.project(wide), model.lm_head(ref.last_hidden_state[0]), rtol=1e-5, atol=1e-5)
    batched = BatchedLM(model, 2, capture_layers=layers)
    slot = batched.allocate()
    rows = batched.hidden([BatchEntry(slot, ids)])
    torch.testing.assert_close(rows, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(batched.project(rows).argmax(-1), model.lm_head(ref.last_hidden_state[0]).argmax(-1))
    assert not torch.allclose(expected[:, 32:64], expected[:, 96:])  # distinct layers, not one copied


def test_drafter_reads_the_fused_features_and_refuses_narrow_ones():
    model = tiny_llama(2, vocab_size=64, num_layers=6)
    head = random_head(model)
    drafter = Eagle3TreeDrafter(head, model.model.embed_tokens.weight, TREE)
    assert drafter.capture_layers == (1, 2, 2)
    ids = [4, 8, 15, 16, 23]
    lm = CachedLM(model)
    lm.capture_layers = drafter.capture_layers
    wide = lm.hidden(ids)
    token = int(lm.project(wide[-1:]).argmax())
    drafter.reset(ids)
    drafter.commit(ids + [token], wide)
    tree = drafter.propose(ids + [token], 7, 3)
    # The first draft is the head's own argmax over fc(fused features), computed here by hand.
    with torch.no_grad():
        embeds = model.model.embed_tokens.weight[torch.tensor(ids[1:] + [token])][None]
        out, _, _ = head(wide[None, :, 32:], embeds, torch.arange(5))
        first = int(head.to_target_ids(head.logits(out[0, -1]).argmax()))
    assert tree.tokens[0] == first and len(tree.tokens) == 7
    drafter.reset(ids)
    with pytest.raises(SpecpipeError, match="captured hidden states"):
        drafter.commit(ids, wide[:, :32])


@pytest.mark.parametrize("dynamic", [False, True])
def test_greedy_output_identical_to_plain_decoding(dynamic):
    model = tiny_llama(3, vocab_size=64, num_layers=6)
    head = random_head(model, seed=4, vocab_step=1)
    drafter = Eagle3TreeDrafter(
        head, model.model.embed_tokens.weight, None if dynamic else TREE, dynamic=dynamic, top_k=3, depth=3
    )
    engine = Deployment(model, drafter, 8 if dynamic else 7)
    assert engine.target.capture_layers == (1, 2, 2)
    for prompt in prompts(4, seed=2):
        tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=24))
        assert tokens == baseline(model, prompt, 24)
        assert stats.total_draft_tokens > 0
    outs = run_batch(engine, [(p, SamplingParams(max_tokens=16)) for p in prompts(4, seed=3)], max_batch_size=4)
    for out, prompt in zip(outs, prompts(4, seed=3)):
        assert out.error is None and out.tokens == baseline(model, prompt, 16)


def test_engine_directory_serves_an_eagle3_head(tmp_path):
    from specpipe.manifest import Manifest, Part, write_manifest
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.speculative import Method, Runtime, SpeculativeSettings

    model = tiny_llama(6, vocab_size=64, num_layers=6)
    model.save_pretrained(tmp_path / "engine" / "target")
    head = random_head(model, seed=5)
    tensors = {**head.state_dict(), "draft_vocab": head.draft_vocab}
    meta = {"hidden_size": 32, "vocab_size": 64, "num_layers": 1, "style": "eagle3", "capture_layers": [1, 2, 2]}
    heads_format.save_compact(tmp_path / "engine" / "draft", "eagle", tensors, meta)
    assert heads_format.compact_style(tmp_path / "engine" / "draft" / "eagle_heads.safetensors") == "eagle3"
    speculative = SpeculativeSettings(Method.EAGLE, max_draft_len=7, tree=TREE)
    manifest = Manifest(
        name="tiny",
        runtime=Runtime.CPU,
        inputs_hash="",
        speculative=speculative,
        target=Part(preset="tiny", source={}, path="target"),
        draft=Part(preset="eagle", method="eagle", source={}, path="draft"),
    )
    write_manifest(tmp_path / "engine", manifest)
    engine, _ = load_engine(tmp_path / "engine", draft_dtype="float32")
    assert isinstance(engine.drafter, Eagle3TreeDrafter)
    prompt = [5, 9, 13, 2, 7]
    tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=20))
    assert tokens == baseline(model, prompt, 20) and stats.total_draft_tokens > 0
    del meta["capture_layers"]
    heads_format.save_compact(tmp_path / "engine" / "draft", "eagle", tensors, meta)
    with pytest.raises(SpecpipeError, match="without its draft vocabulary or captured layers"):
        load_engine(tmp_path / "engine")
