"""Client-side chat formatting with the deployment's own tokenizer chat template."""

from __future__ import annotations

import functools
from pathlib import Path

from specpipe.errors import SpecpipeError


def tokenizer_dir_from_config(preprocessing_config: dict) -> str | None:
    """The ``tokenizer_dir`` parameter of a preprocessing model config (TensorRT-LLM's key)."""
    value = preprocessing_config.get("parameters", {}).get("tokenizer_dir", {})
    return value.get("string_value") or None


@functools.lru_cache(maxsize=8)
def _tokenizer(tokenizer_source: str):
    """The tokenizer at ``tokenizer_source``, loaded once per process (loading takes ~0.1-0.3 s of CPU:
    per request, it stalled a benchmark client's event loop and competed with the server)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer_source)
    except OSError as exc:
        raise SpecpipeError(
            f"cannot load the tokenizer from {tokenizer_source} for --chat ({exc}): run the client on the "
            f"server's machine or drop --chat and send the formatted prompt"
        ) from exc


def apply_chat_template(prompt: str, tokenizer_source: str) -> str:
    """Wrap ``prompt`` as a single user turn with the tokenizer's chat template (generation prompt added).

    Raises:
        SpecpipeError: the tokenizer cannot be loaded or has no chat template.
    """
    tokenizer = _tokenizer(tokenizer_source)
    if not tokenizer.chat_template:
        raise SpecpipeError(f"the tokenizer at {tokenizer_source} has no chat template: drop --chat")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


def is_local_dir(path: str | None) -> bool:
    return bool(path) and Path(path).is_dir()
