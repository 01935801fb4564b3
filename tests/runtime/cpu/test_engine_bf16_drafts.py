"""bf16 drafts (EAGLE/Medusa heads, their reduced lm_head, a distilled draft model): drafts are proposals
the fp32 target verifies, so greedy output stays the baseline's token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from smollm2_prompts import chat_ids

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.loader import load_engine, resolve_draft_dtype
from specpipe.runtime.cpu.model.prepack import bf16_prepack_available
from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

PROMPTS = ["What happens when you pet a dog?", "Explain globalization in two sentences."]


def test_auto_draft_dtype_follows_the_cpu():
    assert resolve_draft_dtype("auto") == (torch.bfloat16 if bf16_prepack_available() else torch.float32)
    assert resolve_draft_dtype("bfloat16") == torch.bfloat16 and resolve_draft_dtype("float32") == torch.float32
    with pytest.raises(ValueError):
        resolve_draft_dtype("float16")


@pytest.mark.model
@pytest.mark.parametrize("draft", ["eagle", "medusa", "smollm2-draft"])
def test_bf16_drafts_keep_greedy_output_identical(smollm2_engines, draft, single_thread):
    baseline, _ = load_engine(Path(smollm2_engines["none"]))
    engine, _ = load_engine(Path(smollm2_engines[draft]), draft_dtype="bfloat16")
    params = SamplingParams(max_tokens=40)
    accepted = 0
    for text in PROMPTS:
        prompt = chat_ids(smollm2_engines["none"], text)
        expected, _ = generate_all(solo_scheduler(baseline), prompt, params)
        got, stats = generate_all(solo_scheduler(engine), prompt, params)
        assert got == expected
        accepted += stats.total_accepted_draft_tokens
    assert accepted > 0  # the bf16 drafts were used, and some accepted
