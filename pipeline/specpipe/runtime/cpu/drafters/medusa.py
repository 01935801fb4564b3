"""Medusa on CPU: the heads (model code) and their tree drafter.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", arXiv:2401.10774): head k (0-based) maps the target's final hidden state h_t (after the final
RMSNorm) to the token at t + k + 2 through ``num_layers`` residual blocks ``x + SiLU(W x + b)`` and an
lm_head. Here every head's lm_head is the target's (frozen, tied), so only the residual blocks are
trained and stored (:mod:`specpipe.heads_format`, FasterDecoding's tensor names).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.drafters.tree_drafter import StaticTree, TreeDrafter, read_heads, topk_ids
from specpipe.runtime.cpu.model.prepack import prepack_linear_layers
from specpipe.runtime.cpu.verify.sampling import TokenSampler
from specpipe.runtime.cpu.verify.tree_accept import DraftTree
from specpipe.tree import Tree


class ResBlock(nn.Module):
    """Medusa residual block ``x + SiLU(linear(x))``; the linear layer starts at zero (identity block)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads of ``num_layers`` residual blocks each (lm_head shared, not owned).

    State-dict names are ``{head}.{layer}.linear.weight`` / ``.bias`` (FasterDecoding's, without the
    per-head lm_head ``{head}.{num_layers}.weight`` that :mod:`specpipe.heads_format` adds).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 1, got {num_heads}, {num_layers}")
        self.hidden_size, self.num_heads, self.num_layers = hidden_size, num_heads, num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads)
        )

    def state_dict_flat(self) -> dict[str, torch.Tensor]:
        """Tensors named ``{head}.{layer}.linear.weight|bias`` (the FasterDecoding names)."""
        return {k.removeprefix("heads."): v for k, v in self.state_dict().items()}

    def load_flat(self, tensors: dict[str, torch.Tensor]) -> None:
        self.load_state_dict({f"heads.{k}": v for k, v in tensors.items()})

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Head features: ``hidden`` ``[..., H]`` -> ``[num_heads, ..., H]`` (inputs to the lm_head)."""
        return torch.stack([head(hidden) for head in self.heads])


class MedusaTreeDrafter(TreeDrafter):
    """Medusa heads on a static choices tree: node ``path`` gets the ``path[-1]``-th best token of head
    ``len(path) - 1`` read from the newest feature (Cai et al. 2024, §2.1.2).

    Args:
        heads: trained :class:`MedusaHeads` (eval).
        lm: the target's lm_head restricted to the draft vocabulary
            (:class:`~specpipe.runtime.cpu.drafters.draft_vocab.ReducedLMHead`).
        tree: the static tree (``medusa_choices``); its depth must not exceed the number of heads.
        dtype: the heads' dtype (the target's fp32 feature is cast to it).

    Raises:
        SpecpipeError: a tree deeper than the heads.
    """

    def __init__(self, heads, lm, tree: Tree, dtype: torch.dtype = torch.float32):
        tree = StaticTree.of(tree)
        if tree.depth > heads.num_heads:
            raise SpecpipeError(
                f"medusa_choices tree is {tree.depth} deep but there are only {heads.num_heads} Medusa heads: "
                f"use paths of at most {heads.num_heads} entries"
            )
        self.heads, self.lm, self.tree, self.dtype = heads, lm, tree, dtype
        self.max_depth = heads.num_heads
        self._feature: torch.Tensor | None = None

    def reset(self, prompt_ids: list[int]) -> None:
        self._feature = None

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._feature = features[-1]

    def node_depths(self, max_nodes: int, latest: list[int] | None) -> list[int]:
        return list(self.tree.depths)

    @torch.inference_mode()
    def propose(
        self, context_ids: list[int], max_nodes: int, max_depth: int, sampler: TokenSampler | None = None
    ) -> DraftTree:
        if self._feature is None:
            return DraftTree([], [])
        feats = self.heads(self._feature[None].to(self.dtype))[: self.tree.depth, 0]  # [depth, H]
        ids, _ = topk_ids(self.lm.logits(feats), self.tree.max_rank, self.lm)
        tokens = [int(ids[d - 1, r]) for d, r in zip(self.tree.depths, self.tree.ranks)]
        return DraftTree(tokens, list(self.tree.parents)).prune(max_depth, max_nodes)


def load_medusa_drafter(
    draft_dir: Path, target, tree: Tree, *, draft_vocab: bool, prepack: bool = True, dtype: torch.dtype = torch.float32
) -> MedusaTreeDrafter:
    """The Medusa drafter of an engine's ``draft/`` folder (``medusa_heads.safetensors``) for ``target``.

    Args:
        tree: the static tree, checked against the number of heads.
        draft_vocab: score the heads' reduced vocabulary (if the file has one).
        prepack: prepack the heads' linear layers (inference only; see :mod:`specpipe.runtime.cpu.model.prepack`).
        dtype: the heads' and the reduced lm_head's dtype (bf16: cheaper drafts; verification stays fp32).

    Raises:
        SpecpipeError: missing or corrupt heads, heads of an unexpected shape, a tree deeper than the heads.
        CompatibilityError: heads trained for another target.
    """
    heads_file = read_heads(draft_dir, "medusa", target, draft_vocab=draft_vocab, prepack=prepack, dtype=dtype)
    meta = heads_file.meta
    try:
        heads = MedusaHeads(int(meta["hidden_size"]), int(meta["num_heads"]), int(meta["num_layers"]))
        heads.load_flat(heads_file.tensors)
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch
        raise SpecpipeError(
            f"{heads_file.path} does not hold medusa heads of the expected shape ({exc}): retrain or rebuild"
        ) from exc
    heads = heads.to(dtype)
    if prepack:
        prepack_linear_layers(heads)
    return MedusaTreeDrafter(heads.eval(), heads_file.lm, tree, dtype)
