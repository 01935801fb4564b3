"""The input contract of TensorRT-LLM's EAGLE-1/2 converter, checked offline; what head preparation adds.

TensorRT-LLM's engine flow converts EAGLE heads with ``examples/eagle/convert_checkpoint.py`` and
``tensorrt_llm/models/eagle/weight.py`` ``load_eagle_hf`` (read at TensorRT-LLM 535c9cc and
04a2cac). What they need from ``--eagle_model_dir``:

* ``config.json`` read with ``transformers.LlamaConfig`` and the head loaded with
  ``LlamaForCausalLM.from_pretrained``: a Llama config (``model_type`` ``llama``) giving
  ``hidden_size``, ``num_attention_heads``, ``intermediate_size``, ``num_hidden_layers`` (missing keys
  would silently take LlamaConfig's 7B defaults);
* the decoder layers ``layers.N.*`` for ``N < num_hidden_layers`` (missing ones would be random
  initialised by ``from_pretrained``, not refused);
* ``pytorch_model.bin`` (read by ``torch.load``, no other file name) holding ``fc.weight`` of shape
  ``[hidden, 2*hidden]`` and ``fc.bias`` ``[hidden]``, both read unconditionally.

The EAGLE authors' Llama-3 heads (``yuhuili/EAGLE-LLaMA3-Instruct-8B``/``-70B``, config
``eagle/train/EAGLE-LLaMA3-Instruct-*.json`` @ f872b7f) are trained with ``"bias": false`` and ship no
``fc.bias``: the converter fails with ``KeyError: 'fc.bias'`` (TensorRT-LLM issue 2588). The plan's
``prepare-eagle-head`` step (:mod:`specpipe.trtllm.prepare_eagle`) writes a directory the converter
accepts: ``config.json`` and ``pytorch_model.bin`` with a zero ``fc.bias`` added when absent (``x W^T + 0``
is the head's own output) and safetensors weights re-saved as ``pytorch_model.bin``.

Nothing here imports torch; tensor names and shapes come from safetensors headers
(:func:`specpipe.trtllm.checkpoint_flavour.read_safetensors_header`) or a loaded state dict.
"""

from __future__ import annotations

from typing import Any, Mapping

from specpipe.errors import CompatibilityError

#: The only weight file ``load_eagle_hf`` reads.
CONVERTER_WEIGHTS = "pytorch_model.bin"
#: Config keys the converter reads for the EAGLE net's shape (LlamaConfig defaults otherwise).
LLAMA_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
#: Tensors of each EAGLE decoder layer that ``convert_hf_llama`` converts (``input_layernorm`` is
#: skipped by ``load_eagle_hf``; the authors' layer 0 has none).
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "post_attention_layernorm.weight")
PREPARE_STEP = "prepare-eagle-head"
PREPARE_MODULE = "specpipe.trtllm.prepare_eagle"


class EagleHeadError(CompatibilityError):
    """An EAGLE head TensorRT-LLM's converter would reject even after preparation."""


def check_config(config: Mapping[str, Any], where: str, *, target_hidden: int | None = None,
                 target_name: str = "the target") -> None:
    """The converter's demands on the head's ``config.json`` (and its width against the target's).

    Raises:
        EagleHeadError: a non-Llama config, a missing Llama key, or a hidden size unlike the target's.
    """
    model_type = config.get("model_type")
    archs = [str(a) for a in config.get("architectures") or []]
    if (model_type is not None and model_type != "llama") or (archs and "LlamaForCausalLM" not in archs):
        raise EagleHeadError(
            f"EAGLE head {where} has a {model_type or archs[0]} config, TensorRT-LLM's EAGLE converter loads heads as "
            f"Llama (LlamaConfig, LlamaForCausalLM): use an EAGLE-1/2 head with a Llama config.json"
        )
    missing = [k for k in LLAMA_KEYS if k not in config]
    if missing:
        raise EagleHeadError(
            f"EAGLE head {where}/config.json lacks {', '.join(missing)}, which TensorRT-LLM's EAGLE converter reads "
            f"(it would take LlamaConfig defaults): add them from the head's training config"
        )
    hidden = int(config["hidden_size"])
    if target_hidden is not None and hidden != target_hidden:
        raise EagleHeadError(
            f"EAGLE head {where} has hidden_size {hidden}, target {target_name} has {target_hidden}: the head was made "
            f"for another base model; use a head made for {target_name}"
        )


def check_tensors(config: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]], where: str) -> list[str]:
    """The converter's demands on the head's tensors (names and shapes); returns what preparation adds.

    Raises:
        EagleHeadError: ``fc.weight`` missing or not ``[hidden, 2*hidden]``, ``fc.bias`` not ``[hidden]``,
            a decoder layer tensor missing.
    """
    hidden = int(config["hidden_size"])
    fc = tensors.get("fc.weight")
    if fc is None:
        raise EagleHeadError(
            f"EAGLE head {where} has no fc.weight, which TensorRT-LLM's EAGLE converter reads unconditionally: "
            f"pass an EAGLE-1/2 head in the EAGLE authors' layout (fc, layers.0.*)"
        )
    if tuple(fc) != (hidden, 2 * hidden):
        raise EagleHeadError(
            f"EAGLE head {where} has fc.weight {list(fc)}, TensorRT-LLM's EAGLE converter needs [{hidden}, {2 * hidden}] "
            f"(hidden_size {hidden}): the weights do not match config.json; re-export the head"
        )
    bias = tensors.get("fc.bias")
    if bias is not None and tuple(bias) != (hidden,):
        raise EagleHeadError(f"EAGLE head {where} has fc.bias {list(bias)}, the converter needs [{hidden}]: re-export the head")
    layers = int(config["num_hidden_layers"])
    absent = [f"layers.{i}.{name}" for i in range(layers) for name in LAYER_TENSORS if f"layers.{i}.{name}" not in tensors]
    if absent:
        raise EagleHeadError(
            f"EAGLE head {where} lacks {absent[0]}{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''} of its "
            f"{layers} decoder layer(s) (config num_hidden_layers): TensorRT-LLM's converter would start from random "
            f"weights; pass the complete head"
        )
    q = tensors.get("layers.0.self_attn.q_proj.weight")
    if q is not None and len(q) == 2 and q[1] != hidden:
        raise EagleHeadError(f"EAGLE head {where} has layers.0.self_attn.q_proj.weight {list(q)}, hidden_size {hidden}: "
                             f"the weights do not match config.json; re-export the head")
    return [] if bias is not None else ["a zero fc.bias"]


def preparation(files: list[str], tensors: Mapping[str, tuple[int, ...]] | None) -> list[str]:
    """What the ``prepare-eagle-head`` step adds for a head with weight ``files`` (names) and, where
    known, ``tensors``: a zero ``fc.bias`` and/or ``pytorch_model.bin`` re-saved from the other files."""
    adds = []
    if tensors is None or "fc.bias" not in tensors:
        adds.append("a zero fc.bias" if tensors is not None else "a zero fc.bias if absent")
    if CONVERTER_WEIGHTS not in files:
        adds.append(f"{CONVERTER_WEIGHTS} from {', '.join(sorted(files)) or 'the weights'}")
    return adds


def preflight(draft, target) -> tuple[str, str]:
    """The pre-flight verdict on an EAGLE-1/2 head for the engine flow: ``(status, detail)`` for the check
    report, from what is readable without downloading weights (a local head's config.json and safetensors
    headers; a Hugging Face head's cached config.json). ``draft``/``target``: :mod:`specpipe.trtllm.resolve`'s.

    Raises:
        EagleHeadError: the converter would reject the head even after preparation.
    """
    info = draft.checkpoint
    where = (draft.source or {}).get("repo_id") or (draft.source or {}).get("path") or draft.name
    if info is None or not info.config:
        return ("not checked", f"{where}: config.json and tensors not read before download; {PREPARE_STEP} checks them "
                               f"after the head's download, before the target's")
    check_config(info.config, where, target_hidden=target.arch.hidden_size, target_name=target.name)
    if not info.tensors:
        return ("ok", f"Llama config, hidden {info.config['hidden_size']}; tensors not readable offline (pickled or not "
                      f"downloaded): {PREPARE_STEP} checks fc.weight/layers before conversion")
    check_tensors(info.config, info.tensors, where)
    files = [p.name for p in info.path.iterdir()] if info.path.is_dir() else []
    adds = preparation([f for f in files if f.endswith((".safetensors", ".bin"))], info.tensors)
    return ("ok", f"Llama config, fc.weight [{info.config['hidden_size']}, {2 * int(info.config['hidden_size'])}], "
                  f"{info.config['num_hidden_layers']} layer(s); {PREPARE_STEP} adds {', '.join(adds) or 'nothing'}")
