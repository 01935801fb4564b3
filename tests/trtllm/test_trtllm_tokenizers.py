"""Tokenizers compared by content; sizes are len(tokenizer) (added tokens included)."""

import pytest
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel

from specpipe.errors import CompatibilityError
from specpipe.trtllm.tokenizer_check import compare_tokenizers


def make(path, words, special):
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.add_special_tokens([AddedToken(s, special=True) for s in special])
    tok.save(str(path))
    return path


WORDS = ["<unk>", "hello", "world", "speculate"]


def test_same_tokenizer(tmp_path):
    a = make(tmp_path / "a.json", WORDS, ["<|end|>"])
    b = make(tmp_path / "b.json", WORDS, ["<|end|>"])
    check = compare_tokenizers(a, b, 8, 8)
    assert check.status == "ok" and "len(tokenizer) 5 / 5" in check.detail


def test_renamed_special_token_is_a_note(tmp_path):
    a = make(tmp_path / "a.json", WORDS, ["<|reserved_0|>"])
    b = make(tmp_path / "b.json", WORDS, ["<|eom_id|>"])
    assert compare_tokenizers(a, b, 8, 8).status == "note"


def test_different_vocabulary_refused(tmp_path):
    a = make(tmp_path / "a.json", WORDS, [])
    b = make(tmp_path / "b.json", ["<unk>", "world", "hello", "speculate"], [])
    with pytest.raises(CompatibilityError, match="draft and target tokenizers differ"):
        compare_tokenizers(a, b, 8, 8)


def test_tokenizer_larger_than_model_vocabulary(tmp_path):
    # vocab_size of the base model would be 4; len(tokenizer) counts the added tokens: 6 > 5.
    a = make(tmp_path / "a.json", WORDS, ["<s>", "</s>"])
    with pytest.raises(
        CompatibilityError,
        match=r"target tokenizer has 6 tokens \(len\(tokenizer\)\) but the target model's vocabulary is 5",
    ):
        compare_tokenizers(a, a, 5, 8)
