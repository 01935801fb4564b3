"""Synthetic prompts of an exact token length (``specpipe bench --input-len N``).

Prompt ``i`` is cut from the token stream of the built-in prompt sets (``chat``, ``code``,
``summarize``, repeated as needed), starting ``i * STRIDE`` tokens in, so that prompts differ from
their first tokens on (no shared prefix a server's prefix cache could reuse). The cut is decoded to
text and encoded again; since decoding and encoding need not round-trip, the text is then trimmed or
extended a token at a time until it encodes to exactly N tokens. Lengths count the tokenizer's
encoding without special tokens (``add_special_tokens=False``), which is what the text adds to a
request: a server whose preprocessing prepends a BOS token reports N + 1 input tokens.
"""

from __future__ import annotations

from specpipe.bench.prompts import BUILTIN_SETS, Prompt, builtin_path, parse_prompts
from specpipe.errors import SpecpipeError

#: Tokens between the starts of two consecutive prompts in the source stream.
STRIDE = 61

#: Attempts to reach the exact length by trimming or extending one token at a time.
ADJUST_STEPS = 16


def _source_text() -> str:
    texts = []
    for name in BUILTIN_SETS:
        lines = builtin_path(name).read_text(encoding="utf-8").splitlines()
        texts += [p.text for p in parse_prompts(lines, f"built-in prompt set {name}")]
    return "\n\n".join(texts)


def exact_length_text(tokenizer, stream: list[int], start: int, length: int) -> str:
    """Text that ``tokenizer`` encodes to exactly ``length`` tokens, cut from ``stream`` at ``start``.

    Raises:
        SpecpipeError: no such text was found within :data:`ADJUST_STEPS` adjustments (a tokenizer
            whose decode/encode drifts far), naming the length to try instead.
    """
    take = length
    for _ in range(ADJUST_STEPS):
        ids = [stream[(start + k) % len(stream)] for k in range(take)]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        count = len(tokenizer.encode(text, add_special_tokens=False))
        if count == length:
            return text
        take += 1 if count < length else -1
        if take < 1:
            break
    raise SpecpipeError(
        f"could not build a prompt of exactly {length} tokens with this tokenizer: try another --input-len"
    )


def synthetic_prompts(length: int, tokenizer_source: str, count: int) -> list[Prompt]:
    """``count`` prompts (at least 1) of exactly ``length`` tokens each, ids ``synthetic-<i>``.

    Args:
        length: tokens per prompt (>= 1).
        tokenizer_source: a tokenizer folder or Hugging Face id (``AutoTokenizer.from_pretrained``).

    Raises:
        SpecpipeError: ``length`` < 1, a tokenizer that cannot be loaded, or no exact cut found.
    """
    if length < 1:
        raise SpecpipeError(f"--input-len must be at least 1 token, got {length}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    except Exception as exc:  # missing folder, unknown id offline, no tokenizer files
        raise SpecpipeError(
            f"cannot load tokenizer {tokenizer_source!r} to build --input-len prompts ({type(exc).__name__}): "
            "pass --tokenizer DIR_OR_ID of the deployments' model"
        ) from exc
    stream = tokenizer.encode(_source_text(), add_special_tokens=False)
    return [
        Prompt(id=f"synthetic-{i}", text=exact_length_text(tokenizer, stream, i * STRIDE, length))
        for i in range(max(1, count))
    ]
