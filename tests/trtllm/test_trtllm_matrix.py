"""The preset matrix: targets x {eagle, medusa, draft model, lookahead} x {bf16, fp16, fp8, int4-awq} x TP {1,2,4,8}.

Every command of every plan is checked against TensorRT-LLM's flag definitions (flags exist, values
have the right type and choice, required flags present, no rejected combination), and the values that
must agree across steps do. Combinations TensorRT-LLM does not support are refused first, by name.
"""

import itertools

import pytest
from trtllm_fakes import big_medusa_heads

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError
from specpipe.presets import load_draft
from specpipe.speculative import METHODS, Method, Runtime, methods_for
from specpipe.trtllm.build import plan_build
from specpipe.trtllm.flagcheck import check_argv
from specpipe.trtllm.quant import UnsupportedCombinationError

TARGETS = ["llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b", "llama3.3-70b"]
DRAFTS = ["eagle", "medusa", "llama3.2-1b", "lookahead"]
QUANTS = ["bf16", "fp16", "fp8", "int4-awq"]
TPS = [1, 2, 4, 8]
HIDDEN = {"llama3-8b": 4096, "llama3.1-8b": 4096}
EAGLE1 = {"llama3-8b", "llama3-70b"}  # EAGLE-1 heads published (engine flow)
EAGLE3 = {"llama3.1-8b", "llama3.3-70b"}  # EAGLE-3 heads published (LLM API flow only)
SUPPORTED = {
    "eagle": {"bf16", "fp16"},
    "medusa": {"bf16", "fp16", "fp8"},
    "llama3.2-1b": {"bf16", "fp16", "fp8"},
    "lookahead": {"bf16", "fp16", "fp8"},
}
MODE = {"eagle": "eagle", "medusa": "medusa", "llama3.2-1b": "draft_tokens_external", "lookahead": "lookahead_decoding"}


@pytest.fixture(scope="module")
def medusa_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("medusa")
    return {h: str(big_medusa_heads(root / str(h), hidden=h, vocab=128256)) for h in (4096, 8192)}


def expected_refusal(target, draft, quant):
    """Why TensorRT-LLM (engine flow) cannot do this combination, or None."""
    if draft == "eagle" and target not in EAGLE1:
        return "LLM API flow" if target in EAGLE3 else "no EAGLE head is published"
    if quant not in SUPPORTED[draft]:
        return "is not supported by TensorRT-LLM's engine flow"
    return None


CASES = list(itertools.product(TARGETS, DRAFTS, QUANTS, TPS))


def test_the_matrix_covers_every_engine_flow_method():
    """A method added to the registry for the engine flow must be added to the matrix too."""
    covered = {load_draft(d).kind for d in DRAFTS}
    assert covered == {m.value for m in methods_for(Runtime.TRTLLM)} - {Method.NONE.value}
    assert {d: METHODS[Method(load_draft(d).kind)].build_mode for d in DRAFTS} == MODE


@pytest.mark.parametrize("target, draft, quant, tp", CASES)
def test_matrix(target, draft, quant, tp, medusa_dirs, tmp_path):
    request = BuildRequest(
        target=target,
        draft=draft,
        runtime="trtllm",
        quantization=quant,
        tp=tp,
        dry_run=True,
        engines_dir=tmp_path / "engines",
        executor="docker",
        draft_model=medusa_dirs[HIDDEN.get(target, 8192)] if draft == "medusa" else None,
    )
    refusal = expected_refusal(target, draft, quant)
    if refusal:
        with pytest.raises(CompatibilityError, match=refusal) as info:
            plan_build(request, importable=lambda: False)
        if "engine flow" in refusal:
            assert isinstance(info.value, UnsupportedCombinationError)
        return
    plan, _, _ = plan_build(request, importable=lambda: False)
    steps = {s.name: s for s in plan.steps}
    parsed = {name: check_argv(s.tool, s.argv) for name, s in steps.items() if s.tool}
    # Every TensorRT-LLM command was checked; downloads are plain `hf download`; the first step is the
    # first-contact check, which parses the same commands in the container.
    assert plan.steps[0].name == "first-contact" and plan.steps[0].runs_in == "trtllm"
    assert all(s.tool or s.argv[:2] == ["hf", "download"] or s.name == "prepare-eagle-head" for s in plan.steps[1:])
    convert, build = parsed["convert-target"], parsed["build-target"]
    assert convert["--tp_size"] == tp and convert["--pp_size"] == 1
    assert build["--checkpoint_dir"] == steps["convert-target"].output
    assert build["--speculative_decoding_mode"] == MODE[draft]
    spec = plan.preflight.speculative
    assert build["--max_draft_len"] == spec.max_draft_len > 0
    if quant in ("fp8", "int4-awq"):
        assert steps["convert-target"].tool == "quantize"
        assert convert["--qformat"] == {"fp8": "fp8", "int4-awq": "int4_awq"}[quant]
        if quant == "fp8":
            assert convert["--kv_cache_dtype"] == "fp8"
    else:
        assert convert["--dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[quant]
    if draft == "eagle":
        assert steps["convert-target"].tool == "eagle-convert"
        assert convert["--num_eagle_layers"] == spec.tree.depth == 4
        assert convert["--max_draft_len"] == build["--max_draft_len"] == 63
        prepare = steps["prepare-eagle-head"]  # the head, prepared for the converter, after its download
        assert prepare.argv[3] == steps["download-draft"].output and convert["--eagle_model_dir"] == prepare.output
        names = [s.name for s in plan.steps]
        assert names.index("download-draft") < names.index("prepare-eagle-head") < names.index("download-target")
    elif draft == "medusa":
        assert (
            convert["--num_medusa_heads"] == 4
            and convert["--medusa_model_dir"] == medusa_dirs[HIDDEN.get(target, 8192)]
        )
        key = "--max_draft_len" if quant == "fp8" else "--max_medusa_token_len"
        assert convert[key] == build["--max_draft_len"] == 63
    elif draft == "llama3.2-1b":
        draft_build = parsed["build-draft"]
        assert "--speculative_decoding_mode" not in draft_build
        assert draft_build["--checkpoint_dir"] == steps["convert-draft"].output
        assert parsed["convert-draft"]["--model_dir"] == steps["download-draft"].output
        assert parsed["convert-draft"]["--tp_size"] == tp
    else:
        assert build["--max_draft_len"] == 83 and "download-draft" not in steps  # (W, N, G) = (7, 7, 7)
    assert (
        build["--max_batch_size"] == 8
        and build["--max_seq_len"] == 8192
        and build["--use_paged_context_fmha"] == "enable"
    )
