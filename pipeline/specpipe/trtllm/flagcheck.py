"""Checks an argument vector against TensorRT-LLM's own flag definitions, held as data.

``flags/*.json`` transcribes the argparse definitions of each TensorRT-LLM tool specpipe runs
(``trtllm-build``, the llama/EAGLE/Medusa ``convert_checkpoint.py`` and ``quantize.py``): names,
aliases, types, choices, defaults, ``nargs``/``store_true``, the flags specpipe treats as required,
and the cross-flag combinations the tool rejects at run time. Each file names its source path and
commit. :func:`check_argv` parses a vector the way argparse would (exact names only, no prefix
abbreviations) and raises :class:`InvalidCommandError` on the first defect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from specpipe.errors import SpecpipeError

FLAGS_DIR = Path(__file__).resolve().parent / "flags"

TOOLS = {
    "trtllm-build": "trtllm-build.json",
    "llama-convert": "llama-convert_checkpoint.json",
    "eagle-convert": "eagle-convert_checkpoint.json",
    "medusa-convert": "medusa-convert_checkpoint.json",
    "quantize": "quantize.json",
}


class InvalidCommandError(SpecpipeError):
    """A generated command line does not match the tool's flag definitions (a specpipe defect)."""


@dataclass(frozen=True)
class ToolFlags:
    """One tool's flag table (see module docstring)."""

    key: str
    tool: str
    program: tuple[str, ...]
    flags: dict[str, dict[str, Any]]
    aliases: dict[str, str]
    required: tuple[str, ...]
    required_one_of: tuple[tuple[str, ...], ...]
    rejections: tuple[str, ...]
    sources: tuple[dict[str, str], ...]


@cache
def load_tool(key: str) -> ToolFlags:
    """The flag table of tool ``key`` (one of :data:`TOOLS`)."""
    data = json.loads((FLAGS_DIR / TOOLS[key]).read_text())
    aliases = {}
    for name, spec in data["flags"].items():
        for alias in spec.get("aliases", ()):
            aliases[alias] = name
    return ToolFlags(
        key=key,
        tool=data["tool"],
        program=tuple(data["program"]),
        flags=data["flags"],
        aliases=aliases,
        required=tuple(data.get("required", ())),
        required_one_of=tuple(tuple(g) for g in data.get("required_one_of", ())),
        rejections=tuple(r["rule"] for r in data.get("rejections", ())),
        sources=tuple(data["sources"]),
    )


def _program_matches(pattern: tuple[str, ...], argv: list[str]) -> bool:
    if len(argv) < len(pattern):
        return False
    for want, got in zip(pattern, argv):
        if want.startswith("{examples}/"):
            if not got.endswith("/" + want[len("{examples}/") :]):
                return False
        elif want != got:
            return False
    return True


def _check_value(tool: ToolFlags, flag: str, spec: dict[str, Any], value: str) -> Any:
    kind = spec.get("type", "str")
    try:
        parsed: Any = {"int": int, "float": float, "str": str}[kind](value)
    except ValueError:
        raise InvalidCommandError(f"{tool.tool}: {flag} takes a {kind}, got {value!r}") from None
    choices = spec.get("choices")
    if choices is not None and parsed not in choices:
        raise InvalidCommandError(f"{tool.tool}: {flag} {value!r} is not one of {choices}")
    allowed = spec.get("allowed")
    if allowed is not None and parsed not in allowed:
        raise InvalidCommandError(f"{tool.tool}: {flag} {value!r} is rejected by the script (allowed: {allowed})")
    return parsed


def parse_argv(key: str, argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` (program first) like the tool's argparse parser; return ``{flag: value}``.

    ``store_true`` flags map to ``True``; ``nargs`` flags to lists.

    Raises:
        InvalidCommandError: wrong program, unknown flag, missing/extra value, bad type or choice,
            a flag given twice.
    """
    tool = load_tool(key)
    if not _program_matches(tool.program, argv):
        raise InvalidCommandError(f"{tool.tool}: command must start with {list(tool.program)}, got {argv[:2]}")
    args: list[str] = []
    for token in argv[len(tool.program) :]:  # argparse's --flag=value form
        if token.startswith("--") and "=" in token:
            args += token.split("=", 1)
        else:
            args.append(token)
    parsed: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            raise InvalidCommandError(f"{tool.tool}: unexpected positional argument {token!r}")
        name = tool.aliases.get(token, token)
        spec = tool.flags.get(name)
        if spec is None:
            raise InvalidCommandError(f"{tool.tool}: unknown flag {token} (not defined by {tool.sources[0]['path']})")
        if name in parsed:
            raise InvalidCommandError(f"{tool.tool}: {name} given twice")
        i += 1
        values: list[str] = []
        while i < len(args) and not (args[i].startswith("--") or (args[i].startswith("-") and args[i] in tool.aliases)):
            values.append(args[i])
            i += 1
        if spec.get("action") == "store_true":
            if values:
                raise InvalidCommandError(f"{tool.tool}: {name} is a switch and takes no value, got {values}")
            parsed[name] = True
            continue
        nargs = spec.get("nargs")
        if nargs == "+":
            if not values:
                raise InvalidCommandError(f"{tool.tool}: {name} needs at least one value")
            parsed[name] = [_check_value(tool, name, spec, v) for v in values]
        elif nargs == "?":
            if len(values) > 1:
                raise InvalidCommandError(f"{tool.tool}: {name} takes at most one value, got {values}")
            parsed[name] = _check_value(tool, name, spec, values[0] if values else spec["const"])
        elif isinstance(nargs, int):
            if len(values) != nargs:
                raise InvalidCommandError(f"{tool.tool}: {name} takes {nargs} values, got {values}")
            parsed[name] = [_check_value(tool, name, spec, v) for v in values]
        else:
            if len(values) != 1:
                raise InvalidCommandError(f"{tool.tool}: {name} takes exactly one value, got {values or 'none'}")
            parsed[name] = _check_value(tool, name, spec, values[0])
    return parsed


def _get(parsed: dict[str, Any], tool: ToolFlags, flag: str) -> Any:
    if flag in parsed:
        return parsed[flag]
    default = tool.flags[flag].get("default")
    return False if tool.flags[flag].get("action") == "store_true" else default


def _check_rejections(tool: ToolFlags, parsed: dict[str, Any]) -> None:
    """The run-time rejections transcribed in the tool's data file (``rejections``)."""
    get = lambda flag: _get(parsed, tool, flag)  # noqa: E731
    for rule in tool.rejections:
        if rule == "no_context_logits_with_draft":
            if (get("--gather_context_logits") or get("--gather_all_token_logits")) and get("--max_draft_len") > 0:
                raise InvalidCommandError("trtllm-build rejects --gather_context_logits with --max_draft_len > 0")
        elif rule == "no_streamingllm":
            if get("--streamingllm") == "enable":
                raise InvalidCommandError("trtllm-build 1.2 no longer supports --streamingllm enable")
        elif rule == "pp_reduce_scatter_mixtral_only":
            if get("--pp_reduce_scatter") == "enable":
                raise InvalidCommandError("trtllm-build allows --pp_reduce_scatter only for Mixtral")
        elif rule == "multiple_profiles_without_opt_num_tokens":
            if get("--multiple_profiles") == "enable" and get("--opt_num_tokens") is not None:
                raise InvalidCommandError("trtllm-build rejects --multiple_profiles enable with --opt_num_tokens")
        elif rule == "eagle_limits":
            if get("--speculative_decoding_mode") == "eagle" and (
                get("--max_batch_size") > 512 or get("--max_draft_len") > 256
            ):
                raise InvalidCommandError(
                    "trtllm-build (EAGLE) needs --max_batch_size <= 512 and --max_draft_len <= 256"
                )
        elif rule == "eagle_pp_must_be_1":
            if get("--pp_size") != 1:
                raise InvalidCommandError("EAGLE convert_checkpoint.py asserts --pp_size 1")
        elif rule == "eagle_max_draft_len_256":
            if get("--max_draft_len") > 256:
                raise InvalidCommandError("EAGLE convert_checkpoint.py asserts --max_draft_len <= 256")
        elif rule == "int4_awq_needs_quantize_py":
            if get("--use_weight_only") and get("--weight_only_precision") == "int4_awq":
                raise InvalidCommandError(
                    "llama convert_checkpoint.py does not quantize to AWQ: use quantize.py --qformat int4_awq"
                )
        elif rule == "quant_ckpt_path_only_gptq":
            if get("--quant_ckpt_path") is not None and get("--weight_only_precision") not in (
                "int4_gptq",
                "int8_gptq",
            ):
                raise InvalidCommandError("llama convert_checkpoint.py takes --quant_ckpt_path only for GPTQ/QServe")
        elif rule == "medusa_model_type":
            pass  # checked as the flag's "allowed" values
        else:  # pragma: no cover - a data file names a rule this module does not know
            raise InvalidCommandError(f"{tool.tool}: unknown rejection rule {rule!r} in the flag data")


def check_argv(key: str, argv: list[str]) -> dict[str, Any]:
    """Validate ``argv`` for tool ``key``: flags, values, required flags and rejected combinations.

    Returns the parsed ``{flag: value}``.

    Raises:
        InvalidCommandError: the first defect found.
    """
    tool = load_tool(key)
    parsed = parse_argv(key, argv)
    for flag in tool.required:
        if flag not in parsed:
            raise InvalidCommandError(f"{tool.tool}: required flag {flag} is missing")
    for group in tool.required_one_of:
        if not any(flag in parsed for flag in group):
            raise InvalidCommandError(f"{tool.tool}: one of {', '.join(group)} is required")
    _check_rejections(tool, parsed)
    return parsed
