"""``python -m specpipe.trtllm.prepare_eagle SRC DST [--max-position-embeddings N]``: an EAGLE-1/2 head as
TensorRT-LLM's converter reads it.

The plan's ``prepare-eagle-head`` step (a host step, run with the interpreter running specpipe) before
``convert-target``. It reads the head in ``SRC`` as the converter's loader does (``*.safetensors`` when
the folder holds any, else ``pytorch_model*.bin``), checks the converter's contract
(:mod:`specpipe.trtllm.eagle_head`) on the real tensors, and writes ``DST``:

* ``model.safetensors``: every tensor of the head, plus ``fc.bias`` = zeros of shape ``[hidden]`` in
  ``fc.weight``'s dtype when the head has none (the head's output is unchanged: ``x W^T + 0``);
* ``config.json``: the head's config, with ``"bias": true`` to describe the written weights and
  ``max_position_embeddings`` raised to ``N`` (the target's positions) when smaller
  (:func:`specpipe.trtllm.eagle_head.positions_override` says why).

Exit status 0, or 1 with one ``error: ...`` line (the head would be rejected by the converter).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specpipe.progress import note
from specpipe.trtllm.checkpoint_flavour import CheckpointFlavourError, read_config
from specpipe.trtllm.eagle_head import (
    CONVERTER_WEIGHTS,
    EagleHeadError,
    check_config,
    check_tensors,
    positions_override,
)

#: Pickled files in a Hugging Face folder that are not weights (training state).
_NOT_WEIGHTS = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


def load_head(src: Path) -> dict[str, torch.Tensor]:
    """All tensors of the head in ``src``: its safetensors files, else its ``.bin`` files (merged, sorted by name).

    Raises:
        EagleHeadError: no weight file, or one that is not weights (:func:`load_weights`).
    """
    files = sorted(src.glob("*.safetensors"))
    if not files:
        files = [f for f in sorted(src.glob("*.bin")) if f.name not in _NOT_WEIGHTS]
    if not files:
        raise EagleHeadError(
            f"EAGLE head {src} has no weights (*.safetensors or pytorch_model*.bin): pass the exported head"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_weights(file))
    return state


def load_weights(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of one ``.safetensors`` file, or of a ``.bin`` PyTorch file loaded with
    ``weights_only=True`` (a pickle of anything but tensors is refused, never run).

    Raises:
        EagleHeadError: the file cannot be read as weights (truncated, corrupt, not tensors), naming it.
    """
    try:
        if file.suffix == ".safetensors":
            state = load_file(str(file))
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise ValueError("it holds no name -> tensor mapping")
    except Exception as exc:  # safetensors' SafetensorError, pickle's UnpicklingError, zip and I/O errors
        raise EagleHeadError(
            f"{file} is not a safetensors/PyTorch weights file ({weights_error(exc)}): re-download it"
        ) from exc
    return state


def weights_error(exc: BaseException) -> str:
    """The cause of a failed weights load in a few words: torch's ``weights_only`` refusal is named as such
    (its message advises ``weights_only=False``, which would run the file's code: never quoted)."""
    if isinstance(exc, pickle.UnpicklingError):
        return "not a pickle of tensors only"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return textwrap.shorten(first, 160, placeholder=" ...")


def prepare(src: Path | str, dst: Path | str, max_position_embeddings: int | None = None) -> dict[str, Any]:
    """Write the converter's input for the head in ``src`` into ``dst``; returns what was done.
    ``max_position_embeddings``: the target's positions (tokens), written when the head's is smaller.

    Raises:
        EagleHeadError: the head breaks the converter's contract (names the tensor or key and the fix).
        CheckpointFlavourError: ``src`` has no readable config.json.
    """
    src, dst = Path(src), Path(dst)
    config = read_config(src)
    check_config(config, str(src))
    state = load_head(src)
    added = check_tensors(config, {name: tuple(t.shape) for name, t in state.items()}, str(src))
    fc = state["fc.weight"]
    if "fc.bias" not in state:
        state["fc.bias"] = torch.zeros(fc.shape[0], dtype=fc.dtype)
    written = {**config, "bias": True}
    raised = (
        positions_override(config.get("max_position_embeddings"), max_position_embeddings)
        if max_position_embeddings is not None
        else None
    )
    if raised is not None:
        written["max_position_embeddings"] = raised
        added.append(f"max_position_embeddings {config.get('max_position_embeddings')} -> {raised}")
    dst.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in state.items()}, str(dst / CONVERTER_WEIGHTS))
    (dst / "config.json").write_text(json.dumps(written, indent=2))
    return {"source": str(src), "tensors": len(state), "added": added, "dtype": str(fc.dtype).removeprefix("torch.")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specpipe.trtllm.prepare_eagle",
        description="Write an EAGLE-1/2 head as TensorRT-LLM's EAGLE converter reads it.",
    )
    parser.add_argument("src", type=Path, help="the head's directory (config.json and weights)")
    parser.add_argument("dst", type=Path, help=f"the directory to write (config.json, {CONVERTER_WEIGHTS})")
    parser.add_argument(
        "--max-position-embeddings",
        type=int,
        default=None,
        metavar="N",
        help="the target's positions (tokens): written into the head's config when its own are fewer",
    )
    args = parser.parse_args(argv)
    try:
        done = prepare(args.src, args.dst, args.max_position_embeddings)
    except (EagleHeadError, CheckpointFlavourError) as exc:
        note(f"error: {exc}")
        return 1
    note(
        f"prepared {done['source']} -> {args.dst}: {done['tensors']} tensors ({done['dtype']})"
        + (f", added {', '.join(done['added'])}" if done["added"] else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
