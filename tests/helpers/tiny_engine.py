"""A tiny CPU engine directory for tests: random ``LlamaForCausalLM`` + byte-level BPE tokenizer.

``make_tiny_engine(root, name)`` writes ``root/name/{manifest.json, target/}`` in the layout of
``specpipe build --runtime cpu`` (manifest through :func:`specpipe.manifest.write_manifest`). The
tokenizer is a byte-level BPE trained here on a few sentences, including multi-byte characters
(é, ü, 日本語, emoji), so that generated tokens can split characters across tokens, as real
tokenizers do. Its vocabulary size equals the model's. No downloads; about a second.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Countries and their capitals: France - Paris, Germany - Berlin, Japan - Tokyo.",
    "Café, naïve, über, déjà vu, crème brûlée.",
    "日本語のテキストと中文文本。",
    "Emoji: 🙂 🚀 ✨ and symbols like € £ ¥.",
    "1 2 3 4 5 6 7 8 9 10, one two three four five.",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 320):
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, EOS ``<|im_end|>``, pad ``<|endoftext|>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_engine(
    root: Path,
    name: str = "tiny",
    method: str = "none",
    max_draft_len: int = 3,
    seed: int = 0,
    max_position_embeddings: int = 64,
) -> Path:
    """Write a tiny CPU engine directory ``root/name`` and return its path.

    Args:
        method: speculative method in the manifest: ``"none"`` or ``"ngram"``.
        max_draft_len: draft tokens per step (``0`` for ``"none"``).
        seed: seed of the random weights.
        max_position_embeddings: the context limit, tokens.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specpipe.manifest import Manifest, Part, canonical_hash, sha256_file, write_manifest
    from specpipe.speculative import Method, Runtime, SpeculativeSettings

    engine_dir = Path(root) / name
    target = engine_dir / "target"
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(target)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.5,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.save_pretrained(target)
    speculative = {"method": method, "max_draft_len": 0 if method == "none" else max_draft_len}
    if method == "ngram":
        speculative["max_matching_ngram_size"] = 3
    source = {"kind": "tiny-random", "seed": seed}
    write_manifest(
        engine_dir,
        Manifest(
            name=name,
            runtime=Runtime.CPU,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            inputs_hash=canonical_hash({"source": source, "speculative": speculative}),
            target=Part(
                preset=name,
                source=source,
                path="target",
                files={p.name: sha256_file(p) for p in sorted(target.iterdir()) if p.is_file()},
            ),
            draft=None,
            speculative=SpeculativeSettings(Method(method), **{k: v for k, v in speculative.items() if k != "method"}),
        ),
    )
    return engine_dir
