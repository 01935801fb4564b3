"""TensorRT-LLM's repetition/presence/frequency penalties and min_tokens in the CPU runtime.

Definitions: TensorRT-LLM ``cpp/tensorrt_llm/kernels/penaltyKernels.cu`` (``batchApplyPenalty``):
occurrences counted over prompt + output, temperature first, then repetition (positive logits divided,
negative multiplied), presence (subtracted once), frequency (subtracted per occurrence); ``min_tokens``
masks the end id until that many tokens were generated. Speculative verification penalises every
position with its own history, so greedy output stays identical to plain decoding with the same penalties.
"""

from __future__ import annotations

import pytest
import torch
from reference_decoding import next_token_logits
from tiny_models import tiny_llama

from specpipe.generation.api import SamplingParams
from specpipe.presets import load_draft
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
from specpipe.runtime.cpu.drafters.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specpipe.runtime.cpu.drafters.medusa import MedusaHeads, MedusaTreeDrafter
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler
from specpipe.runtime.cpu.validation import validate_request
from specpipe.runtime.cpu.verify.sampling import TokenSampler, apply_penalties
from specpipe.tree import Tree

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
CPU_EAGLE_CHOICES = load_draft("eagle").extra["cpu"]["choices"]
PENALTIES = [
    dict(repetition_penalty=1.3),
    dict(presence_penalty=1.5),
    dict(frequency_penalty=0.7),
    dict(repetition_penalty=0.8, presence_penalty=-0.5, frequency_penalty=0.3),
]


def penalised_reference(model, prompt, n, params: SamplingParams, end_id=None):
    """Plain greedy decoding without a cache, penalising each step's logits by the definitions above."""
    ids = list(prompt)
    for step in range(n):
        logits = next_token_logits(model, ids).clone()
        counts = torch.bincount(torch.tensor(ids), minlength=logits.shape[-1])
        logits = apply_penalties(logits[None], counts[None], params)[0]
        if end_id is not None and step < params.min_tokens:
            logits[end_id] = float("-inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_penalty_arithmetic_matches_tensorrt_llm():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    counts = torch.tensor([[2, 1, 0, 0]])
    out = apply_penalties(
        logits, counts, SamplingParams(1, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    )
    assert out.tolist() == [[2.0 / 2 - 0.5 - 0.5, -2.0 * 2 - 0.5 - 0.25, 1.0, 0.5]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: "+".join(p))
@pytest.mark.parametrize("kind", ["none", "ngram", "self-draft", "draft-model"])
def test_greedy_with_penalties_is_identical_to_plain_penalised_decoding(kind, penalty, target):
    params = SamplingParams(max_tokens=24, **penalty)
    reference = penalised_reference(target, PROMPT, 24, params)
    assert reference != penalised_reference(target, PROMPT, 24, SamplingParams(max_tokens=24)), (
        "the penalty changes nothing"
    )
    drafter = {
        "none": NoDrafter,
        "ngram": lambda: NgramDrafter(max_matching_ngram_size=3),
        "self-draft": lambda: DraftModelDrafter(target),
        "draft-model": lambda: DraftModelDrafter(tiny_llama(seed=1, num_layers=1)),
    }[kind]()
    engine = Deployment(target, drafter, max_draft_len=0 if kind == "none" else 4)
    tokens, stats = generate_all(solo_scheduler(engine), PROMPT, params)
    assert tokens == reference
    if kind == "self-draft":
        assert stats.total_accepted_draft_tokens > 0  # drafts were verified under the penalty


def test_tree_engine_applies_penalties_per_node_path():
    model = tiny_llama(3, vocab_size=64)
    prompt = [3, 17, 9, 41, 5, 22, 8]
    params = SamplingParams(max_tokens=30, repetition_penalty=1.5, frequency_penalty=0.5)
    reference = penalised_reference(model, prompt, 30, params)
    torch.manual_seed(0)

    medusa = MedusaHeads(model.config.hidden_size, 3).eval()
    lm = ReducedLMHead(model.lm_head.weight, torch.arange(0, 64))
    engine = Deployment(model, MedusaTreeDrafter(medusa, lm, Tree.parse(CPU_EAGLE_CHOICES[:10])), max_draft_len=10)
    tokens, _ = generate_all(solo_scheduler(engine), prompt, params)
    assert tokens == reference


def test_min_tokens_masks_the_end_id_until_reached(target):
    plain = generate_all(solo_scheduler(Deployment(target, NoDrafter(), 0)), PROMPT, SamplingParams(max_tokens=12))[0]
    end_id = plain[2]  # make the third greedy token the end id: plain decoding stops after two tokens
    tokens, _ = generate_all(
        solo_scheduler(Deployment(target, NoDrafter(), 0)), PROMPT, SamplingParams(max_tokens=12, end_id=end_id)
    )
    assert tokens == plain[:2]
    params = SamplingParams(max_tokens=12, end_id=end_id, min_tokens=6)
    reference = penalised_reference(target, PROMPT, 12, params, end_id=end_id)
    expected = reference[: reference.index(end_id)] if end_id in reference[6:] else reference
    for drafter in (NoDrafter(), DraftModelDrafter(target)):
        tokens, _ = generate_all(solo_scheduler(Deployment(target, drafter, 3)), PROMPT, params)
        assert len(tokens) >= 6 and end_id not in tokens[:6] and tokens == expected


def test_sampling_with_penalties_is_seeded_and_uses_the_penalised_distribution(target):
    sampler = TokenSampler(
        SamplingParams(8, greedy=False, presence_penalty=100.0), torch.Generator().manual_seed(0), history=[1, 2, 3]
    )
    probs = sampler.distributions(torch.zeros(2, 320), paths=[[], [4]])
    assert probs[0, [1, 2, 3]].sum() < 1e-30 and probs[1, [1, 2, 3, 4]].sum() < 1e-30 and probs[0, 4] > 0
    params = SamplingParams(max_tokens=16, greedy=False, seed=3, frequency_penalty=0.8)
    runs = [
        generate_all(solo_scheduler(Deployment(target, DraftModelDrafter(target), 3)), PROMPT, params)[0]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("nan")),
        ("presence_penalty", float("inf")),
        ("frequency_penalty", float("-inf")),
        ("min_tokens", -1),
    ],
)
def test_bad_penalties_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        validate_request([1, 2], SamplingParams(4, **{field: value}), vocab_size=10, max_context=64)


@pytest.mark.parametrize("end_id", [10, 10**6, -1, -7])
def test_an_end_id_outside_the_vocabulary_is_refused_naming_the_range(end_id):
    with pytest.raises(ValueError, match=r"end_id must be a token id in \[0, 10\)"):
        validate_request([1, 2], SamplingParams(4, end_id=end_id, min_tokens=2), vocab_size=10, max_context=64)
