"""Client-side chat formatting (``specpipe client --chat``, ``specpipe bench --chat``): the deployment's
template applied to each prompt, with the tokenizer loaded once per process, not once per request."""

import pytest
from tiny_engine import tiny_tokenizer
from transformers import AutoTokenizer

from specpipe.client import chat
from specpipe.errors import SpecpipeError

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


@pytest.fixture
def tokenizer_dir(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(tmp_path / "tok")
    chat._tokenizer.cache_clear()
    yield str(tmp_path / "tok")
    chat._tokenizer.cache_clear()


def test_template_is_applied_and_the_tokenizer_loaded_once(tokenizer_dir, monkeypatch):
    loads = []
    original = AutoTokenizer.from_pretrained

    def counting(source, *args, **kwargs):
        loads.append(source)
        return original(source, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counting)
    texts = [chat.apply_chat_template(f"prompt {i}", tokenizer_dir) for i in range(5)]
    assert texts[3] == "<|im_start|>user\nprompt 3<|im_end|>\n<|im_start|>assistant"  # Jinja drops the last newline
    assert loads == [tokenizer_dir]


def test_missing_tokenizer_and_missing_template_are_clear_errors(tokenizer_dir, tmp_path):
    with pytest.raises(SpecpipeError, match="cannot load the tokenizer"):
        chat.apply_chat_template("hi", str(tmp_path / "nowhere"))
    tok = tiny_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "plain")
    with pytest.raises(SpecpipeError, match="no chat template"):
        chat.apply_chat_template("hi", str(tmp_path / "plain"))
