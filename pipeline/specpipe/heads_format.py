"""The heads file format: how trained drafts (EAGLE/Medusa heads, distilled draft layers) are stored.

A base module: training writes these files, the build places them (:mod:`specpipe.models.heads`) and the
CPU runtime reads them; it imports none of those packages.

Two forms:

* **Compact (shipped) form**, one float16 safetensors file per method holding only the tensors that
  differ from the target, plus ``recipe.json``. Tensor names are those of the converter layouts below
  (without the target's copies); the file's metadata records the target's name, hidden size, vocabulary
  size and the head shape, so heads made for another target are refused before use.

  ========== ================================ =================================================
  method     file                             tensors
  ========== ================================ =================================================
  eagle      ``eagle_heads.safetensors``      ``fc.weight`` [H, 2H], ``fc.bias`` [H], ``layers.0.*``
  medusa     ``medusa_heads.safetensors``     ``{h}.{l}.linear.weight`` [H, H], ``.bias`` [H]
  draft      ``draft_layers.safetensors``     ``model.layers.{i}.*``, ``model.norm.weight``
  ========== ================================ =================================================

  ``draft_vocab`` (int64 [V'], target ids) rides along for EAGLE and Medusa.

  An EAGLE-3 head shares the eagle file; its metadata says ``style: "eagle3"`` and ``capture_layers``
  (the target layers it reads, :func:`compact_style`), and its tensors are ``fc.weight`` [H, 3H],
  ``midlayer.*`` (``self_attn.{q,k,v}_proj`` [*, 2H], ``input_layernorm``, ``hidden_norm``,
  ``post_attention_layernorm``, ``mlp.*``), ``norm.weight`` and its own ``lm_head.weight`` [V', H]
  (:mod:`specpipe.runtime.cpu.drafters.eagle3_head`).

* **Converter layouts**, complete, which TensorRT-LLM's checkpoint converters read:

  - EAGLE (``examples/eagle/convert_checkpoint.py --eagle_model_dir``, EAGLE authors' layout):
    ``config.json`` (a ``LlamaConfig`` with ``num_hidden_layers`` 1) and ``pytorch_model.bin`` with
    ``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
    ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` and
    ``embed_tokens.weight`` [V, H] (the target's). The converter reuses the target's lm_head.
  - Medusa (``examples/medusa/convert_checkpoint.py --medusa_model_dir``, FasterDecoding layout):
    ``config.json`` with ``medusa_num_heads``, ``medusa_num_layers``, and
    ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.weight`` [H, H], ``{h}.{l}.linear.bias`` [H],
    and ``{h}.{num_layers}.weight`` [V, H] (each head's lm_head; here copies of the target's).
  - EAGLE-3 (LLM API / PyTorch flow, the published EAGLE-3 heads' layout, :func:`write_eagle3_layout`):
    ``config.json`` (one-layer ``LlamaForCausalLMEagle3`` with ``draft_vocab_size``) and
    ``model.safetensors`` with the compact tensors plus ``d2t`` [V'] and ``t2d`` [V].
  - Draft model: a plain Hugging Face ``LlamaForCausalLM`` checkpoint (draft-target engines convert
    it with the ordinary Llama converter).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specpipe.errors import CompatibilityError, SpecpipeError
from specpipe.fsutil import make_readable
from specpipe.speculative import Method

if TYPE_CHECKING:
    import torch

COMPACT_FILES = {
    "eagle": "eagle_heads.safetensors",
    "medusa": "medusa_heads.safetensors",
    "draft-model": "draft_layers.safetensors",
}
RECIPE_FILE = "recipe.json"
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"  # beside a distilled draft checkpoint: its frequent tokens
FORMAT = "specpipe-heads-1"


def load_draft_vocab(draft_dir: Path) -> torch.Tensor | None:
    """The frequent-token list (int64 ``[V']`` target ids) beside a distilled draft checkpoint
    (``DRAFT_VOCAB_FILE``), or ``None`` where there is none."""
    from safetensors.torch import load_file

    path = Path(draft_dir) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    return load_file(str(path))["draft_vocab"]


def save_compact(out_dir: Path, method: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write the compact float16 file (int tensors kept as int64) with ``meta`` as safetensors metadata.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / COMPACT_FILES[method]
    converted = {
        k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach().to(torch.int64)).contiguous()
        for k, v in tensors.items()
    }
    metadata = {"format": FORMAT, "method": method, **{k: json.dumps(v) for k, v in meta.items()}}
    tmp = path.with_suffix(".tmp")
    save_file(converted, str(tmp), metadata=metadata)
    make_readable(tmp)
    tmp.replace(path)
    return path


def load_compact(path: Path, method: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a compact file: (tensors, metadata with JSON values decoded).

    Raises:
        SpecpipeError: missing, truncated or corrupt file, or a file of another method/format.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise SpecpipeError(
            f"{method} weights {path} are missing: run 'specpipe train-draft --method {method}' or rebuild"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises several types for damaged files
        raise SpecpipeError(
            f"{method} weights {path} are corrupt or truncated ({type(exc).__name__}: {exc}): "
            f"restore the file (git checkout) or retrain with 'specpipe train-draft'"
        ) from exc
    if raw_meta.get("format") != FORMAT or raw_meta.get("method") != method:
        raise SpecpipeError(
            f"{path} is not a specpipe {method} file (format {raw_meta.get('format')!r}, method "
            f"{raw_meta.get('method')!r}): retrain with 'specpipe train-draft --method {method}'"
        )
    meta = {k: json.loads(v) for k, v in raw_meta.items() if k not in ("format", "method")}
    return tensors, meta


def compact_style(path: Path) -> str:
    """The style of an EAGLE compact file: ``eagle3`` where its metadata says so, else ``eagle1`` (EAGLE-1/2
    heads, and missing or unreadable files, whose loader then says what is wrong)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            style = (f.metadata() or {}).get("style")
    except Exception:  # damaged or missing: the full reader reports it
        return "eagle1"
    return json.loads(style) if style else "eagle1"


def check_for_target(meta: dict[str, Any], target_config, path: Path) -> None:
    """Refuse heads trained for another target (hidden size or vocabulary differ).

    Raises:
        CompatibilityError: naming both shapes and the fix.
    """
    want = {"hidden_size": target_config.hidden_size, "vocab_size": target_config.vocab_size}
    have = {k: meta.get(k) for k in want}
    if have != want:
        raise CompatibilityError(
            f"{path} was trained for a target with hidden size {have['hidden_size']} and vocabulary "
            f"{have['vocab_size']}, but this target has hidden size {want['hidden_size']} and vocabulary "
            f"{want['vocab_size']}: train heads for this target with 'specpipe train-draft'"
        )


def expected_eagle_tensors(
    hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, vocab: int
) -> dict[str, tuple[int, ...]]:
    """Names and shapes TensorRT-LLM's EAGLE converter reads from ``pytorch_model.bin``."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "fc.weight": (hidden, 2 * hidden),
        "fc.bias": (hidden,),
        "layers.0.self_attn.q_proj.weight": (q, hidden),
        "layers.0.self_attn.k_proj.weight": (kv, hidden),
        "layers.0.self_attn.v_proj.weight": (kv, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, q),
        "layers.0.mlp.gate_proj.weight": (intermediate, hidden),
        "layers.0.mlp.up_proj.weight": (intermediate, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, intermediate),
        "layers.0.post_attention_layernorm.weight": (hidden,),
        "embed_tokens.weight": (vocab, hidden),
    }


def expected_medusa_tensors(hidden: int, vocab: int, num_heads: int, num_layers: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes TensorRT-LLM's Medusa converter reads from ``medusa_lm_head.safetensors``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{h}.{layer}.linear.weight"] = (hidden, hidden)
            shapes[f"{h}.{layer}.linear.bias"] = (hidden,)
        shapes[f"{h}.{num_layers}.weight"] = (vocab, hidden)
    return shapes


def write_eagle_layout(
    out_dir: Path, heads: dict[str, torch.Tensor], target, dtype: "torch.dtype | None" = None
) -> Path:
    """Write the EAGLE authors' layout (``config.json`` + ``pytorch_model.bin``) for ``target``.

    Args:
        heads: ``fc.*`` and ``layers.0.*`` tensors (compact form).
        target: the target ``LlamaForCausalLM`` (its config and token embedding are used).
    """
    import torch

    dtype = dtype or torch.float16
    out_dir.mkdir(parents=True, exist_ok=True)
    c = target.config
    state = {k: v.to(dtype).contiguous() for k, v in heads.items() if k.startswith(("fc.", "layers."))}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(dtype).contiguous()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bias": True,
        **_one_layer_llama_config(c),
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.save(state, out_dir / "pytorch_model.bin")
    return out_dir


def write_eagle3_layout(
    out_dir: Path, heads: dict[str, torch.Tensor], meta: dict[str, Any], target, dtype: "torch.dtype | None" = None
) -> Path:
    """Write an EAGLE-3 head in the layout of the published EAGLE-3 heads (``config.json`` +
    ``model.safetensors``) for ``target``.

    Tensor names are those of the EAGLE authors' ``Model`` (SafeAILab/EAGLE ``eagle/model/cnets.py`` @
    bfeb532e): ``fc.weight`` [H, 3H], ``midlayer.*`` (``self_attn.{q,k,v}_proj`` read 2H,
    ``input_layernorm``, ``hidden_norm``, ``post_attention_layernorm``, ``mlp.*``), ``norm.weight``,
    ``lm_head.weight`` [V', H], ``d2t`` int64 [V'] (target id = d + d2t[d]) and ``t2d`` bool [V]; the config
    is a one-layer ``LlamaForCausalLMEagle3`` with ``draft_vocab_size``. The target's embedding is not
    copied (EAGLE-3 drafters use the target's).

    Args:
        heads: the compact tensors (``fc.*``, ``midlayer.*``, ``norm.*``, ``lm_head.*``, ``draft_vocab``).
        meta: the compact metadata (``capture_layers``).
    """
    import torch
    from safetensors.torch import save_file

    dtype = dtype or torch.float16
    out_dir.mkdir(parents=True, exist_ok=True)
    c = target.config
    vocab = heads["draft_vocab"].to(torch.long)
    state = {
        k: v.to(dtype).contiguous() for k, v in heads.items() if k.startswith(("fc.", "midlayer.", "norm.", "lm_head."))
    }
    state["d2t"] = (vocab - torch.arange(vocab.numel())).contiguous()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    state["t2d"] = t2d
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **_one_layer_llama_config(c),
        "draft_vocab_size": int(vocab.numel()),
        "target_hidden_size": c.hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "specpipe_capture_layers": list(meta["capture_layers"]),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out_dir / "model.safetensors"))
    return out_dir


def write_medusa_layout(
    out_dir: Path,
    heads: dict[str, torch.Tensor],
    target,
    num_heads: int,
    num_layers: int,
    dtype: "torch.dtype | None" = None,
) -> Path:
    """Write FasterDecoding's layout (``config.json`` + ``medusa_lm_head.safetensors``) for ``target``.

    Each head's lm_head (``{h}.{num_layers}.weight``) is a copy of the target's lm_head, which the heads
    were trained against (frozen).
    """
    import torch
    from safetensors.torch import save_file

    dtype = dtype or torch.float16
    out_dir.mkdir(parents=True, exist_ok=True)
    lm_head = target.get_output_embeddings().weight.detach().to(dtype).contiguous()
    state = {k: v.to(dtype).contiguous() for k, v in heads.items() if ".linear." in k}
    for h in range(num_heads):
        state[f"{h}.{num_layers}.weight"] = lm_head.clone()
    save_file(state, str(out_dir / "medusa_lm_head.safetensors"))
    config = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": getattr(target.config, "_name_or_path", "") or "",
        "hidden_size": target.config.hidden_size,
        "vocab_size": target.config.vocab_size,
        "medusa_hidden_act": "silu",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def _eagle_layout(out_dir: Path, heads: dict[str, torch.Tensor], meta: dict[str, Any], target) -> Path:
    return write_eagle_layout(out_dir, heads, target)


def _medusa_layout(out_dir: Path, heads: dict[str, torch.Tensor], meta: dict[str, Any], target) -> Path:
    return write_medusa_layout(out_dir, heads, target, int(meta["num_heads"]), int(meta["num_layers"]))


#: The converter layout of each head method (``MethodSpec.weights == "heads"``), written from its compact
#: tensors, the compact file's metadata and the target model: ``writer(out_dir, heads, meta, target)``.
#: An EAGLE-3 head's layout is :func:`write_eagle3_layout`, which ``train-draft --style eagle3`` writes.
CONVERTER_LAYOUTS: dict[Method, Callable[[Path, dict[str, "torch.Tensor"], dict[str, Any], Any], Path]] = {
    Method.EAGLE: _eagle_layout,
    Method.MEDUSA: _medusa_layout,
}


def write_draft_model(out_dir: Path, layers: dict[str, torch.Tensor], target_dir: Path, num_layers: int) -> Path:
    """Rebuild the distilled draft as a standalone Hugging Face checkpoint: the target truncated to
    ``num_layers`` decoder layers, with the distilled tensors (``model.layers.*``, ``model.norm.weight``)
    put in place (float32).

    Raises:
        CompatibilityError: a distilled tensor's name or shape does not fit the truncated target.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]
    own = model.state_dict()
    vocab = layers.get("draft_vocab")
    layers = {k: v for k, v in layers.items() if k != "draft_vocab"}
    for name, value in layers.items():
        if name not in own or tuple(own[name].shape) != tuple(value.shape):
            raise CompatibilityError(
                f"distilled draft tensor {name} {tuple(value.shape)} does not fit the target truncated to "
                f"{num_layers} layers: the draft was trained for another target; retrain it"
            )
        own[name] = value.float()
    model.load_state_dict(own)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out_dir)
    if vocab is not None:
        save_file({"draft_vocab": vocab.to(torch.int64).contiguous()}, str(Path(out_dir) / DRAFT_VOCAB_FILE))
    return out_dir


def _one_layer_llama_config(c) -> dict[str, Any]:
    """The ``config.json`` fields a one-layer Llama draft head takes from its target's config ``c``, in the
    order the head layouts write them."""
    rope = getattr(c, "rope_parameters", None) or {}
    return {
        "hidden_act": c.hidden_act,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
        "num_hidden_layers": 1,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)),
        "vocab_size": c.vocab_size,
    }
