"""Chat prompts for the real default model (SmolLM2-135M-Instruct) as token ids, through its own chat template."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from transformers import AutoTokenizer

from specpipe.training.prompts import Prompt, chat_input_ids


@cache
def _tokenizer(engine_dir: Path):
    return AutoTokenizer.from_pretrained(engine_dir / "target")


def chat_ids(engine_dir: str | Path, user: str) -> list[int]:
    """Token ids of one user turn and the assistant's opening, as a chat request reaches the engine (the
    template adds SmolLM2's default system prompt)."""
    return chat_input_ids(_tokenizer(Path(engine_dir)), Prompt("chat", user))
