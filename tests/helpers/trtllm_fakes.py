"""Small fake checkpoints for the TensorRT-LLM stage tests: real config keys and tensor names/shapes,
tiny values (written with safetensors' numpy API)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def _save(
    directory: Path, config: dict, tensors: dict[str, tuple[int, ...]], filename: str = "model.safetensors"
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({name: np.zeros(shape, dtype=np.float16) for name, shape in tensors.items()}, str(directory / filename))
    return directory


def llama_config(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=256, positions=4096, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "max_position_embeddings": positions,
        "torch_dtype": "bfloat16",
        **extra,
    }


def causal_lm(directory: Path, hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=256, positions=16384) -> Path:
    """A plain Llama causal LM (``model.layers.*``)."""
    hd = hidden // heads
    tensors = {
        "model.embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": (heads * hd, hidden),
                p + "self_attn.k_proj.weight": (kv * hd, hidden),
                p + "self_attn.v_proj.weight": (kv * hd, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * hd),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
        )
    return _save(directory, llama_config(hidden, layers, heads, kv, inter, vocab, positions), tensors)


def eagle1_head(directory: Path, hidden=64, heads=4, kv=2, inter=128, vocab=256, bias=False, config_bias=None) -> Path:
    """An EAGLE-1/2 head in the EAGLE authors' layout (one decoder layer, fc over [embedding; feature])."""
    hd = hidden // heads
    tensors = {
        "embed_tokens.weight": (vocab, hidden),
        "fc.weight": (hidden, 2 * hidden),
        "layers.0.self_attn.q_proj.weight": (heads * hd, hidden),
        "layers.0.self_attn.k_proj.weight": (kv * hd, hidden),
        "layers.0.self_attn.v_proj.weight": (kv * hd, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, heads * hd),
        "layers.0.mlp.gate_proj.weight": (inter, hidden),
        "layers.0.mlp.up_proj.weight": (inter, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inter),
        "layers.0.post_attention_layernorm.weight": (hidden,),
    }
    if bias:
        tensors["fc.bias"] = (hidden,)
    config = llama_config(hidden, 1, heads, kv, inter, vocab, 2048, bias=bias if config_bias is None else config_bias)
    return _save(directory, config, tensors)


def eagle3_head(directory: Path, hidden=64, heads=4, kv=2, inter=128, vocab=256, draft_vocab=32) -> Path:
    """An EAGLE-3 head: ``midlayer.*``, fc over three target features, own lm_head over a reduced vocabulary."""
    hd = hidden // heads
    tensors = {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
        "d2t": (draft_vocab,),
        "t2d": (vocab,),
    }
    return _save(
        directory, llama_config(hidden, 1, heads, kv, inter, vocab, 2048, draft_vocab_size=draft_vocab), tensors
    )


def medusa_heads(directory: Path, hidden=64, vocab=256, heads=4, layers=1, config_heads="same") -> Path:
    """Medusa heads in the FasterDecoding layout (``medusa_lm_head.safetensors``)."""
    tensors = {}
    for h in range(heads):
        for layer in range(layers):
            tensors[f"{h}.{layer}.linear.weight"] = (hidden, hidden)
            tensors[f"{h}.{layer}.linear.bias"] = (hidden,)
        tensors[f"{h}.{layers}.weight"] = (vocab, hidden)
    config = {"medusa_num_layers": layers, "base_model_name_or_path": "some/base"}
    if config_heads == "same":
        config["medusa_num_heads"] = heads
    elif config_heads is not None:
        config["medusa_num_heads"] = config_heads
    return _save(directory, config, tensors, "medusa_lm_head.safetensors")


def header_only_safetensors(path: Path, tensors: dict[str, tuple[int, ...]]) -> None:
    """A safetensors header declaring real-size tensors, without their bytes: enough for code that
    reads names and shapes only (the flavour inspector), without writing gigabytes in tests."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)


def big_medusa_heads(directory: Path, hidden: int, vocab: int, heads=4, layers=1) -> Path:
    """Medusa heads for a real-size target (header-only weights file)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    tensors = {}
    for h in range(heads):
        for layer in range(layers):
            tensors[f"{h}.{layer}.linear.weight"] = (hidden, hidden)
        tensors[f"{h}.{layers}.weight"] = (vocab, hidden)
    header_only_safetensors(directory / "medusa_lm_head.safetensors", tensors)
    return directory
