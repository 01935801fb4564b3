"""Memory plan per GPU for a TensorRT-LLM engine-flow deployment (all figures in bytes).

Weights per GPU (one TP x PP rank; the largest rank is reported):
    * decoder layers: ``ceil(L / PP)`` layers of ``h*q + 2*h*kv + q*h + 3*h*i`` weights (q = heads x
      head_dim, kv = KV heads x head_dim; Llama attention + SwiGLU MLP), at the scheme's bytes per
      weight, divided by TP (TensorRT-LLM shards attention and MLP column/row-wise);
    * embedding table ``V*h`` at 16 bits on every TP rank (``--use_parallel_embedding`` is off by
      default in ``examples/models/core/llama/convert_checkpoint.py`` @ fd96a08) on the first PP stage;
    * ``lm_head`` ``V*h`` at 16 bits split over TP on the last PP stage (quantize.py leaves lm_head
      unquantized unless ``--quantize_lm_head``; quantize.py @ c8c6df0). Tied embeddings still get
      an lm_head in the engine.
    * EAGLE (engine flow): ``num_eagle_layers`` EagleNets, each a copy of the head's decoder layer,
      ``fc`` (``2h x h``), its own embedding table and ``lm_head`` (``examples/eagle/convert_checkpoint.py``
      @ 65b31db loads one copy per net), at 16 bits.
    * Medusa: per head ``layers x (h*h + h)`` + ``V*h``, 16 bits (heads unquantized without
      ``--quant_medusa_head``), split over TP.
    * Draft model (draft-target): its own weights by the same rules, at the target's scheme.

KV cache per GPU: ``2 (K and V) x ceil(L / PP) x max(1, KV / TP) x head_dim x kv_bytes x max_batch_size
x max_seq_len_engine`` where ``max_seq_len_engine = max_seq_len + max_draft_len`` (+ ``num_eagle_layers``
for EAGLE): ``trtllm-build`` raises ``max_seq_len`` by these (tensorrt_llm/builder.py ``build()``, index
copy id 205252225). EAGLE nets add ``num_eagle_layers`` attention layers of the target's KV shape; a
draft model adds its own KV cache at ``max_seq_len``. This is the cache needed to hold every sequence
at full length; at run time TensorRT-LLM sizes the pool from ``kv_cache_free_gpu_mem_fraction``.

Activations (estimate): ``max_num_tokens x (4h + (2i + q + 2kv) / TP) x 2`` bytes for the engine's
largest step, with ``max_num_tokens = max(8192, max_batch_size x (max_draft_len + 1))`` (trtllm-build's
default and builder.py's raise for speculative modes), plus ``max_batch_size x (max_draft_len + 1) x V / TP
x 4`` bytes of float32 logits. Runtime overhead (estimate): 1 GiB per engine (CUDA context, cuBLAS,
NCCL and TensorRT runtime). A plan fits when the total is at most 95 % of the GPU's memory (the rest is
left to allocator fragmentation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from specpipe.presets import Architecture
from specpipe.speculative import Method, entry_for
from specpipe.trtllm.gpus import GIB, Gpu
from specpipe.trtllm.quant import Scheme

USABLE_FRACTION = 0.95
RUNTIME_OVERHEAD_BYTES = 1 * GIB
DEFAULT_MAX_NUM_TOKENS = 8192


def layer_weights(arch: Architecture) -> int:
    """Weights of one Llama decoder layer (attention + SwiGLU MLP; norms excluded), count."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return h * q + 2 * h * kv + q * h + 3 * h * i


def kv_heads_per_rank(arch: Architecture, tp: int) -> int:
    """KV heads held by one TP rank: ``KV / TP``, or 1 when TP exceeds KV (heads replicated)."""
    return max(1, arch.num_kv_heads // tp)


def model_weight_bytes(arch: Architecture, scheme: Scheme, tp: int, pp: int) -> int:
    """Weights (bytes) of the largest rank of a decoder-only model (see module docstring)."""
    layers = math.ceil(arch.num_layers / pp)
    stage = layers * (layer_weights(arch) * scheme.weight_bytes + 2 * arch.hidden_size * 2) / tp
    embed = arch.vocab_size * arch.hidden_size * 2
    lm_head = arch.vocab_size * arch.hidden_size * 2 / tp
    if pp == 1:
        return int(embed + lm_head + stage)
    return int(max(embed, lm_head) + stage)


def kv_cache_bytes(arch: Architecture, layers: int, tp: int, pp: int, kv_bytes: int, batch: int, seq_len: int) -> int:
    """KV cache (bytes) on the largest rank for ``layers`` attention layers, full batch and length."""
    per_rank_layers = math.ceil(layers / pp)
    return 2 * per_rank_layers * kv_heads_per_rank(arch, tp) * arch.head_dim * kv_bytes * batch * seq_len


def eagle_weight_bytes(target: Architecture, num_eagle_layers: int, tp: int) -> int:
    """Weights (bytes, 16-bit) of the EAGLE nets on one TP rank (num_eagle_layers copies)."""
    h, v = target.hidden_size, target.vocab_size
    per_net = (layer_weights(target) + 2 * h * h + h) * 2 / tp + v * h * 2 + v * h * 2 / tp
    return int(num_eagle_layers * per_net)


def medusa_weight_bytes(hidden: int, vocab: int, heads: int, layers: int, tp: int) -> int:
    """Weights (bytes, 16-bit) of the Medusa heads on one TP rank."""
    return int(heads * (layers * (hidden * hidden + hidden) + vocab * hidden) * 2 / tp)


def activation_bytes(arch: Architecture, tp: int, batch: int, draft_len: int) -> int:
    """Activation workspace estimate (bytes) for the engine's largest step (see module docstring)."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    tokens = max(DEFAULT_MAX_NUM_TOKENS, batch * (draft_len + 1))
    act = tokens * (4 * h + (2 * i + q + 2 * kv) / tp) * 2
    logits = batch * (draft_len + 1) * arch.vocab_size / tp * 4
    return int(act + logits)


@dataclass
class MemoryPlan:
    """Per-GPU memory figures (bytes) and whether they fit ``gpu`` (``None``: no GPU named)."""

    tp: int
    pp: int
    target_weights: int
    draft_weights: int
    target_kv_cache: int
    draft_kv_cache: int
    activations: int
    runtime_overhead: int
    gpu: str | None = None
    gpu_memory: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return (
            self.target_weights
            + self.draft_weights
            + self.target_kv_cache
            + self.draft_kv_cache
            + self.activations
            + self.runtime_overhead
        )

    @property
    def usable(self) -> int | None:
        return None if self.gpu_memory is None else int(self.gpu_memory * USABLE_FRACTION)

    @property
    def fits(self) -> bool | None:
        return None if self.usable is None else self.total <= self.usable

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(total=self.total, usable=self.usable, fits=self.fits, gpus=self.tp * self.pp, unit="bytes")
        return data


@dataclass(frozen=True)
class DraftInputs:
    """What a method's memory terms read: the target, the scheme and sizes of the plan, and the method's own
    settings (``num_eagle_layers``: EAGLE nets; ``medusa``: (heads, layers per head); ``draft_arch``: the
    draft model's architecture; each ``None``/0 where the plan has none)."""

    target: Architecture
    scheme: Scheme
    tp: int
    pp: int
    batch: int
    max_seq_len: int
    max_draft_len: int
    num_eagle_layers: int
    medusa: tuple[int, int] | None
    draft_arch: Architecture | None


@dataclass(frozen=True)
class DraftTerms:
    """A method's terms in the memory plan (see the module docstring).

    Attributes:
        extra_seq: tokens ``trtllm-build`` adds to ``max_seq_len`` (the KV cache's length).
        extra_kv_layers: attention layers of the target's KV shape the method adds (EAGLE nets).
        weights, kv_cache: the draft's weights and KV cache on the largest rank (bytes).
        engines: engines beside the target's (each costs :data:`RUNTIME_OVERHEAD_BYTES`).
    """

    extra_seq: int = 0
    extra_kv_layers: int = 0
    weights: int = 0
    kv_cache: int = 0
    engines: int = 0


def _eagle_terms(d: DraftInputs) -> DraftTerms:
    nets = max(d.num_eagle_layers, 1)  # a chain (the LLM API's EAGLE-3) still runs one net
    return DraftTerms(
        extra_seq=d.max_draft_len + nets, extra_kv_layers=nets, weights=eagle_weight_bytes(d.target, nets, d.tp)
    )


def _medusa_terms(d: DraftInputs) -> DraftTerms:
    weights = medusa_weight_bytes(d.target.hidden_size, d.target.vocab_size, *d.medusa, d.tp) if d.medusa else 0
    return DraftTerms(extra_seq=d.max_draft_len, weights=weights)


def _draft_model_terms(d: DraftInputs) -> DraftTerms:
    if d.draft_arch is None:
        return DraftTerms(extra_seq=d.max_draft_len)
    return DraftTerms(
        extra_seq=d.max_draft_len,
        weights=model_weight_bytes(d.draft_arch, d.scheme, d.tp, d.pp),
        kv_cache=kv_cache_bytes(
            d.draft_arch, d.draft_arch.num_layers, d.tp, d.pp, d.scheme.kv_bytes, d.batch, d.max_seq_len
        ),
        engines=1,
    )


#: Each method's memory terms, for every method a TensorRT-LLM or vLLM plan can hold.
DRAFT_TERMS: dict[Method, Callable[[DraftInputs], DraftTerms]] = {
    Method.NONE: lambda d: DraftTerms(),
    Method.NGRAM: lambda d: DraftTerms(extra_seq=d.max_draft_len),
    Method.LOOKAHEAD: lambda d: DraftTerms(extra_seq=d.max_draft_len),
    Method.DRAFT_MODEL: _draft_model_terms,
    Method.EAGLE: _eagle_terms,
    Method.MEDUSA: _medusa_terms,
}


def plan_memory(
    *,
    target: Architecture,
    scheme: Scheme,
    tp: int,
    pp: int,
    batch: int,
    max_seq_len: int,
    method: str,
    max_draft_len: int,
    num_eagle_layers: int = 0,
    medusa: tuple[int, int] | None = None,
    draft_arch: Architecture | None = None,
    gpu: Gpu | None = None,
) -> MemoryPlan:
    """The memory plan per GPU.

    Args:
        target: target architecture. scheme: quantization scheme (weights and KV bytes).
        tp, pp: parallel sizes. batch: ``max_batch_size`` (requests). max_seq_len: tokens per request.
        method: speculative method, whose terms come from :data:`DRAFT_TERMS`. max_draft_len: draft tokens
            per step (0 without speculation). num_eagle_layers: EAGLE nets (EAGLE only; at least 1). medusa: ``(heads,
            layers per head)`` (Medusa only). draft_arch: the draft model's architecture (draft-model only).
        gpu: GPU to check against.

    Raises:
        MethodTableError: ``method`` has no entry in :data:`DRAFT_TERMS`.
    """
    inputs = DraftInputs(
        target, scheme, tp, pp, batch, max_seq_len, max_draft_len, num_eagle_layers, medusa, draft_arch
    )
    terms = entry_for(DRAFT_TERMS, method, "trtllm.memory.DRAFT_TERMS")(inputs)
    return MemoryPlan(
        tp=tp,
        pp=pp,
        target_weights=model_weight_bytes(target, scheme, tp, pp),
        draft_weights=terms.weights,
        target_kv_cache=kv_cache_bytes(
            target,
            target.num_layers + terms.extra_kv_layers,
            tp,
            pp,
            scheme.kv_bytes,
            batch,
            max_seq_len + terms.extra_seq,
        ),
        draft_kv_cache=terms.kv_cache,
        activations=activation_bytes(target, tp, batch, max_draft_len),
        runtime_overhead=RUNTIME_OVERHEAD_BYTES * (1 + terms.engines),
        gpu=gpu.name if gpu else None,
        gpu_memory=gpu.memory_bytes if gpu else None,
    )
