"""Tree speculation in the CPU engine: choices parsing, tree masks, KV compaction, greedy output identical
to plain decoding (Medusa, EAGLE static and dynamic trees, an oracle tree), and the sampling rule keeps
the target's distribution."""

import pytest
import torch
from tiny_heads import random_heads
from tiny_models import tiny_llama

from specpipe.errors import SpecpipeError
from specpipe.generation.api import SamplingParams
from specpipe.presets import load_draft
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.drafters import NoDrafter
from specpipe.runtime.cpu.drafters.eagle import EagleTreeDrafter
from specpipe.runtime.cpu.drafters.medusa import MedusaTreeDrafter
from specpipe.runtime.cpu.drafters.tree_drafter import StaticTree, TreeDrafter
from specpipe.runtime.cpu.scheduler.batch_request import PositionKeyedChooser
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.runtime.cpu.verify.accept import accept_block, chain_tree, follow_choices
from specpipe.runtime.cpu.verify.tree_accept import DraftTree, tree_attention
from specpipe.tree import Tree

#: The CPU tree of the eagle preset (``build/drafts/eagle.toml [cpu]``), 11 nodes.
CPU_EAGLE_CHOICES = load_draft("eagle").extra["cpu"]["choices"]


def test_choices_parse_and_order():
    assert Tree.parse("{0}, {0, 0}, {0, 0, 0}, {0, 1}").to_list() == [[0], [0, 0], [0, 0, 0], [0, 1]]
    spec = StaticTree.of(Tree.parse("[[1], [0, 0], [0]]"))
    assert spec.paths == ((0,), (1,), (0, 0))
    assert spec.parents == (-1, -1, 0) and spec.depths == (1, 1, 2) and spec.ranks == (0, 1, 0)
    assert spec.max_rank == 2 and spec.depth == 2
    assert StaticTree.of(Tree.parse(CPU_EAGLE_CHOICES)).num_nodes == 11


@pytest.mark.parametrize(
    "choices, kw, message",
    [
        ("[[0], [1, 0]]", {}, "path [1, 0] has no parent [1]"),
        ("[[0], [0]]", {}, "lists a path twice"),
        ("[[0], [0, 0], [0, 0, 0]]", {"max_depth": 2}, "3 deep, the draft has 2 draft heads"),
        ("[[0], [1], [2]]", {"max_nodes": 2}, "3 nodes, max_draft_len is 2"),
        ("[[0], [-1]]", {}, "non-negative integers"),
        ("not a tree", {}, "is not a list of paths"),
    ],
)
def test_bad_choices_are_refused(choices, kw, message):
    with pytest.raises(SpecpipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Tree.parse(choices).check(**kw)


def test_tree_mask_and_positions():
    mask, depth = tree_attention([-1, -1, 0, 2], context=3)
    assert depth.tolist() == [0, 1, 1, 2, 3]
    rows = mask[0, 0].int().tolist()
    assert rows[0] == [1, 1, 1, 1, 0, 0, 0, 0]  # root: context + itself
    assert rows[2] == [1, 1, 1, 1, 0, 1, 0, 0]  # second child of the root
    assert rows[4] == [1, 1, 1, 1, 1, 0, 1, 1]  # node 3: root, node 0, node 2, itself


def test_the_exact_rule_follows_the_targets_choices_down_the_tree():
    tree = DraftTree(tokens=[5, 7, 9, 4], parents=[-1, -1, 1, 2])
    # root's choice 7 -> node 1; node 1's choice 9 -> node 2; node 2's choice 3 (node 3 has 4) -> stop.
    best = torch.tensor([7, 0, 9, 3, 0])
    assert follow_choices(tree, best) == ([1, 2], 3)
    assert follow_choices(tree, torch.tensor([1, 0, 0, 0, 0])) == ([], 1)
    rows = []  # a choice function is asked only for the rows on the path, in order
    assert follow_choices(tree, lambda row: rows.append(row) or int(best[row])) == ([1, 2], 3) and rows == [0, 2, 3]
    assert follow_choices(chain_tree([7, 9]), [7, 9, 1]) == ([0, 1], 1)  # a chain is a one-child tree


def test_tree_sampling_preserves_the_target_distribution():
    """Two candidates for the first token, verified by the exact rule with one seed per run: the first
    committed token is distributed as the target's p, whatever was drafted."""
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = torch.stack([p, torch.full((4,), 0.25), torch.full((4,), 0.25)]).log()
    tree = DraftTree(tokens=[1, 3], parents=[-1, -1])
    params = SamplingParams(max_tokens=4, greedy=False)
    counts = torch.zeros(4)
    trials = 6000
    for seed in range(trials):
        path, token = accept_block(tree, logits, PositionKeyedChooser(params, seed), first_position=0)
        counts[tree.tokens[path[0]] if path else token] += 1
    assert torch.allclose(counts / trials, p, atol=0.02), counts / trials


class OracleDrafter(TreeDrafter):
    """Proposes a tree whose second root child starts the true greedy continuation (with a wrong sibling
    and a wrong branch), so accepted nodes must be moved in the KV cache."""

    def __init__(self, reference):
        self.reference = reference

    def propose(self, context_ids, max_nodes, max_depth, sampler=None):
        done = len(context_ids)
        truth = self.reference[done : done + 3]
        if not truth:
            return DraftTree([], [])
        tokens = [(truth[0] + 1) % 64, truth[0], (truth[0] + 2) % 64]
        parents = [-1, -1, 0]
        for t in truth[1:]:
            tokens.append(t)
            parents.append(len(tokens) - 2 if len(tokens) > 3 else 1)
        parents[3:] = [1] + list(range(3, len(tokens) - 1))
        return DraftTree(tokens, parents).prune(max_depth, max_nodes)


def _baseline(model, prompt, n):
    engine = Deployment(model, NoDrafter(), max_draft_len=0)
    tokens, _ = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=n))
    return tokens


@pytest.mark.parametrize("kind", ["oracle", "medusa", "eagle", "eagle-dynamic"])
def test_greedy_tree_output_is_identical_to_plain_decoding(kind):
    model = tiny_llama(3, vocab_size=64)
    prompt = [3, 17, 9, 41, 5, 22, 8]
    n = 40
    reference = _baseline(model, prompt, n)
    eagle, medusa = random_heads(model)
    lm = ReducedLMHead(model.lm_head.weight, torch.arange(0, 64, 2))  # half the vocabulary
    if kind == "oracle":
        drafter = OracleDrafter(prompt + reference)
    elif kind == "medusa":
        drafter = MedusaTreeDrafter(medusa, lm, Tree.parse(CPU_EAGLE_CHOICES[:10]))
    elif kind == "eagle":
        drafter = EagleTreeDrafter(eagle, model.model.embed_tokens.weight, lm, Tree.parse(CPU_EAGLE_CHOICES))
    else:
        drafter = EagleTreeDrafter(eagle, model.model.embed_tokens.weight, lm, dynamic=True, top_k=3, depth=4)
    engine = Deployment(model, drafter, max_draft_len=11)
    tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=n))
    assert tokens == reference
    assert stats.num_output_tokens == n
    if kind == "oracle":
        assert stats.total_accepted_draft_tokens >= n // 2  # the oracle path is accepted
        assert stats.target_forwards < n


def test_tree_engine_samples_with_a_seed_reproducibly():
    model = tiny_llama(4, vocab_size=64)
    eagle, _ = random_heads(model, 1)
    lm = ReducedLMHead(model.lm_head.weight)
    params = SamplingParams(max_tokens=24, greedy=False, temperature=1.0, seed=11)
    runs = []
    for _ in range(2):
        drafter = EagleTreeDrafter(eagle, model.model.embed_tokens.weight, lm, Tree.parse("[[0],[1],[0,0]]"))
        engine = Deployment(model, drafter, max_draft_len=3)
        runs.append(generate_all(solo_scheduler(engine), [1, 2, 3], params)[0])
    assert runs[0] == runs[1] and len(runs[0]) == 24


def test_medusa_tree_deeper_than_heads_is_refused():
    model = tiny_llama(0, vocab_size=64)
    _, medusa = random_heads(model)
    with pytest.raises(SpecpipeError, match="only 3 Medusa heads"):
        MedusaTreeDrafter(medusa, ReducedLMHead(model.lm_head.weight), Tree.parse("[[0],[0,0],[0,0,0],[0,0,0,0]]"))


def test_reduced_vocab_draft_model_keeps_greedy_output():
    from specpipe.runtime.cpu.drafters.reduced_draft import ReducedVocabDraftModelDrafter

    model = tiny_llama(5, vocab_size=64)
    draft = tiny_llama(5, vocab_size=64, num_layers=1)
    prompt = [4, 8, 15, 16, 23, 42]
    reference = _baseline(model, prompt, 30)
    drafter = ReducedVocabDraftModelDrafter(draft, torch.arange(0, 64, 3))
    engine = Deployment(model, drafter, max_draft_len=3)
    tokens, stats = generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=30))
    assert tokens == reference
    assert stats.total_draft_tokens > 0
    # Proposals only come from the list.
    assert all(t % 3 == 0 for t in drafter.propose_chain(prompt + reference[:5], 3, engine_sampler()).tokens)


def engine_sampler():
    from specpipe.runtime.cpu.verify.sampling import TokenSampler

    return TokenSampler(SamplingParams(max_tokens=1), torch.Generator())


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_engine_directory_with_heads_loads_a_tree_engine(tmp_path, method):
    from specpipe import heads_format
    from specpipe.errors import CompatibilityError
    from specpipe.manifest import Manifest, Part, write_manifest
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.speculative import Method, Runtime, SpeculativeSettings

    model = tiny_llama(6, vocab_size=64)
    model.save_pretrained(tmp_path / "engine" / "target")
    eagle, medusa = random_heads(model, 2)
    tensors = medusa.state_dict_flat() if method == "medusa" else dict(eagle.state_dict())
    tensors["draft_vocab"] = torch.arange(0, 64, 2)
    meta = {"hidden_size": 32, "vocab_size": 64, "num_heads": 3, "num_layers": 1}
    heads_format.save_compact(tmp_path / "engine" / "draft", method, tensors, meta)
    speculative = SpeculativeSettings(
        Method(method), max_draft_len=6, tree=Tree.parse([[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 1]])
    )
    manifest = Manifest(
        name="tiny",
        runtime=Runtime.CPU,
        inputs_hash="",
        speculative=speculative,
        target=Part(preset="tiny", source={}, path="target"),
        draft=Part(preset=method, method=method, source={}, path="draft"),
    )
    write_manifest(tmp_path / "engine", manifest)
    engine, _ = load_engine(tmp_path / "engine")
    assert engine.tree
    prompt = [5, 9, 13, 2, 7]
    assert generate_all(solo_scheduler(engine), prompt, SamplingParams(max_tokens=20))[0] == _baseline(
        model, prompt, 20
    )
    # Heads made for another target are refused.
    meta["hidden_size"] = 48
    heads_format.save_compact(tmp_path / "engine" / "draft", method, tensors, meta)
    with pytest.raises(CompatibilityError, match="hidden size 48"):
        load_engine(tmp_path / "engine")
