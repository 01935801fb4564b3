"""Draft heads and distilled drafts shipped with specpipe, and their placement into engine directories.

Shipped files live in ``build/heads/<target>/<eagle|medusa|draft>/`` of a source checkout (or
``specpipe/_heads`` in a wheel): one compact float16 file (see :mod:`specpipe.heads_format`) and
``recipe.json`` (command, data, seed, steps, time, held-out accuracy). A build copies the compact file
into ``engines/NAME/draft/`` and writes the TensorRT-LLM converter layout next to it, so the same heads
can be converted for a GPU engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from specpipe import heads_format
from specpipe.errors import PresetError, SpecpipeError
from specpipe.heads_format import COMPACT_FILES, CONVERTER_LAYOUTS, RECIPE_FILE
from specpipe.paths import PACKAGE_DIR
from specpipe.speculative import Method, entry_for

#: The folder of each trained method's weights under ``build/heads/<target>/`` (and ``train-draft``'s
#: default output folder under ``heads/<target>/``).
SHIPPED_FOLDERS: dict[Method, str] = {Method.EAGLE: "eagle", Method.MEDUSA: "medusa", Method.DRAFT_MODEL: "draft"}


def heads_roots() -> list[Path]:
    """Folders holding shipped heads: the checkout's ``build/heads`` and the wheel's ``_heads``."""
    return [p for p in (PACKAGE_DIR.parent.parent / "build" / "heads", PACKAGE_DIR / "_heads") if p.is_dir()]


def shipped_dir(target: str, method: str) -> Path | None:
    """Folder of the shipped ``method`` weights for ``target`` (:data:`SHIPPED_FOLDERS`), or ``None``.

    Raises:
        MethodTableError: ``method`` has no entry in :data:`SHIPPED_FOLDERS`.
    """
    sub = entry_for(SHIPPED_FOLDERS, method, "models.heads.SHIPPED_FOLDERS")
    for root in heads_roots():
        candidate = root / target / sub
        if (candidate / COMPACT_FILES[method]).is_file():
            return candidate
    return None


def resolve_heads_dir(target: str, method: str, draft_model: str | None) -> Path:
    """The folder to take heads from: ``--draft-model DIR`` or the shipped heads for ``target``.

    Raises:
        PresetError: no heads given and none shipped for this target.
        SpecpipeError: ``--draft-model`` is not a folder with the compact file.
    """
    if draft_model:
        path = Path(draft_model).expanduser()
        if not (path / COMPACT_FILES[method]).is_file():
            raise SpecpipeError(
                f"--draft-model {path} has no {COMPACT_FILES[method]}: give the output folder of "
                f"'specpipe train-draft --method {method}'"
            )
        return path
    found = shipped_dir(target, method)
    if found is None:
        raise PresetError(
            f"no {method} heads ship for target '{target}': train them with 'specpipe train-draft --target "
            f"{target} --method {method}' and pass the folder with --draft-model"
        )
    return found


def place_heads(method: str, source_dir: Path, target_dir: Path, out: Path) -> dict[str, Any]:
    """Check heads against the target and write ``out``: the compact file, ``recipe.json`` (if any) and
    the converter layout (``trtllm/``).

    Returns:
        head facts for the manifest (``num_heads``/``num_layers``, ``draft_vocab_size``, hidden size).

    Raises:
        SpecpipeError: corrupt file. CompatibilityError: heads for another target. MethodTableError:
        ``method`` has no converter layout (:data:`~specpipe.heads_format.CONVERTER_LAYOUTS`).
    """
    import torch  # heavy: loading the target to check and lay out the heads
    from transformers import AutoModelForCausalLM

    tensors, meta = heads_format.load_compact(source_dir / COMPACT_FILES[method], method)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    heads_format.check_for_target(meta, target.config, source_dir / COMPACT_FILES[method])
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source_dir / COMPACT_FILES[method], out / COMPACT_FILES[method])
    if (source_dir / RECIPE_FILE).is_file():
        shutil.copy2(source_dir / RECIPE_FILE, out / RECIPE_FILE)
    heads = {k: v for k, v in tensors.items() if k != "draft_vocab"}
    entry_for(CONVERTER_LAYOUTS, method, "heads_format.CONVERTER_LAYOUTS")(out / "trtllm", heads, meta, target)
    facts = {
        k: meta[k] for k in ("hidden_size", "vocab_size", "num_heads", "num_layers", "draft_vocab_size") if k in meta
    }
    facts["trtllm_layout"] = "trtllm"
    return facts


def make_distilled_draft(source_dir: Path, target_dir: Path, out: Path) -> dict[str, Any]:
    """Rebuild the distilled draft model (a full Hugging Face checkpoint) from its compact file.

    Returns:
        facts for the manifest (``num_layers``).
    """
    from transformers import AutoConfig  # heavy: the target's config

    tensors, meta = heads_format.load_compact(source_dir / COMPACT_FILES["draft-model"], "draft-model")
    heads_format.check_for_target(
        meta, AutoConfig.from_pretrained(target_dir), source_dir / COMPACT_FILES["draft-model"]
    )
    heads_format.write_draft_model(out, tensors, target_dir, int(meta["num_layers"]))
    if (source_dir / RECIPE_FILE).is_file():
        shutil.copy2(source_dir / RECIPE_FILE, out / RECIPE_FILE)
    return {"num_layers": int(meta["num_layers"]), "distilled": True}


def recipe(source_dir: Path) -> dict[str, Any] | None:
    """The recipe next to shipped weights, or ``None``."""
    path = Path(source_dir) / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
