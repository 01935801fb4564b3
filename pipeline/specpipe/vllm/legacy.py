"""``specpipe build --from-vllm-args "..."``: a guide's ``vllm serve`` line, old flags included, as a spec.

Most published guides print speculative decoding flags vLLM has since removed. vLLM made the
speculative settings one JSON object, ``--speculative-config`` (vllm-project/vllm PR #14434), then
removed the old flags (PR #15466); block manager v1 was removed and v2 made the only one
(PR #8704), and ``--use-v2-block-manager`` went with it (PR #13492). What each old flag became in the
pinned release (:mod:`specpipe.vllm.release`; fields checked against ``flags.json``):

====================================================  =============================================
``--speculative-model M``                             ``speculative_config.model`` (``[ngram]``: ``method: ngram``)
``--num-speculative-tokens N``                        ``speculative_config.num_speculative_tokens``
``--speculative-draft-tensor-parallel-size N``,       ``speculative_config.draft_tensor_parallel_size``
``--draft-model-tp-size N``                           (1 or the target's TP; specpipe uses the target's)
``--target-model-tp-size N``                          ``--tensor-parallel-size N``
``--ngram-prompt-lookup-max/min N``                   ``speculative_config.prompt_lookup_max/min``
``--spec-decoding-acceptance-method``                 gone: ``rejection_sampler`` is the default
                                                      (``rejection_sample_method: standard``); typical
                                                      acceptance has no equivalent
``--speculative-max-model-len``, ``--speculative-     fields of ``speculative_config`` (kept out of the spec) or gone
disable-by-batch-size``, ``--speculative-disable-
mqa-scorer``, ``--speculative-model-quantization``,
``--typical-acceptance-sampler-posterior-*``
``--use-v2-block-manager``                            gone (nothing to pass)
====================================================  =============================================

Current flags that are part of a spec are read too (the model, ``--speculative-config``,
``--tensor-parallel-size``/``-tp``, ``--pipeline-parallel-size``/``-pp``, ``--max-model-len``,
``--max-num-seqs``, ``--quantization``/``-q``, ``--dtype``); other current ``vllm serve`` flags are
listed as not translated, and a flag neither current nor known as old is refused.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.errors import PresetError
from specpipe.presets import available_drafts, available_targets, load_draft, load_target
from specpipe.vllm import release
from specpipe.vllm.flagcheck import load_table

#: Old flags that take no value.
_SWITCHES = {"--use-v2-block-manager", "--speculative-disable-mqa-scorer"}
#: Old flags -> what they became (for the lines that report the change).
OLD_FLAGS: dict[str, str] = {
    "--speculative-model": "speculative_config.model",
    "--num-speculative-tokens": "speculative_config.num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "speculative_config.draft_tensor_parallel_size",
    "--draft-model-tp-size": "speculative_config.draft_tensor_parallel_size",
    "--target-model-tp-size": "--tensor-parallel-size",
    "--ngram-prompt-lookup-max": "speculative_config.prompt_lookup_max",
    "--ngram-prompt-lookup-min": "speculative_config.prompt_lookup_min",
    "--spec-decoding-acceptance-method": "speculative_config.rejection_sample_method",
    "--typical-acceptance-sampler-posterior-threshold": "removed with typical acceptance",
    "--typical-acceptance-sampler-posterior-alpha": "removed with typical acceptance",
    "--speculative-max-model-len": "speculative_config.max_model_len",
    "--speculative-disable-by-batch-size": "removed",
    "--speculative-disable-mqa-scorer": "removed",
    "--speculative-model-quantization": "speculative_config.quantization",
    "--use-v2-block-manager": "removed: block manager v2 is the only one",
}
_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-q": "--quantization",
    "-sc": "--speculative-config",
    "--speculative_config": "--speculative-config",
}
_PROGRAMS = (
    ("vllm", "serve"),
    ("python", "-m", "vllm.entrypoints.openai.api_server"),
    ("python3", "-m", "vllm.entrypoints.openai.api_server"),
)


class LegacyArgsError(PresetError):
    """A ``--from-vllm-args`` line specpipe cannot turn into a spec."""


@dataclass
class Translation:
    """What ``--from-vllm-args`` gives ``specpipe build``: ``options`` (``BuildRequest`` fields: target,
    draft, draft_model, max_draft_len, tp, pp, max_seq_len, max_batch_size, quantization, ngram_lookup) and one
    line per flag saying what it became (``changes``)."""

    options: dict[str, Any] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)

    def say(self, flag: str, what: str) -> None:
        self.changes.append(f"{flag}: {what}")


def _tokens(text: str) -> list[str]:
    try:
        words = shlex.split(text.replace("\\\n", " "))
    except ValueError as exc:
        raise LegacyArgsError(f"--from-vllm-args is not a shell command line ({exc}): quote it as one string") from None
    for program in _PROGRAMS:
        if tuple(words[: len(program)]) == program:
            return words[len(program) :]
    return words


def _target_for(model: str) -> str:
    """The target preset whose Hugging Face repo is ``model``, or ``model`` itself (a local directory)."""
    for name in available_targets():
        source = load_target(name).source
        if isinstance(source, dict) and source.get("repo_id") == model:
            return name
    if Path(model).is_dir():
        return model
    raise LegacyArgsError(
        f"model {model} is no target preset's Hugging Face repo ({', '.join(available_targets())}) "
        f"and no local directory: add a target preset, or give a checkpoint directory"
    )


def _draft_for(model: str, target: str | None) -> tuple[str, str | None]:
    """``(--draft, --draft-model)`` for a speculative model id: ``ngram``, the EAGLE preset for a head it
    lists, a draft-model preset whose repo it is, else ``--draft-model`` (method from its config)."""
    if model in ("[ngram]", "ngram"):
        return "ngram", None
    eagle = load_draft("eagle")
    heads = {head["repo_id"]: tgt for tgt, head in eagle.extra.get("heads", {}).items()}
    if model in heads:
        return "eagle", None if heads[model] == target else model
    for name in available_drafts():
        preset = load_draft(name)
        if isinstance(preset.source, dict) and preset.source.get("repo_id") == model:
            return name, None
    return "none", model


def _int(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise LegacyArgsError(f"{flag} takes an integer, got {value!r}") from None
    if number < 1:
        raise LegacyArgsError(f"{flag} must be >= 1, got {number}")
    return number


def translate(text: str) -> Translation:
    """Translate a ``vllm serve`` line (old or current flags) into build options and change lines.

    Raises:
        LegacyArgsError: no model, a flag neither current nor a known old one, a value that is not a number,
            typical acceptance (no equivalent), a model that is no target preset and no directory.
    """
    table = load_table()
    current = table["flags"]
    words = _tokens(text)
    t = Translation({"runtime": "vllm"})
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            if "target" in t.options:
                raise LegacyArgsError(f"--from-vllm-args: a second positional argument {word!r}: give one model")
            t.options["target"] = word
            i += 1
            continue
        name, _, inline = word.partition("=")
        name = _ALIASES.get(name, name)
        if name not in OLD_FLAGS and name not in current:
            raise LegacyArgsError(
                f"--from-vllm-args: {name} is neither a vLLM {release.VLLM_VERSION} flag nor an old "
                f"speculative flag specpipe knows: check the spelling"
            )
        switch = name in _SWITCHES or current.get(name, {}).get("kind") == "bool"
        if switch or inline:
            pairs.append((name, inline or None))
            i += 1
        elif i + 1 < len(words):
            pairs.append((name, words[i + 1]))
            i += 2
        else:
            raise LegacyArgsError(f"--from-vllm-args: {name} needs a value")
    for name, value in pairs:
        if name == "--model":
            t.options["target"] = value
    if "target" not in t.options:
        raise LegacyArgsError("--from-vllm-args has no model: give it as 'vllm serve MODEL ...'")
    model = t.options["target"]
    t.options["target"] = _target_for(model)
    t.say(model, f"--target {t.options['target']}")
    ngram: dict[str, int] = {}
    for name, value in pairs:
        _flag(t, name, value, ngram)
    if ngram:
        if t.options.get("draft") != "ngram":
            raise LegacyArgsError(
                "--ngram-prompt-lookup-max/min without an n-gram draft: add --speculative-model [ngram]"
            )
        high = ngram.get("max", ngram.get("min"))
        low = ngram.get("min", 1)
        t.options["ngram_lookup"] = (high, low)
    return t


def _flag(t: Translation, name: str, value: str | None, ngram: dict[str, int]) -> None:
    old = name in OLD_FLAGS
    became = OLD_FLAGS.get(name)
    if name in ("--model",):
        return
    if name == "--speculative-model":
        draft, draft_model = _draft_for(value, t.options["target"])
        t.options["draft"] = draft
        if draft_model is not None:
            t.options["draft_model"] = draft_model
        t.say(name, f"{became} -> --draft {draft}" + (f" --draft-model {draft_model}" if draft_model else ""))
    elif name == "--speculative-config":
        try:
            config = json.loads(value or "")
        except ValueError as exc:
            raise LegacyArgsError(f"--speculative-config is not JSON ({exc})") from None
        if "model" in config or config.get("method") in ("ngram", "[ngram]"):
            draft, draft_model = _draft_for(config.get("model") or "ngram", t.options["target"])
            t.options["draft"] = draft
            if draft_model is not None:
                t.options["draft_model"] = draft_model
        if "num_speculative_tokens" in config:
            t.options["max_draft_len"] = _int("num_speculative_tokens", str(config["num_speculative_tokens"]))
        t.say(
            name,
            f"current flag, read: --draft {t.options.get('draft', 'none')}"
            + (f", --max-draft-len {t.options['max_draft_len']}" if "max_draft_len" in t.options else ""),
        )
    elif name == "--num-speculative-tokens":
        t.options["max_draft_len"] = _int(name, value)
        t.say(name, f"{became} -> --max-draft-len {value}")
    elif name in ("--speculative-draft-tensor-parallel-size", "--draft-model-tp-size"):
        t.say(
            name,
            f"{became}: vLLM allows 1 or the target's TP; specpipe runs the draft at the target's TP "
            f"({value} not carried over)",
        )
    elif name in ("--target-model-tp-size", "--tensor-parallel-size"):
        t.options["tp"] = _int(name, value)
        t.say(name, f"--tensor-parallel-size -> --tp {value}" if old else f"current flag -> --tp {value}")
    elif name == "--pipeline-parallel-size":
        t.options["pp"] = _int(name, value)
        t.say(name, f"current flag -> --pp {value}")
    elif name in ("--ngram-prompt-lookup-max", "--ngram-prompt-lookup-min"):
        ngram[name.rsplit("-", 1)[1]] = _int(name, value)
        t.say(name, f"{became} = {value}")
    elif name == "--spec-decoding-acceptance-method":
        if value == "typical_acceptance_sampler":
            methods = ("standard", "synthetic", "block", "fly")  # RejectionSampleMethod, vllm/config/speculative.py
            raise LegacyArgsError(
                f"{name} typical_acceptance_sampler: vLLM {release.VLLM_VERSION} has no typical "
                f"acceptance (rejection_sample_method: {', '.join(methods)}): drop the flag for "
                f"rejection sampling (the target's distribution kept)"
            )
        t.say(name, f"removed: {value} is vLLM's default now (rejection_sample_method standard), nothing to pass")
    elif name in ("--max-model-len",):
        t.options["max_seq_len"] = _int(name, value)
        t.say(name, f"current flag -> --max-seq-len {value}")
    elif name == "--max-num-seqs":
        t.options["max_batch_size"] = _int(name, value)
        t.say(name, f"current flag -> --max-batch-size {value}")
    elif name == "--quantization":
        mapped = {"fp8": "fp8", "int8_per_channel_weight_only": "int8-wo"}.get(value or "")
        if mapped is None:
            raise LegacyArgsError(
                f"--quantization {value}: specpipe plans vLLM's online quantizations only (fp8, "
                f"int8_per_channel_weight_only): use --quantization fp8, or a quantized checkpoint "
                f"directory as the model"
            )
        t.options["quantization"] = mapped
        t.say(name, f"current flag -> --quantization {mapped}")
    elif name == "--dtype":
        mapped = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "auto": None}.get(value or "", "?")
        if mapped == "?":
            raise LegacyArgsError(f"--dtype {value}: use bfloat16 or float16")
        if mapped and "quantization" not in t.options:
            t.options["quantization"] = mapped
        t.say(name, f"current flag -> --quantization {mapped or 'auto'}")
    elif old and became.startswith("removed"):
        t.say(name, f"{became}: dropped")
    elif old:
        t.say(name, f"now {became}, not part of a specpipe spec: dropped")
    else:
        t.say(
            name,
            "current vllm serve flag, not part of a specpipe spec: not translated (specpipe serve sets ports and host)",
        )
