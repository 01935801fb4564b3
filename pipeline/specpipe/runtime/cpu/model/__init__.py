"""The target model's forward on CPU: the KV-cached single-sequence decoder (``cached_lm``) and the batched
forward over many requests' caches (``batched_lm``, ``layer_ops``), the kernels their linear layers run
(prepacked fp32 in ``prepack``, fused projections, the bf16 argmax screen of the lm_head, weight-only
int8/int4 in ``quantized_linear`` with the scheme names of ``quant_scheme``) and keeping one copy of the
weights in memory (``weights_memory``). Nothing here knows about drafting, acceptance or requests: it is
the bottom layer of the runtime, beside :mod:`specpipe.runtime.cpu.verify`, and imports no other part of it."""
