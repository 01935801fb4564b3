"""Regenerates ``flags.json`` (vLLM's own definitions, as data) from a vLLM wheel, without importing vLLM.

Run ``python -m specpipe.vllm.vendor vllm-X-*.whl`` (the wheel from ``pip download --no-deps vllm==X``);
it rewrites :data:`specpipe.vllm.flagcheck.FLAGS_FILE`. Every fact is read with :mod:`ast` from the
wheel's sources (paths inside the wheel, recorded in the file's ``sources``):

* ``vllm/config/speculative.py``: the ``SpeculativeConfig`` fields (``field(init=False)`` ones marked)
  and the values of the ``SpeculativeMethod`` literal (nested ``Literal`` aliases expanded);
* ``vllm/engine/arg_utils.py``: the flags ``EngineArgs.add_cli_args`` registers (the string arguments of
  its ``add_argument`` calls) and the ``EngineArgs`` field annotations, which give each flag its kind
  (``bool`` fields become ``--x``/``--no-x`` switches through ``get_kwargs``);
* ``vllm/entrypoints/common/cli_args.py``: ``BaseFrontendArgs``/``FrontendArgs`` fields (``--host``,
  ``--port``, ...: ``add_cli_args`` turns each into ``--kebab-case``) and ``make_arg_parser``'s own flags;
* ``vllm/model_executor/layers/quantization/__init__.py``: the ``QuantizationMethods`` literal
  (``--quantization`` choices).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

from specpipe.errors import SpecpipeError

SPECULATIVE = "vllm/config/speculative.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
FRONTEND = "vllm/entrypoints/common/cli_args.py"
QUANTIZATION = "vllm/model_executor/layers/quantization/__init__.py"
_WHEEL = re.compile(r"^vllm-(?P<version>[0-9][^-]*)-.+\.whl$")


class VendorError(SpecpipeError):
    """The wheel lacks a source file or definition the flag table is read from."""


def _literal_values(tree: ast.Module, name: str) -> list[str]:
    """The strings of the module-level ``name = Literal[...]``, nested Literal aliases expanded in order."""
    aliases = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }

    def expand(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            if node.id not in aliases:
                raise VendorError(f"Literal alias {node.id} is not defined at module level")
            return expand(aliases[node.id])
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [v for item in items for v in expand(item)]
        raise VendorError(f"unexpected node in Literal {name}: {ast.unparse(node)}")

    if name not in aliases:
        raise VendorError(f"no module-level {name} = Literal[...]")
    return expand(aliases[name])


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise VendorError(f"class {name} not found")


def _fields(cls: ast.ClassDef) -> dict[str, dict[str, Any]]:
    """``{field: {"annotation", "default", "init"}}`` of a dataclass body."""
    out: dict[str, dict[str, Any]] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            default = ast.unparse(node.value) if node.value is not None else None
            init = not (default is not None and "init=False" in default.replace(" ", ""))
            out[node.target.id] = {"annotation": ast.unparse(node.annotation), "default": default, "init": init}
    return out


def _added_flags(func: ast.AST) -> list[str]:
    """Option strings of every ``*.add_argument("--x", "-y", ...)`` call in ``func``, in order."""
    flags: list[str] = []
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    flags.append(arg.value)
    return flags


def _function(cls_or_module: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(cls_or_module):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise VendorError(f"function {name} not found")


def _kind(annotation: str) -> str:
    return "bool" if annotation.replace(" ", "") in ("bool", "bool|None") else "value"


def read_wheel(wheel: Path) -> dict[str, Any]:
    """The flag table of the vLLM wheel at ``wheel`` (see module docstring).

    Raises:
        VendorError: not a ``vllm-X-*.whl`` file, or a source file/definition missing from it.
    """
    match = _WHEEL.match(Path(wheel).name)
    if match is None:
        raise VendorError(
            f"{wheel} is not a vLLM wheel (vllm-X-*.whl): download one with 'pip download --no-deps vllm==X'"
        )
    try:
        with zipfile.ZipFile(wheel) as archive:
            sources = {path: archive.read(path).decode() for path in (SPECULATIVE, ARG_UTILS, FRONTEND, QUANTIZATION)}
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise VendorError(f"{wheel}: cannot read the sources the flag table needs ({exc})") from exc
    trees = {path: ast.parse(text) for path, text in sources.items()}
    spec_fields = _fields(_class(trees[SPECULATIVE], "SpeculativeConfig"))
    engine = _class(trees[ARG_UTILS], "EngineArgs")
    engine_fields = _fields(engine)
    flags: dict[str, dict[str, Any]] = {}

    def add(flag: str, field_name: str | None, annotation: str | None, source: str) -> None:
        if flag.startswith("--") and flag not in flags:
            flags[flag] = {
                "field": field_name,
                "annotation": annotation,
                "kind": _kind(annotation or ""),
                "source": source,
            }

    for flag in _added_flags(_function(engine, "add_cli_args")):
        name = flag[2:].replace("-", "_")
        add(flag, name if name in engine_fields else None, engine_fields.get(name, {}).get("annotation"), ARG_UTILS)
    frontend: dict[str, dict[str, Any]] = {}
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        frontend.update(_fields(_class(trees[FRONTEND], cls)))
    for name, field in frontend.items():
        add("--" + name.replace("_", "-"), name, field["annotation"], FRONTEND)
    for flag in _added_flags(_function(trees[FRONTEND], "make_arg_parser")):
        add(flag, None, "bool" if flag in ("--headless", "--grpc") else None, FRONTEND)
    return {
        "tool": "vllm serve",
        "version": match.group("version"),
        "wheel": Path(wheel).name,
        "sources": [
            {"path": path, "read": what}
            for path, what in (
                (SPECULATIVE, "SpeculativeConfig fields, SpeculativeMethod literal"),
                (ARG_UTILS, "EngineArgs.add_cli_args add_argument names, EngineArgs field annotations"),
                (FRONTEND, "BaseFrontendArgs/FrontendArgs fields, make_arg_parser add_argument names"),
                (QUANTIZATION, "QuantizationMethods literal"),
            )
        ],
        "speculative_methods": _literal_values(trees[SPECULATIVE], "SpeculativeMethod"),
        "speculative_fields": spec_fields,
        # SpeculativeConfig._verify_args raises for it: "'tensor_parallel_size' is not a valid argument in the
        # speculative_config. Please pass 'draft_tensor_parallel_size' instead."
        "speculative_refused": {"tensor_parallel_size": "draft_tensor_parallel_size"},
        "quantization_methods": _literal_values(trees[QUANTIZATION], "QuantizationMethods"),
        "dtypes": _literal_values(ast.parse(_model_config_source(wheel)), "ModelDType"),
        "flags": dict(sorted(flags.items())),
    }


def _model_config_source(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read("vllm/config/model.py").decode()
        except KeyError as exc:
            raise VendorError(f"{wheel}: no vllm/config/model.py (ModelDType, the --dtype choices)") from exc


def main(argv: list[str] | None = None) -> int:
    """``python -m specpipe.vllm.vendor WHEEL [OUT]``: write the flag table (default: the vendored file)."""
    from specpipe.vllm.flagcheck import FLAGS_FILE

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m specpipe.vllm.vendor vllm-X-*.whl [flags.json]", file=sys.stderr)
        return 2
    out = Path(args[1]) if len(args) > 1 else FLAGS_FILE
    out.write_text(json.dumps(read_wheel(Path(args[0])), indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
