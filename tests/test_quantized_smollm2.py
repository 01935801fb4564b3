"""Weight-only int8 / int4 on the real SmolLM2-135M: every speculative deployment's greedy output equals
the quantized baseline's (same -q), and the quantized model's logits stay close to fp32's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.loader import load_engine
from specpipe.runtime.cpu.model.quantized_linear import QuantizedLinear

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("single_thread")]

DRAFTS = ("none", "ngram", "smollm2-draft", "medusa", "eagle")
SCHEMES = ("int8-wo", "int4-wo")
TEXTS = [
    "The capital of France is", "def fibonacci(n):\n    ", "Photosynthesis is the process by which",
    "Once upon a time, in a small village,", "The three primary colors are", "import numpy as np\n\n",
    "Water boils at 100 degrees Celsius because", "List three benefits of exercise:\n1.",
]


@pytest.fixture(scope="session")
def quantized_engines(smollm2_engines, tmp_path_factory):
    """{scheme: {draft: engine dir}} beside the fp32 ones (``smollm2_engines``)."""
    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest

    root = tmp_path_factory.mktemp("quantized-engines")
    return {q: {d: build_cpu(BuildRequest(target="smollm2-135m", draft=d, engines_dir=root, quantization=q))
                for d in DRAFTS} for q in SCHEMES}


def prompts(engine_dir: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(engine_dir / "target")
    return [tokenizer(text)["input_ids"] for text in TEXTS]


@pytest.fixture(scope="session")
def quantized_baselines(quantized_engines):
    """{scheme: (prompts, greedy outputs of the quantized baseline)}."""
    found = {}
    for scheme, engines in quantized_engines.items():
        baseline, manifest = load_engine(engines["none"])
        assert manifest.quantization == scheme and isinstance(baseline.target.model.lm_head, QuantizedLinear)
        inputs = prompts(engines["none"])[:3]
        found[scheme] = inputs, [baseline.generate_all(p, SamplingParams(max_tokens=32))[0] for p in inputs]
    return found


#: Tree verification runs attention over 1 + nodes query rows, whose float32 results differ from one-row
#: attention in the last bits (the one-request engine's attention is not batch-invariant); the bf16 rounding
#: of activations at the quantized layers' inputs turns such a last-bit difference into a 2**-9 one, and
#: int4's flatter logits then flip a near-tie: on SmolLM2 a prompt's int4 Medusa and EAGLE texts left the
#: baseline's after 10 tokens. int8 and the chain methods (n-gram, draft model) stayed identical.
TREE_INT4 = pytest.mark.xfail(strict=True, reason="int4-wo tree verification is not bitwise the baseline's attention")
CASES = [pytest.param(q, d, marks=TREE_INT4 if q == "int4-wo" and d in ("medusa", "eagle") else ())
         for q in SCHEMES for d in DRAFTS[1:]]


@pytest.mark.parametrize("scheme, draft", CASES)
def test_every_deployment_matches_the_quantized_baseline(scheme, draft, quantized_engines, quantized_baselines):
    inputs, expected = quantized_baselines[scheme]
    engine, _ = load_engine(quantized_engines[scheme][draft])
    accepted = 0
    for prompt, want in zip(inputs, expected):
        tokens, stats = engine.generate_all(prompt, SamplingParams(max_tokens=32))
        assert tokens == want, (scheme, draft, prompt)
        accepted += stats.total_accepted_draft_tokens
    assert accepted > 0, draft  # the drafts were used, and some accepted


@pytest.mark.parametrize("scheme, max_error, min_top1", [("int8-wo", 0.08, 0.90), ("int4-wo", 0.15, 0.82)])
def test_logits_against_fp32(scheme, max_error, min_top1, smollm2_engines, quantized_engines):
    """Teacher-forced over 8 prompts (every position): the logits' relative error (Frobenius norm of the
    difference over that of fp32's, worst prompt) and how often the quantized argmax is fp32's. Measured:
    int8 0.058 and 93 %, int4 (group 32) 0.11 and 88 %, over 58 positions."""
    fp32 = load_engine(smollm2_engines["none"])[0].target.model
    quantized = load_engine(quantized_engines[scheme]["none"])[0].target.model
    errors, agree, total = [], 0, 0
    with torch.inference_mode():
        for ids in prompts(smollm2_engines["none"]):
            x = torch.tensor([ids])
            exact, got = fp32(x).logits[0].float(), quantized(x).logits[0].float()
            errors.append(float((got - exact).norm() / exact.norm()))
            agree += int((got.argmax(-1) == exact.argmax(-1)).sum())
            total += len(ids)
    error, top1 = max(errors), agree / total
    print(f"{scheme}: logits relative error max {error:.4f}, top-1 agreement {top1:.3f} over {total} positions")
    assert 0 < error < max_error
    assert top1 >= min_top1
