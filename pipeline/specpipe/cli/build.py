"""``specpipe build``: options -> one :class:`BuildRequest` -> the CPU, TensorRT-LLM or vLLM build stage."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from specpipe.build_request import AUTO, RUNTIMES, BuildRequest, GpuCount
from specpipe.cli.options import PARALLEL_SIZE, POSITIVE, QUANTIZATION, LookaheadType, engines_dir_option
from specpipe.errors import SpecpipeError
from specpipe.speculative import Runtime
from specpipe.trtllm.environment import cannot_run_here, detect_gpu_setup, resolve_runtime, what_is_missing
from specpipe.trtllm.preflight import MemoryPlanError

#: ``format`` of the JSON document ``--json`` prints for a failure (``{"format": ..., "error": ...}``).
ERROR_FORMAT = "specpipe-build-error/1"


@click.command()
@click.option(
    "--target",
    default=None,
    help="Target preset name (e.g. smollm2-135m, llama3-70b), a preset .toml path, or (TensorRT-LLM runtimes) "
    "a local Hugging Face checkpoint directory (required unless --from-vllm-args names the model).",
)
@click.option(
    "--draft",
    default="none",
    show_default=True,
    help="Draft preset: none, ngram, smollm2-draft, eagle, medusa, lookahead, a draft model preset, or a .toml path.",
)
@click.option(
    "--runtime",
    type=click.Choice(["auto", *RUNTIMES]),
    default="auto",
    show_default=True,
    help="Where the engine runs: cpu (the CPU reference runtime, here), trtllm (TensorRT-LLM engine flow) "
    "trtllm-llmapi (TensorRT-LLM LLM API) or vllm (the `vllm serve` command and its --speculative-config); "
    "auto: cpu for targets the CPU runtime serves, else trtllm "
    "(without a GPU and an executor here: the plan and what is missing, exit status 1).",
)
@click.option(
    "--name",
    default=None,
    help="Engine name, the directory under --engines-dir (default: <target>-<draft>, "
    "plus -int8-wo / -int4-wo for a quantized CPU engine).",
)
@engines_dir_option()
@click.option(
    "--max-draft-len",
    type=POSITIVE,
    default=None,
    help="Draft tokens verified per step (tree methods: tree nodes); overrides the preset.",
)
@click.option(
    "--draft-model",
    default=None,
    help="Local directory or Hugging Face id of the draft weights (heads or a causal LM).",
)
@click.option(
    "--gpu",
    default=None,
    help="TensorRT-LLM runtimes: GPU for the memory plan, e.g. h100-80gb (default: GPU 0 from nvidia-smi, if any).",
)
@click.option(
    "--tp",
    type=PARALLEL_SIZE,
    default=AUTO,
    show_default=True,
    help="TensorRT-LLM runtimes: tensor-parallel size (GPUs); auto: the smallest that the memory plan fits on "
    "the GPU within the GPUs available (the plan lists the sizes tried).",
)
@click.option(
    "--pp",
    type=PARALLEL_SIZE,
    default=AUTO,
    show_default=True,
    help="TensorRT-LLM runtimes: pipeline-parallel size (GPUs); auto: 1, or the smallest that fits when TP "
    "alone cannot and the method allows pipeline parallelism.",
)
@click.option(
    "--gpus",
    type=POSITIVE,
    default=None,
    help="TensorRT-LLM runtimes: GPUs --tp/--pp auto may use (default: those nvidia-smi lists, else a node of 8).",
)
@click.option(
    "--quantization",
    "-q",
    type=QUANTIZATION,
    default="auto",
    show_default=True,
    help="Weight/activation quantization (auto: the best the method and GPU allow; on the CPU runtime fp32, "
    "and it takes int8-wo / int4-wo, weight-only).",
)
@click.option(
    "--max-batch-size",
    type=POSITIVE,
    default=8,
    show_default=True,
    help="Requests batched together at most (CPU: the batch scheduler's slots, recorded in the manifest).",
)
@click.option(
    "--max-input-len",
    type=POSITIVE,
    default=4096,
    show_default=True,
    help="TensorRT-LLM runtimes: prompt tokens at most.",
)
@click.option(
    "--max-seq-len",
    type=POSITIVE,
    default=8192,
    show_default=True,
    help="TensorRT-LLM runtimes: prompt plus generated tokens at most.",
)
@click.option(
    "--lookahead",
    type=LookaheadType(),
    default=None,
    help="TensorRT-LLM engine flow: lookahead W,N,G (window, n-gram size, verification set).",
)
@click.option(
    "--choices",
    default=None,
    help="EAGLE/Medusa token tree (eagle_choices/medusa_choices) as a list of paths, e.g. '[[0],[0,0],[1]]'.",
)
@click.option(
    "--executor",
    type=click.Choice(["auto", "local", "docker"]),
    default="auto",
    show_default=True,
    help="TensorRT-LLM runtimes: where the steps run (local: tensorrt_llm importable here; docker: the release container).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (settings, inputs hash, what would be fetched, converted and written; TensorRT-LLM: "
    "the memory table); run and write nothing.",
)
@click.option(
    "--json",
    "json_output",
    is_flag=True,
    help='With --dry-run: print one JSON document instead (on a failure too: its "error" says why).',
)
@click.option("--force", is_flag=True, help="Rebuild even if nothing changed.")
@click.option(
    "--from-vllm-args",
    "vllm_args",
    default=None,
    metavar="'vllm serve MODEL ...'",
    help="Read the spec from a vllm serve command line, old speculative flags included (--speculative-model, "
    "--num-speculative-tokens, ...): prints what each flag became; implies --runtime vllm; options given "
    "here override it.",
)
def build(vllm_args, **options) -> None:
    """Resolve presets, check compatibility, fetch and convert weights, and build an engine directory."""
    try:
        _build(vllm_args, options)
    except SpecpipeError as error:
        _json_error(options, error)
        raise


def _build(vllm_args, options: dict) -> None:
    if vllm_args is not None:
        _apply_vllm_args(vllm_args, options)
    if options["target"] is None:
        raise click.UsageError("give --target (a preset, a .toml or a checkpoint directory), or --from-vllm-args")
    requested = options.pop("runtime")
    runtime = resolve_runtime(options["target"], requested)
    if runtime is Runtime.CPU:  # auto means 1 there; other sizes and --gpus are refused by the CPU build
        options.update({k: 1 for k in ("tp", "pp") if options[k] == AUTO})
        options["gpus"] = None if options["gpus"] is None else GpuCount(options["gpus"], "--gpus")
    else:
        setup = detect_gpu_setup(options["gpu"], options["gpus"])
        options.update(gpu=setup.gpu, gpus=setup.gpus, gpu_unknown=setup.unknown)
    request = BuildRequest(runtime=runtime.value, **options)
    if request.json_output and not request.dry_run:
        raise click.BadParameter("--json goes with --dry-run", param_hint="--json")
    if requested == "auto" and runtime is not Runtime.CPU and not request.dry_run:
        missing = cannot_run_here(what_is_missing())
        if missing:
            run_build(replace(request, dry_run=True, json_output=False))  # the plan; nothing is downloaded
            raise SpecpipeError(f"--runtime auto chose {runtime.value} for target {request.target}, {missing}")
    run_build(request)


def _apply_vllm_args(text: str, options: dict) -> None:
    """Fill ``options`` from ``--from-vllm-args``, where the command line left them at their defaults."""
    from specpipe.progress import note
    from specpipe.vllm.legacy import translate

    translation = translate(text)
    ctx = click.get_current_context()
    if ctx.get_parameter_source("runtime") is not click.core.ParameterSource.DEFAULT and options["runtime"] != "vllm":
        raise click.BadParameter(
            f"--from-vllm-args plans for vLLM, not --runtime {options['runtime']}: drop --runtime",
            param_hint="--runtime",
        )
    for key, value in translation.options.items():
        if key not in options or ctx.get_parameter_source(key) is click.core.ParameterSource.DEFAULT:
            options[key] = value
    for line in translation.changes:
        note(f"from vllm args: {line}")


def _json_error(options: dict, error: SpecpipeError) -> None:
    """With ``--json``, a failure is one JSON document on stdout too (a plan that does not fit was printed whole,
    its ``error`` set, by the build stage)."""
    if options.get("json_output") and not isinstance(error, MemoryPlanError):
        click.echo(json.dumps({"format": ERROR_FORMAT, "error": str(error)}, indent=1))


def run_build(request: BuildRequest) -> None:
    """The build stage of ``request.runtime`` (TensorRT-LLM's and vLLM's imported only when asked for)."""
    if request.runtime == Runtime.CPU.value:
        from specpipe.build_cpu import build_cpu

        build_cpu(request)
    elif request.runtime == Runtime.VLLM.value:
        from specpipe.vllm.build import build_vllm

        build_vllm(request)
    else:
        from specpipe.trtllm.build import build_trtllm

        build_trtllm(request)
