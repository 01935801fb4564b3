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

from specpipe.presets import Architecture
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
        return (self.target_weights + self.draft_weights + self.target_kv_cache + self.draft_kv_cache
                + self.activations + self.runtime_overhead)

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


def plan_memory(*, target: Architecture, scheme: Scheme, tp: int, pp: int, batch: int, max_seq_len: int,
                method: str, max_draft_len: int, num_eagle_layers: int = 0, medusa: tuple[int, int] | None = None,
                draft_arch: Architecture | None = None, gpu: Gpu | None = None) -> MemoryPlan:
    """The memory plan per GPU.

    Args:
        target: target architecture. scheme: quantization scheme (weights and KV bytes).
        tp, pp: parallel sizes. batch: ``max_batch_size`` (requests). max_seq_len: tokens per request.
        method: speculative method. max_draft_len: draft tokens per step (0 without speculation).
        num_eagle_layers: EAGLE nets (EAGLE only). medusa: ``(heads, layers per head)`` (Medusa only).
        draft_arch: the draft model's architecture (draft-model only). gpu: GPU to check against.
    """
    engine_seq = max_seq_len + (max_draft_len if method != "none" else 0) + (num_eagle_layers if method == "eagle" else 0)
    target_kv_layers = target.num_layers + (num_eagle_layers if method == "eagle" else 0)
    draft_weights = draft_kv = 0
    overhead = RUNTIME_OVERHEAD_BYTES
    if method == "eagle":
        draft_weights = eagle_weight_bytes(target, num_eagle_layers, tp)
    elif method == "medusa" and medusa:
        draft_weights = medusa_weight_bytes(target.hidden_size, target.vocab_size, medusa[0], medusa[1], tp)
    elif method == "draft-model" and draft_arch is not None:
        draft_weights = model_weight_bytes(draft_arch, scheme, tp, pp)
        draft_kv = kv_cache_bytes(draft_arch, draft_arch.num_layers, tp, pp, scheme.kv_bytes, batch, max_seq_len)
        overhead += RUNTIME_OVERHEAD_BYTES
    return MemoryPlan(
        tp=tp, pp=pp,
        target_weights=model_weight_bytes(target, scheme, tp, pp),
        draft_weights=draft_weights,
        target_kv_cache=kv_cache_bytes(target, target_kv_layers, tp, pp, scheme.kv_bytes, batch, engine_seq),
        draft_kv_cache=draft_kv,
        activations=activation_bytes(target, tp, batch, max_draft_len),
        runtime_overhead=overhead,
        gpu=gpu.name if gpu else None,
        gpu_memory=gpu.memory_bytes if gpu else None,
    )
