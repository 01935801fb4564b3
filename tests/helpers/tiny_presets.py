"""A preset directory with a local tiny target ``tiny`` (``targets/tiny.toml``), for builds without downloads.

It pairs with the shipped ``ngram`` draft preset: put the directory on ``$SPECPIPE_PRESETS``.
"""

from __future__ import annotations

from pathlib import Path

from tiny_engine import make_tiny_engine

ARCH = """
[architecture]
num_layers = 2
hidden_size = 32
num_attention_heads = 4
num_kv_heads = 2
head_dim = 8
intermediate_size = 64
vocab_size = 323
max_position_embeddings = 64
"""


def write_tiny_presets(root: Path) -> Path:
    """Write ``root/targets/tiny.toml`` (source: a tiny checkpoint under ``root/src``) and return ``root``."""
    root = Path(root)
    checkpoint = make_tiny_engine(root / "src", "tiny") / "target"
    (root / "targets").mkdir(parents=True, exist_ok=True)
    (root / "drafts").mkdir(exist_ok=True)
    (root / "targets" / "tiny.toml").write_text(
        f'name = "tiny"\n[source]\nkind = "local"\npath = "{checkpoint}"\n{ARCH}'
    )
    return root
