"""TensorRT-LLM plans and engine directories for the packaging tests, made by specpipe's own planner
(offline dry runs): a plan JSON as ``build --dry-run --json`` writes it, and an engine directory
with the manifest ``build`` writes (``_manifest``) and empty target/draft/tokenizer folders."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_fakes import big_medusa_heads

from specpipe.build_request import BuildRequest
from specpipe.manifest import write_manifest
from specpipe.trtllm.build import _manifest, plan_build

#: speculative mode -> build options (engine flow).
ENGINE_MODES = {
    "none": dict(target="llama3-8b", draft="none"),
    "eagle": dict(target="llama3-8b", draft="eagle"),
    "medusa": dict(target="llama3-8b", draft="medusa", choices="[[0], [0, 0], [1], [0, 1], [0, 0, 0]]"),
    "lookahead": dict(target="llama3-8b", draft="lookahead"),
    "draft-model": dict(target="llama3.1-8b", draft="llama3.2-1b"),
}
#: speculative mode -> build options (LLM API flow).
LLMAPI_MODES = {
    "none": dict(target="llama3.1-8b", draft="none"),
    "eagle": dict(target="llama3.1-8b", draft="eagle"),
    "ngram": dict(target="llama3.1-8b", draft="ngram"),
    "draft-model": dict(target="llama3.1-8b", draft="llama3.2-1b"),
}


def make_plan(tmp: Path, runtime: str = "trtllm", **kw):
    """A :class:`~specpipe.trtllm.plan.Plan` planned offline under ``tmp/engines``."""
    options = dict(gpu="h100-80gb", engines_dir=tmp / "engines", dry_run=True, runtime=runtime)
    options.update(kw)
    if options.get("draft") == "medusa" and "draft_model" not in options:
        options["draft_model"] = str(big_medusa_heads(tmp / "medusa-heads", hidden=4096, vocab=128256))
    plan, _, _ = plan_build(BuildRequest(**options), importable=lambda: False)
    return plan


def plan_json(tmp: Path, filename: str = "plan.json", runtime: str = "trtllm", **kw) -> Path:
    """The plan document of ``build --dry-run --json``, written to ``tmp/filename``."""
    plan = make_plan(tmp, runtime, **kw)
    doc = plan.as_dict()
    doc["error"] = plan.preflight.memory_error
    doc["executor_available"] = False
    path = tmp / filename
    path.write_text(json.dumps(doc, indent=1))
    return path


def engine_dir(tmp: Path, runtime: str = "trtllm", **kw) -> Path:
    """An engine directory as ``build`` leaves it (folders empty: packaging reads only the manifest)."""
    plan = make_plan(tmp, runtime, **kw)
    directory = plan.engine_dir
    directory.mkdir(parents=True)
    if runtime == "trtllm":
        for sub in ("target", "tokenizer") + (("draft",) if plan.preflight.speculative.method == "draft-model" else ()):
            (directory / sub).mkdir()
    write_manifest(directory, _manifest(plan))
    return directory
