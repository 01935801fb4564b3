"""The input contract of TensorRT-LLM's EAGLE-1/2 converter (1.2 era), checked offline; what head preparation does.

TensorRT-LLM 1.2's engine flow converts EAGLE heads with ``examples/eagle/convert_checkpoint.py`` @ 65b31db
(the copy whose flags ``flags/eagle-convert_checkpoint.json`` vendors). With ``--eagle_model_dir`` it:

* reads the head's ``config.json`` with ``transformers.LlamaConfig`` for the EAGLE net's shape
  (``num_attention_heads``, ``intermediate_size``, ``num_hidden_layers``, ``hidden_size``,
  ``num_key_value_heads``, ``rms_norm_eps``, ``max_position_embeddings``; missing keys silently take
  LlamaConfig's 7B defaults), while ``rope_theta``/``rope_scaling`` come from the target's config;
* loads the weights with ``tensorrt_llm/models/model_weights_loader.py`` ``ModelWeightsLoader`` @ 7eb710f:
  ``detect_format`` takes ``*.safetensors`` when the folder holds any, else ``*.bin``, else ``*.pth``, and
  ``preload`` reads every file of that one format (sorted); other files are ignored;
* reads from the head, for every EAGLE net, the parameters of ``EagleNet.drafter`` (a ``LLaMAModel`` with
  ``fc_after_embed``, no input layernorm in its first layer and no final norm: ``tensorrt_llm/models/eagle/model.py``
  @ 06255cb): ``embed_tokens.weight`` ``[vocab, hidden]`` (the target's vocabulary), ``fc.weight``
  ``[hidden, 2*hidden]``, ``fc.bias`` ``[hidden]`` (that ``fc`` is a ``ColumnLinear`` with ``bias=True``)
  and ``layers.N.*``; ``lm_head.weight`` comes from the target. A tensor absent from the head is
  skipped by ``load`` and then fails ``fill`` with a ``KeyError`` (every parameter is indexed): the
  converter takes neither the target's embedding nor a zero bias in its place.

The EAGLE authors' Llama-3 heads (``yuhuili/EAGLE-LLaMA3-Instruct-8B``/``-70B``, config
``eagle/train/EAGLE-LLaMA3-Instruct-*.json`` @ f872b7f) are trained with ``"bias": false`` (no ``fc.bias``:
TensorRT-LLM issue 2588), ship the target's embedding as ``embed_tokens.weight`` (it is saved with the
head, not trained: SafeAILab/EAGLE issue 60) and say ``"max_position_embeddings": 2048`` while their
targets serve 8192 positions. The plan's ``prepare-eagle-head`` step (:mod:`specpipe.trtllm.prepare_eagle`)
writes a directory the converter accepts:

* ``model.safetensors`` (:data:`CONVERTER_WEIGHTS`; the format the loader prefers, so no pickle): every
  tensor of the head, with a zero ``fc.bias`` added when absent (``x W^T + 0`` is the head's own output);
* ``config.json``: the head's, with ``"bias": true`` and ``max_position_embeddings`` raised to the
  target's when smaller (:func:`positions_override`).

A head without ``embed_tokens.weight``, or with one of another vocabulary than the target's, is refused
(:func:`check_tensors`): the converter would fail on it, and adding the target's embedding would need
the target before the head is checked.

Why the positions are raised, not refused: the converter writes the head's ``max_position_embeddings``
into ``eagle_net_config`` and TensorRT-LLM's attention sizes its rotary table by it
(``tensorrt_llm/layers/attention.py``, ``RopeEmbeddingUtils.create_sinusoidal_positions(max_position_embeddings, ...)``,
read in an older copy @ 27712aa), so positions past 2048 have no rotary values in the EAGLE net while
the engine serves the target's 8192. A rotary value at position ``p`` depends on ``p`` and the base/scaling
only, not on the table's length (TensorRT-LLM PR 14241 relies on the same fact when it caps its PyTorch
tables), so a longer table changes nothing below 2048 and defines what lies above; the head's acceptance
past its training length is its own matter, and the target verifies every draft token.

Nothing here imports torch; tensor names and shapes come from safetensors headers
(:func:`specpipe.trtllm.checkpoint_flavour.read_safetensors_header`) or a loaded state dict.
"""

from __future__ import annotations

from typing import Any, Mapping

from specpipe.errors import CompatibilityError

#: The weights file ``prepare-eagle-head`` writes: safetensors, which ``ModelWeightsLoader`` prefers.
CONVERTER_WEIGHTS = "model.safetensors"
#: Config keys the converter reads for the EAGLE net's shape (LlamaConfig defaults otherwise).
LLAMA_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
#: Head tensors besides the layers that the converter reads (``EagleNet.drafter``'s embedding and fc).
HEAD_TENSORS = ("embed_tokens.weight", "fc.weight", "fc.bias")
#: Tensors of each EAGLE decoder layer the converter reads (the first layer has no ``input_layernorm``:
#: ``use_input_layernorm_in_first_layer = False``; the authors' layer 0 has none).
LAYER_TENSORS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)
PREPARE_STEP = "prepare-eagle-head"
PREPARE_MODULE = "specpipe.trtllm.prepare_eagle"


class EagleHeadError(CompatibilityError):
    """An EAGLE head TensorRT-LLM's converter would reject even after preparation."""


def check_config(
    config: Mapping[str, Any], where: str, *, target_hidden: int | None = None, target_name: str = "the target"
) -> None:
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


def check_tensors(
    config: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]], where: str, *, target_vocab: int | None = None
) -> list[str]:
    """The converter's demands on the head's tensors (names and shapes); returns what preparation adds.
    ``target_vocab``: the target's vocabulary (tokens), when known; else the head config's ``vocab_size``.

    Raises:
        EagleHeadError: ``embed_tokens.weight`` missing or not ``[vocab, hidden]``, ``fc.weight`` missing
            or not ``[hidden, 2*hidden]``, ``fc.bias`` not ``[hidden]``, a decoder layer tensor missing.
    """
    hidden = int(config["hidden_size"])
    vocab = target_vocab if target_vocab is not None else config.get("vocab_size")
    embed = tensors.get("embed_tokens.weight")
    if embed is None:
        raise EagleHeadError(
            f"EAGLE head {where} has no embed_tokens.weight, which TensorRT-LLM's EAGLE converter reads from the head "
            f"(it does not take the target's): re-export the head with the target's embedding as embed_tokens.weight, "
            f"as the EAGLE authors' heads ship it"
        )
    if len(embed) != 2 or embed[1] != hidden or (vocab is not None and embed[0] != int(vocab)):
        raise EagleHeadError(
            f"EAGLE head {where} has embed_tokens.weight {list(embed)}, TensorRT-LLM's EAGLE converter needs "
            f"[{vocab if vocab is not None else 'vocab'}, {hidden}] (the target's vocabulary, hidden_size {hidden}): "
            f"use a head made for this target"
        )
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
        raise EagleHeadError(
            f"EAGLE head {where} has fc.bias {list(bias)}, the converter needs [{hidden}]: re-export the head"
        )
    layers = int(config["num_hidden_layers"])
    absent = [
        f"layers.{i}.{name}" for i in range(layers) for name in LAYER_TENSORS if f"layers.{i}.{name}" not in tensors
    ]
    if absent:
        raise EagleHeadError(
            f"EAGLE head {where} lacks {absent[0]}{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''} of its "
            f"{layers} decoder layer(s) (config num_hidden_layers): TensorRT-LLM's converter would start from random "
            f"weights; pass the complete head"
        )
    q = tensors.get("layers.0.self_attn.q_proj.weight")
    if q is not None and len(q) == 2 and q[1] != hidden:
        raise EagleHeadError(
            f"EAGLE head {where} has layers.0.self_attn.q_proj.weight {list(q)}, hidden_size {hidden}: "
            f"the weights do not match config.json; re-export the head"
        )
    return [] if bias is not None else ["a zero fc.bias"]


def positions_override(head_positions: int | None, target_positions: int) -> int | None:
    """The ``max_position_embeddings`` preparation writes into the head's config (the target's, in tokens)
    when the head's is smaller or unknown; ``None`` when the head's already covers the target's."""
    if head_positions is not None and int(head_positions) >= int(target_positions):
        return None
    return int(target_positions)


def preparation(
    files: list[str],
    tensors: Mapping[str, tuple[int, ...]] | None,
    *,
    head_positions: int | None = None,
    target_positions: int | None = None,
) -> list[str]:
    """What the ``prepare-eagle-head`` step does to a head with weight ``files`` (names) and, where known,
    ``tensors`` and positions: a zero ``fc.bias``, ``model.safetensors`` re-saved from pickled files,
    the raised ``max_position_embeddings``."""
    adds = []
    if tensors is None or "fc.bias" not in tensors:
        adds.append("a zero fc.bias" if tensors is not None else "a zero fc.bias if absent")
    if not any(f.endswith(".safetensors") for f in files):
        adds.append(f"{CONVERTER_WEIGHTS} from {', '.join(sorted(files)) or 'the weights'}")
    if target_positions is not None:
        raised = positions_override(head_positions, target_positions)
        if raised is not None:
            adds.append(
                f"max_position_embeddings {head_positions if head_positions is not None else '(unset)'} -> {raised} "
                f"(the target's; the engine serves up to it)"
            )
    return adds


def prepare_argv(heads: str, target) -> list[str]:
    """The ``prepare-eagle-head`` step's argv template: ``python3 -m specpipe.trtllm.prepare_eagle HEADS {out}
    --max-position-embeddings N``, N the target's positions (tokens; ``target``: :mod:`specpipe.trtllm.resolve`'s)."""
    return [
        "python3",
        "-m",
        PREPARE_MODULE,
        heads,
        "{out}",
        "--max-position-embeddings",
        str(target.arch.max_position_embeddings),
    ]


def preparation_for(draft, target) -> list[str]:
    """What ``prepare-eagle-head`` does to ``draft``'s head for ``target`` (exact for a readable local head)."""
    info = draft.checkpoint
    positions = target.arch.max_position_embeddings
    if info is None or not info.config:
        return [
            "a zero fc.bias if absent",
            f"{CONVERTER_WEIGHTS} from pickled weights if no safetensors",
            f"max_position_embeddings -> {positions} if smaller",
        ]
    files = [p.name for p in info.path.iterdir()] if info.path.is_dir() else []
    return preparation(
        [f for f in files if f.endswith((".safetensors", ".bin"))],
        info.tensors or None,
        head_positions=info.config.get("max_position_embeddings"),
        target_positions=positions,
    )


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
        return (
            "not checked",
            f"{where}: config.json and tensors not read before download; {PREPARE_STEP} checks them "
            f"after the head's download, before the target's, and raises its max_position_embeddings "
            f"to the target's {target.arch.max_position_embeddings} when smaller",
        )
    check_config(info.config, where, target_hidden=target.arch.hidden_size, target_name=target.name)
    adds = preparation_for(draft, target)
    if not info.tensors:
        return (
            "ok",
            f"Llama config, hidden {info.config['hidden_size']}; tensors not readable offline (pickled or not "
            f"downloaded): {PREPARE_STEP} checks embed_tokens/fc/layers before conversion; it adds {', '.join(adds)}",
        )
    check_tensors(info.config, info.tensors, where, target_vocab=target.arch.vocab_size)
    return (
        "ok",
        f"Llama config, fc.weight [{info.config['hidden_size']}, {2 * int(info.config['hidden_size'])}], "
        f"embed_tokens [{target.arch.vocab_size}, {info.config['hidden_size']}], "
        f"{info.config['num_hidden_layers']} layer(s); {PREPARE_STEP} adds {', '.join(adds) or 'nothing'}",
    )
