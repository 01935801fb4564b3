"""EAGLE-3 tree drafting on CPU: the EAGLE-2 tree drafter (:mod:`specpipe.runtime.cpu.drafters.eagle`) over an
EAGLE-3 head (:mod:`specpipe.runtime.cpu.drafters.eagle3_head`), reading the target's fused low/mid/top features.

The target hands them over without an extra forward: an engine built on this drafter sets the target's
``capture_layers`` (:class:`~specpipe.runtime.cpu.model.cached_lm.CachedLM`,
:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`), whose hidden states then carry the captured layers'
outputs after the final ones; :meth:`Eagle3TreeDrafter.commit` keeps the captured part.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specpipe.errors import SpecpipeError
from specpipe.heads_format import COMPACT_FILES, check_for_target, load_compact
from specpipe.runtime.cpu.drafters.eagle import EagleTreeDrafter
from specpipe.runtime.cpu.drafters.eagle3_head import Eagle3Head, check_capture
from specpipe.runtime.cpu.drafters.eagle_head import EagleConfig
from specpipe.runtime.cpu.model.prepack import prepack_linear_layers
from specpipe.speculative import DYNAMIC_TREE_DEFAULTS
from specpipe.tree import Tree


class Eagle3TreeDrafter(EagleTreeDrafter):
    """:class:`~specpipe.runtime.cpu.drafters.eagle.EagleTreeDrafter` over an EAGLE-3 head, which also scores.

    Args:
        head: a trained :class:`~specpipe.runtime.cpu.drafters.eagle3_head.Eagle3Head` (eval).
        embed: float ``[V, H]`` the target's token embedding.
        tree, dynamic, top_k, depth, dtype: as :class:`EagleTreeDrafter`.

    Attributes:
        capture_layers: the target layers whose outputs :meth:`commit` needs (the engine tells the target).
    """

    def __init__(
        self,
        head: Eagle3Head,
        embed: torch.Tensor,
        tree: Tree | None = None,
        *,
        dynamic: bool = False,
        top_k: int = DYNAMIC_TREE_DEFAULTS[0],
        depth: int = DYNAMIC_TREE_DEFAULTS[1],
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__(head, embed, head, tree, dynamic=dynamic, top_k=top_k, depth=depth, dtype=dtype)
        self.capture_layers = tuple(head.layers)

    def commit(self, context_ids: list[int], features: torch.Tensor | None = None) -> None:
        """``features``: the target's wide rows ``[n, (1 + 3) H]`` (final, then captured) of the last n
        cached positions.

        Raises:
            SpecpipeError: rows without the captured layers.
        """
        self._features.append(check_capture(features, self.head.config.hidden_size, len(self.capture_layers)))


def load_eagle3_drafter(
    draft_dir: Path,
    target,
    tree: Tree | None,
    *,
    dynamic: bool,
    top_k: int,
    depth: int,
    draft_vocab: bool = True,
    prepack: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Eagle3TreeDrafter:
    """The EAGLE-3 drafter of an engine's ``draft/`` folder (``eagle_heads.safetensors`` with
    ``style: eagle3``) for ``target``; arguments as :func:`~specpipe.runtime.cpu.drafters.eagle.load_eagle_drafter`,
    except ``draft_vocab``, which it ignores: an EAGLE-3 head always scores its own draft vocabulary.

    Raises:
        SpecpipeError: missing or corrupt heads, or heads of an unexpected shape.
        CompatibilityError: heads trained for another target.
    """
    path = Path(draft_dir) / COMPACT_FILES["eagle"]
    tensors, meta = load_compact(path, "eagle")
    check_for_target(meta, target.config, path)
    vocab = tensors.pop("draft_vocab", None)
    if vocab is None or "capture_layers" not in meta:
        raise SpecpipeError(
            f"{path} is an EAGLE-3 file without its draft vocabulary or captured layers: retrain "
            "with 'specpipe train-draft --method eagle --style eagle3'"
        )
    try:
        head = Eagle3Head(EagleConfig.from_target(target.config), tuple(meta["capture_layers"]), vocab)
        head.load_state_dict({k: v.float() for k, v in tensors.items()})
    except RuntimeError as exc:  # missing/unexpected tensors or shape mismatch
        raise SpecpipeError(
            f"{path} does not hold an EAGLE-3 head of the expected shape ({exc}): retrain or rebuild"
        ) from exc
    if max(head.layers) >= target.config.num_hidden_layers:
        raise SpecpipeError(
            f"{path} reads target layer {max(head.layers)}, but the target has "
            f"{target.config.num_hidden_layers}: retrain the head for this target"
        )
    head = head.to(dtype)
    if prepack:
        prepack_linear_layers(head)
    return Eagle3TreeDrafter(
        head.eval(),
        target.get_input_embeddings().weight.detach(),
        tree,
        dynamic=dynamic,
        top_k=top_k,
        depth=depth,
        dtype=dtype,
    )
