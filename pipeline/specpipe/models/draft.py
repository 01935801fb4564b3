"""Draft models made from the target (draft-target speculative decoding)."""

from __future__ import annotations

from pathlib import Path

from specpipe.errors import CompatibilityError, PresetError
from specpipe.progress import status


def truncate_target(target_dir: Path, out_dir: Path, num_layers: int) -> None:
    """Save the target's first ``num_layers`` decoder layers as a standalone ``LlamaForCausalLM``.

    The draft keeps the target's token embeddings, final RMSNorm and lm_head, so it shares the
    target's vocabulary and tokenizer exactly (the tokenizer files are copied too). Untrained, such
    an early exit agrees with the full model rarely: it is a correctness/wiring draft, not a fast one.

    Raises:
        PresetError: ``num_layers`` is not in [1, target layers).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with status(f"Making the draft model: first {num_layers} decoder layers of the target"):
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        total = model.config.num_hidden_layers
        if not 1 <= num_layers < total:
            raise PresetError(
                f"draft num_layers={num_layers} must be between 1 and {total - 1} (the target has "
                f"{total} decoder layers): fix the draft preset's [source] num_layers"
            )
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:num_layers]
        model.save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(target_dir).save_pretrained(out_dir)


def check_same_vocabulary(target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's.

    Compares the models' ``vocab_size`` (logits width), ``len(tokenizer)`` (never
    ``tokenizer.vocab_size``, which leaves out added tokens) and the tokenizers' vocabularies by content.

    Raises:
        CompatibilityError: naming both sides and the fix.
    """
    from transformers import AutoConfig, AutoTokenizer

    t_cfg, d_cfg = AutoConfig.from_pretrained(target_dir), AutoConfig.from_pretrained(draft_dir)
    if t_cfg.vocab_size != d_cfg.vocab_size:
        raise CompatibilityError(
            f"draft vocabulary ({d_cfg.vocab_size} logits, {draft_dir}) differs from the target's "
            f"({t_cfg.vocab_size}, {target_dir}): use a draft trained for this target's tokenizer"
        )
    t_tok, d_tok = AutoTokenizer.from_pretrained(target_dir), AutoTokenizer.from_pretrained(draft_dir)
    if len(t_tok) != len(d_tok) or t_tok.get_vocab() != d_tok.get_vocab():
        raise CompatibilityError(
            f"draft tokenizer ({len(d_tok)} tokens, {draft_dir}) differs from the target's "
            f"({len(t_tok)} tokens, {target_dir}) in content: draft and target must share one tokenizer"
        )
