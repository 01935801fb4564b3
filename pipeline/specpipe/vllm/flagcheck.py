"""Checks a ``vllm serve`` argument vector and its ``--speculative-config`` against vLLM's own definitions.

``flags.json`` (written by :mod:`specpipe.vllm.vendor` from the wheel of :data:`specpipe.vllm.release.WHEEL`)
holds the flags ``vllm serve`` registers, the kind of each (``bool`` switches, or flags taking a value,
with the ``EngineArgs``/``FrontendArgs`` annotation), the ``SpeculativeConfig`` fields, the
``speculative_config.method`` values and the ``--quantization``/``--dtype`` choices. Parsing is exact
(argparse abbreviations are not used): a flag missing from the table is an error.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from specpipe.errors import SpecpipeError
from specpipe.vllm import release

FLAGS_FILE = Path(__file__).resolve().parent / "flags.json"
PROGRAM = ("vllm", "serve")


class InvalidVllmCommandError(SpecpipeError):
    """A generated ``vllm serve`` command or speculative config does not match vLLM's definitions (a specpipe defect)."""


@cache
def load_table() -> dict[str, Any]:
    """The vendored flag table; its ``version`` must be the pinned release.

    Raises:
        InvalidVllmCommandError: the table was read from another vLLM release than :data:`release.VLLM_VERSION`.
    """
    table = json.loads(FLAGS_FILE.read_text())
    if table["version"] != release.VLLM_VERSION:
        raise InvalidVllmCommandError(
            f"{FLAGS_FILE.name} was read from vLLM {table['version']}, the pin is {release.VLLM_VERSION}: regenerate it "
            f"with 'python -m specpipe.vllm.vendor {release.WHEEL}'"
        )
    return table


def check_speculative_config(config: dict[str, Any]) -> None:
    """``config`` must be a ``SpeculativeConfig`` vLLM accepts: known, user-settable fields, a built-in
    ``method``, ``num_speculative_tokens`` >= 1 (``Field(gt=0)``, required), ``prompt_lookup_*`` >= 1,
    a known draft ``quantization``.

    Raises:
        InvalidVllmCommandError: the first defect, naming the field.
    """
    table = load_table()
    fields, refused = table["speculative_fields"], table["speculative_refused"]
    where = f"vLLM {table['version']} speculative_config"
    for key in config:
        if key in refused:
            raise InvalidVllmCommandError(f"{where}: {key!r} is refused by SpeculativeConfig, use {refused[key]!r}")
        field = fields.get(key)
        if field is None:
            raise InvalidVllmCommandError(
                f"{where}: unknown field {key!r} (SpeculativeConfig has {', '.join(sorted(fields))})"
            )
        if not field["init"] or "SkipValidation" in field["annotation"]:
            raise InvalidVllmCommandError(f"{where}: {key!r} is set by vLLM itself, not by the user")
    method = config.get("method")
    if method is not None and method not in table["speculative_methods"]:
        raise InvalidVllmCommandError(f"{where}: method {method!r} is not one of {table['speculative_methods']}")
    tokens = config.get("num_speculative_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise InvalidVllmCommandError(f"{where}: num_speculative_tokens must be an int >= 1, got {tokens!r}")
    for key in ("prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size", "max_model_len"):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InvalidVllmCommandError(f"{where}: {key} must be an int >= 1, got {value!r}")
    if config.get("prompt_lookup_min", 1) > config.get("prompt_lookup_max", 1 << 30):
        raise InvalidVllmCommandError(f"{where}: prompt_lookup_min exceeds prompt_lookup_max")
    quantization = config.get("quantization")
    if quantization is not None and quantization not in table["quantization_methods"]:
        raise InvalidVllmCommandError(f"{where}: quantization {quantization!r} is not a vLLM quantization method")
    if method in ("eagle", "eagle3", "draft_model") and not config.get("model"):
        raise InvalidVllmCommandError(f"{where}: method {method!r} needs 'model' (the draft weights)")


def _value(flag: str, spec: dict[str, Any], value: str, table: dict[str, Any]) -> Any:
    annotation = (spec.get("annotation") or "").replace(" ", "")
    if annotation.startswith("int"):
        try:
            return int(value)
        except ValueError:
            raise InvalidVllmCommandError(f"vllm serve: {flag} takes an int, got {value!r}") from None
    if annotation.startswith("float"):
        try:
            return float(value)
        except ValueError:
            raise InvalidVllmCommandError(f"vllm serve: {flag} takes a float, got {value!r}") from None
    choices = {"--quantization": table["quantization_methods"], "--dtype": table["dtypes"]}.get(flag)
    if choices is not None and value not in choices:
        raise InvalidVllmCommandError(f"vllm serve: {flag} {value!r} is not one of {choices}")
    if flag == "--speculative-config":
        try:
            config = json.loads(value)
        except ValueError as exc:
            raise InvalidVllmCommandError(f"vllm serve: --speculative-config is not JSON ({exc})") from None
        if not isinstance(config, dict):
            raise InvalidVllmCommandError("vllm serve: --speculative-config must be a JSON object")
        check_speculative_config(config)
        return config
    return value


def parse_serve_argv(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` (``vllm serve MODEL --flag value ...``) against the table; returns ``{"model": MODEL,
    flag: value}`` (``True``/``False`` for switches, the parsed object for ``--speculative-config``).

    Raises:
        InvalidVllmCommandError: another program, no model, an unknown flag (e.g. the removed
            ``--speculative-model``), a missing value, a bad int/choice, a flag given twice, a bad speculative config.
    """
    table = load_table()
    flags = table["flags"]
    if tuple(argv[:2]) != PROGRAM:
        raise InvalidVllmCommandError(f"command must start with {list(PROGRAM)}, got {argv[:2]}")
    if len(argv) < 3 or argv[2].startswith("-"):
        raise InvalidVllmCommandError("vllm serve: the model (positional model_tag) must follow 'vllm serve'")
    parsed: dict[str, Any] = {"model": argv[2]}
    tokens: list[str] = []
    for token in argv[3:]:
        tokens += token.split("=", 1) if token.startswith("--") and "=" in token else [token]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        negated = token.startswith("--no-") and flags.get("--" + token[5:], {}).get("kind") == "bool"
        name = "--" + token[5:] if negated else token
        spec = flags.get(name)
        if spec is None:
            raise InvalidVllmCommandError(f"vllm serve {table['version']}: unknown flag {token!r}")
        if name in parsed:
            raise InvalidVllmCommandError(f"vllm serve: {name} given twice")
        if spec["kind"] == "bool":
            parsed[name] = not negated
            i += 1
            continue
        if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
            raise InvalidVllmCommandError(f"vllm serve: {name} needs a value")
        parsed[name] = _value(name, spec, tokens[i + 1], table)
        i += 2
    return parsed
