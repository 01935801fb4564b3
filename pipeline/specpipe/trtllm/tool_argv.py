"""The argument vectors of TensorRT-LLM's own tools that a build plan runs.

The checkpoint converters (``convert_checkpoint.py`` of the Llama, EAGLE and Medusa examples), the
quantizer (``quantization/quantize.py``) and ``trtllm-build``, with the per-method table
:data:`CONVERTERS` that picks the conversion of the target (and its heads). Arguments may hold the
placeholders of :class:`specpipe.trtllm.plan.StepBuilder` (``{out}``, ``{examples}``, ``{step:NAME}``).
"""

from __future__ import annotations

from typing import Callable

from specpipe.build_request import BuildRequest
from specpipe.speculative import Method, SpeculativeSettings
from specpipe.trtllm import release
from specpipe.trtllm.eagle_head import PREPARE_STEP


def _convert_argv(script: str, model: str, dtype: str, tp: int, pp: int, extra: list[str]) -> list[str]:
    return [
        "python3",
        "{examples}/" + script,
        "--model_dir",
        model,
        "--output_dir",
        "{out}",
        "--dtype",
        dtype,
        "--tp_size",
        str(tp),
        "--pp_size",
        str(pp),
        *extra,
    ]


def checkpoint_argv(model: str, scheme, tp: int, pp: int) -> list[str]:
    """Convert or quantize a plain Llama checkpoint at ``scheme``."""
    if scheme.tool == "quantize":
        qformat = {"fp8": "fp8", "int4-awq": "int4_awq"}[scheme.name]
        extra = ["--qformat", qformat, "--calib_size", "512"]
        extra += ["--kv_cache_dtype", "fp8"] if scheme.name == "fp8" else ["--awq_block_size", "128"]
        return _convert_argv(release.QUANTIZE, model, scheme.dtype, tp, pp, extra)
    extra = ["--workers", str(tp * pp)]
    if scheme.name in ("int8-wo", "int4-wo"):
        extra += ["--use_weight_only", "--weight_only_precision", scheme.name[:4]]
    return _convert_argv(release.LLAMA_CONVERT, model, scheme.dtype, tp, pp, extra)


def build_argv(checkpoint: str, req: BuildRequest, extra: list[str]) -> list[str]:
    """``trtllm-build`` for ``checkpoint`` with the request's limits (tokens) and parallel sizes, plus ``extra``."""
    return [
        "trtllm-build",
        "--checkpoint_dir",
        checkpoint,
        "--output_dir",
        "{out}",
        "--gemm_plugin",
        "auto",
        "--max_batch_size",
        str(req.max_batch_size),
        "--max_input_len",
        str(req.max_input_len),
        "--max_seq_len",
        str(req.max_seq_len),
        "--max_beam_width",
        "1",
        "--use_paged_context_fmha",
        "enable",
        "--workers",
        str(req.tp * req.pp),
        *extra,
    ]


Conversion = tuple[list[str], str, list[str]]


def _convert_eagle(
    model: str, heads: str | None, spec: SpeculativeSettings, scheme, tp: int, pp: int, deps: list[str]
) -> Conversion:
    template = [
        "python3",
        "{examples}/" + release.EAGLE_CONVERT,
        "--model_dir",
        model,
        "--eagle_model_dir",
        "{step:" + PREPARE_STEP + "}",
        "--output_dir",
        "{out}",
        "--dtype",
        scheme.dtype,
        "--max_draft_len",
        str(spec.max_draft_len),
        "--num_eagle_layers",
        str(spec.num_eagle_layers),
        "--max_non_leaves_per_layer",
        str(spec.max_non_leaves_per_layer),
        "--tp_size",
        str(tp),
        "--pp_size",
        str(pp),
        "--workers",
        str(tp * pp),
    ]
    deps = [d for d in deps if d != "download-draft"] + [PREPARE_STEP]
    return template, "convert target + EAGLE head to a TensorRT-LLM checkpoint", deps


def _convert_medusa(
    model: str, heads: str | None, spec: SpeculativeSettings, scheme, tp: int, pp: int, deps: list[str]
) -> Conversion:
    medusa = [
        "--medusa_model_dir",
        heads,
        "--num_medusa_heads",
        str(spec.num_medusa_heads),
        "--num_medusa_layers",
        str(spec.num_medusa_layers),
    ]
    if scheme.name == "fp8":
        template = _convert_argv(
            release.QUANTIZE,
            model,
            scheme.dtype,
            tp,
            pp,
            [
                "--qformat",
                "fp8",
                "--kv_cache_dtype",
                "fp8",
                "--calib_size",
                "512",
                *medusa,
                "--max_draft_len",
                str(spec.max_draft_len),
            ],
        )
        return template, "quantize target to FP8 (Medusa heads kept 16-bit) into a TensorRT-LLM checkpoint", deps
    template = _convert_argv(
        release.MEDUSA_CONVERT,
        model,
        scheme.dtype,
        tp,
        pp,
        [
            *medusa,
            "--max_medusa_token_len",
            str(spec.max_draft_len),
            "--model_type",
            "llama",
            "--workers",
            str(tp * pp),
        ],
    )
    return template, "convert target + Medusa heads to a TensorRT-LLM checkpoint", deps


def _convert_target(
    model: str, heads: str | None, spec: SpeculativeSettings, scheme, tp: int, pp: int, deps: list[str]
) -> Conversion:
    desc = (
        f"{'quantize' if scheme.tool == 'quantize' else 'convert'} target ({scheme.name}) to a TensorRT-LLM checkpoint"
    )
    return checkpoint_argv(model, scheme, tp, pp), desc, deps


#: How each engine-flow method converts the target (and its heads) to a TensorRT-LLM checkpoint:
#: ``(model, heads, settings, scheme, tp, pp, dependencies) -> (argv template, description, dependencies)``.
#: Methods without heads convert the target alone (a draft model gets its own ``convert-draft`` step).
CONVERTERS: dict[Method, Callable[..., Conversion]] = {
    Method.NONE: _convert_target,
    Method.DRAFT_MODEL: _convert_target,
    Method.LOOKAHEAD: _convert_target,
    Method.EAGLE: _convert_eagle,
    Method.MEDUSA: _convert_medusa,
}
