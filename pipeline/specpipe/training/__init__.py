"""Training draft heads (EAGLE, Medusa) and distilled draft models against a frozen target, on CPU.

Modules:

* :mod:`specpipe.training.data`: the offline corpus (CPython standard library source, self-distilled
  chat answers) and the target's hidden states and greedy labels over it.
* :mod:`specpipe.training.train`: the training loops (deterministic for a seed, resumable, time budget).
* :mod:`specpipe.training.export`: saving in the layouts TensorRT-LLM's converters read, and the
  compact float16 "delta" files shipped with specpipe.

The head modules themselves live in :mod:`specpipe.runtime.cpu.heads`, so the CPU engine loads exactly
what was trained.
"""
