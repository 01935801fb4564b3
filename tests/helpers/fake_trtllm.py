"""Stand-in ``tensorrt_llm`` packages of two generations, with the entry points the first-contact check
uses: ``__version__``, ``commands.build.parse_arguments`` (flags from the vendored ``trtllm-build`` table;
returning the parser unparsed, as upstream does),
``llmapi.llm_args.update_llm_args_with_extra_dict`` and ``TorchLlmArgs`` (strict keys; the generation's
``decoding_type`` spellings and draft-checkpoint key), and example scripts of both parser styles."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from specpipe.trtllm.flagcheck import FLAGS_DIR

#: generation -> (version, decoding types, draft checkpoint key)
GENERATIONS = {
    "1.1": ("1.1.0", ["Eagle", "NGram", "DraftTarget"], "speculative_model_dir"),
    "1.2": ("1.2.1", ["Eagle3", "NGram", "Draft_Target"], "speculative_model"),
}

#: ``trtllm-build``'s ``parse_arguments()`` in each shape: ``parser`` as upstream (returns the parser
#: unparsed: tensorrt_llm/commands/build.py @ 65f1d15 ends with ``return parser``), ``namespace`` (parses
#: sys.argv), ``none`` (returns nothing: a shape the check must refuse).
BUILD_RETURNS = {"parser": "parser", "namespace": "parser.parse_args()", "none": "None"}

BUILD = """
import argparse, json
def parse_arguments():
    parser = argparse.ArgumentParser()
    for flag, spec in json.load(open({flags!r}))["flags"].items():
        if spec.get("type") == "store_true":
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, choices=spec.get("choices"))
    return {returns}
"""

#: ``tensorrt_llm/__init__.py`` of a container whose import fails, by cause (the texts the loader gives).
IMPORT_FAILURES = {
    "no-driver": "raise ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')",
    "broken": "raise ImportError('/usr/local/lib/python3.12/dist-packages/tensorrt_llm/libs/libth_common.so: "
    "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev')",
}

LLM_ARGS = """
TYPES, MODEL_KEY = {types!r}, {key!r}
TOP = {{"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_seq_len",
        "kv_cache_config", "speculative_config", "disable_overlap_scheduler"}}
def update_llm_args_with_extra_dict(llm_args, extra, extra_llm_api_options=None):
    return {{**llm_args, **extra}}
class TorchLlmArgs:
    def __init__(self, **kw):
        unknown = set(kw) - TOP
        if unknown:
            raise ValueError(f"extra fields not permitted: {{sorted(unknown)}}")
        spec = kw.get("speculative_config")
        if spec is not None:
            if spec.get("decoding_type") not in TYPES:
                raise ValueError(f"decoding_type {{spec.get('decoding_type')!r}} is not one of {{TYPES}}")
            if spec["decoding_type"] != "NGram" and MODEL_KEY not in spec:
                raise ValueError(f"{{MODEL_KEY}} is required")
"""

CONVERT = """
import argparse
def parse_arguments():
    parser = argparse.ArgumentParser()
    for flag in ("--model_dir", "--output_dir", "--dtype", "--tp_size", "--pp_size", "--workers"):
        parser.add_argument(flag)
    return parser.parse_args()
if __name__ == "__main__":
    raise SystemExit("the converter ran: the check must only parse")
"""

QUANTIZE = """
import argparse
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("--model_dir", "--output_dir", "--dtype", "--tp_size", "--pp_size", "--qformat", "--kv_cache_dtype",
                 "--calib_size"):
        parser.add_argument(flag)
    args = parser.parse_args()
    raise SystemExit("quantize ran: the check must stop after parsing")
"""


def write_fake(
    root: Path, generation: str, *, build_returns: str = "parser", import_failure: str | None = None
) -> tuple[Path, Path]:
    """Write the stand-in package under ``root/site`` and examples under ``root/examples``
    (``build_returns``: a :data:`BUILD_RETURNS` shape; ``import_failure``: an :data:`IMPORT_FAILURES` cause)."""
    version, types, key = GENERATIONS[generation]
    pkg = root / "site" / "tensorrt_llm"
    for sub in ("commands", "llmapi"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        IMPORT_FAILURES[import_failure] + "\n" if import_failure else f"__version__ = {version!r}\n"
    )
    (pkg / "commands" / "build.py").write_text(
        BUILD.format(flags=str(FLAGS_DIR / "trtllm-build.json"), returns=BUILD_RETURNS[build_returns])
    )
    (pkg / "llmapi" / "llm_args.py").write_text(LLM_ARGS.format(types=types, key=key))
    examples = root / "examples"
    (examples / "models/core/llama").mkdir(parents=True)
    (examples / "quantization").mkdir(parents=True)
    (examples / "models/core/llama/convert_checkpoint.py").write_text(textwrap.dedent(CONVERT))
    (examples / "quantization/quantize.py").write_text(textwrap.dedent(QUANTIZE))
    (root / "backends" / "python").mkdir(parents=True)
    (root / "backends" / "tensorrtllm").mkdir(parents=True)
    return root / "site", examples


def checks_document(root: Path, examples: Path, pin: str, *, model_yaml: str | None = None, argvs=None) -> Path:
    doc = {
        "pin": pin,
        "image": "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3",
        "argvs": argvs
        if argvs is not None
        else [
            {
                "step": "convert-target",
                "argv": [
                    "python3",
                    f"{examples}/models/core/llama/convert_checkpoint.py",
                    "--model_dir",
                    "/m",
                    "--output_dir",
                    "/o",
                    "--tp_size",
                    "1",
                ],
            },
            {
                "step": "quantize",
                "argv": [
                    "python3",
                    f"{examples}/quantization/quantize.py",
                    "--model_dir",
                    "/m",
                    "--qformat",
                    "fp8",
                    "--output_dir",
                    "/o",
                ],
            },
            {
                "step": "build-target",
                "argv": [
                    "trtllm-build",
                    "--checkpoint_dir",
                    "/c",
                    "--output_dir",
                    "/e",
                    "--gemm_plugin",
                    "auto",
                    "--max_batch_size",
                    "8",
                ],
            },
        ],
        "backends": ["tensorrtllm", "python"],
        "backends_root": str(root / "backends"),
    }
    if model_yaml is not None:
        doc["model_yaml"] = model_yaml
    path = root / "checks.json"
    path.write_text(json.dumps(doc))
    return path
