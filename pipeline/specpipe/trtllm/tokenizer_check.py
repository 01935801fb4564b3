"""Compare draft and target tokenizers by content (never by ``tokenizer.vocab_size``).

``tokenizer.json`` files are loaded with the ``tokenizers`` library. Sizes are
``get_vocab_size(with_added_tokens=True)``, which equals ``len(tokenizer)`` in transformers (base
vocabulary plus added/special tokens); ``vocab_size`` alone leaves added tokens out and is the classic
cause of draft/target mismatches. Tokenizers must agree on every regular token id; special tokens
that differ only in their text at the same ids (Llama 3 vs 3.1 renamed reserved tokens) are reported,
not refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpipe.errors import CompatibilityError
from specpipe.trtllm.preflight import Check


def locate_tokenizer(source: dict[str, Any] | None, allow_network: bool) -> Path | None:
    """``tokenizer.json`` of a source: a local directory's file, the Hugging Face cache, or (when
    allowed) a download of that one file. ``None`` when not available."""
    if not source:
        return None
    if source["kind"] == "local":
        path = Path(source["path"]) / "tokenizer.json"
        return path if path.is_file() else None
    if not allow_network:
        return None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(source["repo_id"], "tokenizer.json", revision=source.get("revision", "main"))
        if isinstance(cached, str):
            return Path(cached)
        return Path(hf_hub_download(source["repo_id"], "tokenizer.json", revision=source.get("revision", "main")))
    except Exception:  # unreachable, gated without token, missing file: reported as not checked
        return None


def compare_tokenizers(target: Path, draft: Path, target_vocab: int, draft_vocab: int) -> Check:
    """Compare two ``tokenizer.json`` files by content.

    Raises:
        CompatibilityError: regular tokens map to different ids, or a tokenizer has more tokens than
            its model's vocabulary (logits width).
    """
    from tokenizers import Tokenizer

    t, d = Tokenizer.from_file(str(target)), Tokenizer.from_file(str(draft))
    t_len, d_len = t.get_vocab_size(with_added_tokens=True), d.get_vocab_size(with_added_tokens=True)
    for name, size, vocab in (("target", t_len, target_vocab), ("draft", d_len, draft_vocab)):
        if size > vocab:
            raise CompatibilityError(
                f"the {name} tokenizer has {size} tokens (len(tokenizer)) but the {name} model's vocabulary is {vocab}: "
                f"the tokenizer does not belong to this model"
            )
    t_added = {tok.content for tok in t.get_added_tokens_decoder().values()}
    d_added = {tok.content for tok in d.get_added_tokens_decoder().values()}
    t_base = {k: v for k, v in t.get_vocab(with_added_tokens=False).items() if k not in t_added}
    d_base = {k: v for k, v in d.get_vocab(with_added_tokens=False).items() if k not in d_added}
    if t_base != d_base:
        differing = sorted(set(t_base.items()) ^ set(d_base.items()))[:3]
        raise CompatibilityError(
            f"draft and target tokenizers differ ({len(t_base)} vs {len(d_base)} regular tokens, e.g. {differing}): "
            f"draft tokens would be misread by the target; pick a draft with the target's tokenizer"
        )
    t_special = {i: tok.content for i, tok in t.get_added_tokens_decoder().items()}
    d_special = {i: tok.content for i, tok in d.get_added_tokens_decoder().items()}
    renamed = sorted(i for i in set(t_special) & set(d_special) if t_special[i] != d_special[i])
    detail = f"same {len(t_base)} regular tokens; len(tokenizer) {t_len} / {d_len}"
    if renamed:
        return Check(
            "tokenizers (content)",
            "note",
            f"{detail}; special tokens differ in text at {len(renamed)} ids (e.g. {renamed[0]})",
        )
    return Check("tokenizers (content)", "ok", detail)
