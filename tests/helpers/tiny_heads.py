"""Randomly initialised EAGLE and Medusa heads for a tiny target, for tree-verification tests."""

from __future__ import annotations

import torch

from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig, EagleHead
from specpipe.runtime.cpu.drafters.medusa import MedusaHeads


def random_heads(model, seed: int = 0) -> tuple[EagleHead, MedusaHeads]:
    """An EAGLE head and 3 Medusa heads shaped for ``model`` (a tiny Llama); Medusa weights drawn with std 0.3
    so that its proposals vary."""
    torch.manual_seed(seed)
    eagle = EagleHead(EagleConfig.from_target(model.config)).eval()
    medusa = MedusaHeads(model.config.hidden_size, 3).eval()
    for p in medusa.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return eagle, medusa
