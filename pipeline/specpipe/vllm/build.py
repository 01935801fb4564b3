"""``specpipe build --runtime vllm``: the plan, printed (``--dry-run [--json]``) or recorded.

vLLM compiles nothing ahead of time and downloads its weights into the Hugging Face cache when it
starts, so a build writes only ``engines/NAME/manifest.json`` (runtime ``vllm``; the ``vllm`` block holds
the release, the image, the ``vllm serve`` argv and its speculative config), atomically, and skips it
when the inputs are unchanged. ``specpipe serve NAME --runtime vllm`` runs that command in
:data:`specpipe.vllm.release.IMAGE` with the host's Hugging Face cache mounted. There is no Triton
repository: vLLM serves its own OpenAI-compatible API, and ``specpipe package`` refuses vLLM engines.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from specpipe.build_common import check_writable, up_to_date
from specpipe.build_request import BuildRequest
from specpipe.fsutil import write_dir_atomically
from specpipe.manifest import Manifest, Part, write_manifest
from specpipe.progress import note, result
from specpipe.speculative import Method, Runtime, spec_of
from specpipe.trtllm.preflight import MemoryPlanError
from specpipe.vllm import release
from specpipe.vllm.plan import VllmPlan, make_plan, render_text


def manifest_of(plan: VllmPlan) -> Manifest:
    """The engine directory's manifest (``target``/``draft`` paths ``None``: vLLM fetches the weights itself)."""
    req = plan.request
    draft = None
    if spec_of(plan.draft.method).weights is not None:
        draft = Part(
            preset=plan.draft.name,
            source=plan.draft.source,
            method=Method(plan.draft.method).value,
            flavour=plan.draft.flavour,
        )
    return Manifest(
        name=plan.engine_name,
        runtime=Runtime.VLLM,
        inputs_hash=plan.inputs_hash,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        target=Part(preset=plan.target.name, source=plan.target.source),
        draft=draft,
        speculative=plan.speculative,
        quantization=plan.quantization,
        parallel={"tp": plan.parallel.tp, "pp": plan.parallel.pp},
        limits={
            "max_batch_size": req.max_batch_size,
            "max_input_len": req.max_input_len,
            "max_seq_len": req.max_seq_len,
        },
        vllm={
            **release.summary(),
            "command": list(plan.argv),
            "speculative_config": plan.speculative_config,
            "memory": plan.memory.as_dict(),
        },
    )


def build_vllm(request: BuildRequest) -> Path | None:
    """Entry point of ``specpipe build --runtime vllm``; returns ``engines/NAME`` (``None`` for dry runs).

    Raises:
        SpecpipeError: any failed check (see :func:`specpipe.vllm.plan.make_plan`); a plan that does not fit
            the named GPU (:class:`~specpipe.trtllm.preflight.MemoryPlanError`, after a dry run printed it);
            an engines directory that cannot be written.
    """
    plan = make_plan(request)
    if request.dry_run and request.json_output:
        result(json.dumps(plan.as_dict(), indent=1))
    else:
        result(render_text(plan))
    if plan.memory_error:
        raise MemoryPlanError(plan.memory_error, plan.memory)
    if request.dry_run:
        return None
    if not request.force and up_to_date(plan.engine_dir, plan.inputs_hash):
        note(f"{plan.engine_dir} is up to date (inputs {plan.inputs_hash[:12]}): nothing to do (--force rewrites)")
        return plan.engine_dir
    check_writable(plan.engine_dir.parent)
    write_dir_atomically(plan.engine_dir, lambda tmp: write_manifest(tmp, manifest_of(plan)))
    note(
        f"wrote {plan.engine_dir} (vLLM downloads the weights when it starts: specpipe serve {plan.engine_name} "
        f"--runtime vllm)"
    )
    return plan.engine_dir
