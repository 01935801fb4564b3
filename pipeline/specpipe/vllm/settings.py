"""What vLLM runs of a spec: its method spelling, its quantization spelling, and the speculative config.

vLLM 0.34.0 (:mod:`specpipe.vllm.release`) drafts a chain of ``num_speculative_tokens`` (its
``SpeculativeConfig`` has no token tree), so EAGLE runs as a chain there (the preset's
``llmapi_max_draft_len``, as on TensorRT-LLM's LLM API) and ``--choices`` is refused. Methods the
registry gives no ``vllm_method`` (Medusa, lookahead) are refused with the nearest method vLLM runs.

Quantizations (specpipe name -> ``vllm serve --quantization``), all applied online to the 16-bit
checkpoint: ``bf16``/``fp16`` none (``--dtype`` only); ``fp8`` -> ``fp8`` (dynamic FP8 weights);
``int8-wo`` -> ``int8_per_channel_weight_only`` (an online shorthand of the ``QuantizationMethods`` literal,
``vllm/model_executor/layers/quantization/__init__.py`` in the 0.34.0 wheel). ``int4-awq`` needs a
checkpoint already quantized with AWQ (vLLM's ``awq`` reads one, it quantizes nothing) and ``int4-wo`` has
no online shorthand: both are refused.
"""

from __future__ import annotations

from typing import Any, Callable

from specpipe.build_request import BuildRequest
from specpipe.errors import CompatibilityError, PresetError
from specpipe.speculative import (
    METHODS,
    NGRAM_MATCH_DEFAULT,
    VLLM_FLAVOUR_METHODS,
    Method,
    Runtime,
    SpeculativeSettings,
    entry_for,
    methods_for,
    spec_of,
)
from specpipe.trtllm.draft_settings import LLMAPI_EAGLE_CHAIN
from specpipe.trtllm.resolve import Draft, Target
from specpipe.vllm import release

#: specpipe quantization -> ``vllm serve --quantization`` value (``None``: none, the checkpoint's dtype).
QUANTIZATIONS: dict[str, str | None] = {
    "bf16": None,
    "fp16": None,
    "fp8": "fp8",
    "int8-wo": "int8_per_channel_weight_only",
}
#: specpipe quantizations vLLM cannot apply to a 16-bit checkpoint -> why, and the nearest that works.
REFUSED_QUANTIZATIONS: dict[str, str] = {
    "int4-awq": "vLLM's 'awq' reads a checkpoint already quantized with AWQ and quantizes nothing itself: use "
    "--quantization fp8 or int8-wo (online), or pass an AWQ checkpoint directory as --target",
    "int4-wo": "vLLM 0.34.0 has no online int4 weight-only quantization: use --quantization int8-wo",
}
DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}


def vllm_method(method: Method | str, flavour: str | None) -> str | None:
    """vLLM's ``speculative_config.method`` for ``method`` with a checkpoint of ``flavour`` (``None``: plain decoding)."""
    spec = spec_of(method)
    return VLLM_FLAVOUR_METHODS.get(flavour or "", spec.vllm_method) if spec.vllm_method else None


def nearest_method(method: Method | str) -> Method | None:
    """The method vLLM runs that is closest to ``method``: the first in registry order with the same kind of
    draft weights (heads, a model, none), speculating; ``None`` if there is none."""
    weights = spec_of(method).weights
    for candidate in methods_for(Runtime.VLLM):
        if candidate is not Method.NONE and METHODS[candidate].weights == weights:
            return candidate
    return None


def check_method(name: str, method: Method | str) -> None:
    """Refuse a method vLLM has no ``speculative_config.method`` for (draft preset ``name`` of ``method``),
    naming the nearest choice.

    Raises:
        CompatibilityError: the method, why, the nearest method on ``--runtime vllm`` and the runtimes that run it.
    """
    spec = spec_of(method)
    if spec.runs_on(Runtime.VLLM) and (spec.vllm_method is not None or spec.method is Method.NONE):
        return
    near = nearest_method(spec.method)
    others = " or ".join(f"--runtime {r.value}" for r in sorted(spec.runtimes, key=lambda r: r.value))
    raise CompatibilityError(
        f"--draft {name} ({spec.method.value}) has no vLLM {release.VLLM_VERSION} speculative method "
        f"(speculative_config.method has no {spec.method.value}): use "
        + (f"--draft {near.value} ({METHODS[near].description}) with --runtime vllm, or " if near else "")
        + f"{others}"
    )


def resolve_quantization(name: str, target: Target) -> tuple[str, str | None]:
    """``(specpipe scheme name, vllm --quantization value or None)`` for ``--quantization name`` (``auto``: the
    checkpoint's 16-bit dtype).

    Raises:
        CompatibilityError: a quantization vLLM cannot apply online (:data:`REFUSED_QUANTIZATIONS`).
    """
    if name == "auto":
        name = "fp16" if target.dtype == "float16" else "bf16"
    if name in REFUSED_QUANTIZATIONS:
        raise CompatibilityError(f"--quantization {name} on --runtime vllm: {REFUSED_QUANTIZATIONS[name]}")
    return name, QUANTIZATIONS[name]


def resolve_speculative(request: BuildRequest, draft: Draft) -> SpeculativeSettings:
    """The chain vLLM drafts: ``max_draft_len`` from ``--max-draft-len``, else the preset (EAGLE:
    ``llmapi_max_draft_len``), else the registry; n-gram's ``max_matching_ngram_size`` from the preset.

    Raises:
        PresetError: ``--choices``/``--lookahead`` (vLLM drafts no tree and has no lookahead), ``--max-draft-len``
            with ``--draft none``.
    """
    method, settings = Method(draft.method), draft.preset.speculative
    if request.choices is not None:
        raise PresetError(
            f"--choices on --runtime vllm: vLLM {release.VLLM_VERSION} drafts a chain of "
            f"num_speculative_tokens (no token tree): drop --choices, set --max-draft-len"
        )
    if request.lookahead is not None:
        raise PresetError(
            "--lookahead on --runtime vllm: vLLM has no lookahead decoding: drop it (or --runtime trtllm)"
        )
    base = SpeculativeSettings(method, flavour=draft.flavour)
    if method is Method.NONE:
        if request.max_draft_len is not None:
            raise PresetError("--max-draft-len has no meaning with --draft none (no draft tokens): drop it")
        return base
    default = (
        settings.get("llmapi_max_draft_len", LLMAPI_EAGLE_CHAIN)
        if method is Method.EAGLE
        else settings.get("max_draft_len", spec_of(method).max_draft_len)
    )
    chain = base.with_(max_draft_len=request.max_draft_len or int(default))
    if method is Method.NGRAM:
        longest = (
            request.ngram_lookup[0]
            if request.ngram_lookup
            else settings.get("max_matching_ngram_size", NGRAM_MATCH_DEFAULT)
        )
        chain = chain.with_(max_matching_ngram_size=int(longest))
    elif request.ngram_lookup is not None:
        raise PresetError(f"n-gram lookup sizes have no meaning with {method.value}: use --draft ngram")
    return chain


def model_reference(source: dict[str, Any] | None) -> tuple[str, str | None]:
    """``(what vLLM loads, revision)``: a Hugging Face id with its revision, or a local path (no revision)."""
    if source is None:
        raise PresetError("no weights source: give --draft-model")
    if source.get("kind") == "hf":
        return str(source["repo_id"]), str(source.get("revision") or "main")
    return str(source["path"]), None


def speculative_config(spec: SpeculativeSettings, draft: Draft, tp: int, lookup_min: int = 1) -> dict[str, Any] | None:
    """The ``--speculative-config`` object (``None`` for plain decoding): ``method``, ``num_speculative_tokens``,
    the draft ``model`` (and ``revision``), n-gram's ``prompt_lookup_max`` (= ``max_matching_ngram_size``) and
    ``prompt_lookup_min`` (``lookup_min``; 1 by default: every match length down to one token, as specpipe's
    n-gram lookup),
    and a draft model's ``draft_tensor_parallel_size`` (the target's TP, vLLM's default made explicit)."""
    method = vllm_method(spec.method, draft.flavour)
    if method is None:
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": spec.max_draft_len}
    if spec.spec.weights is not None:
        model, revision = model_reference(draft.source)
        config["model"] = model
        if revision is not None:
            config["revision"] = revision
    config.update(entry_for(CONFIG_KEYS, spec.method, "vllm.settings.CONFIG_KEYS")(spec, tp, lookup_min))
    return config


#: Each speculating vLLM method's own ``--speculative-config`` keys, from ``(settings, tp, lookup_min)``
#: (see :func:`speculative_config`).
CONFIG_KEYS: dict[Method, Callable[[SpeculativeSettings, int, int], dict[str, Any]]] = {
    Method.NGRAM: lambda spec, tp, lookup_min: {
        "prompt_lookup_max": spec.max_matching_ngram_size,
        "prompt_lookup_min": lookup_min,
    },
    Method.DRAFT_MODEL: lambda spec, tp, lookup_min: {"draft_tensor_parallel_size": tp},
    Method.EAGLE: lambda spec, tp, lookup_min: {},
}
