"""Training draft heads (EAGLE, Medusa) and distilled draft models against a frozen target, on CPU.

Modules:

* :mod:`specpipe.training.prompts`: the corpus text (built-in prompts, CPython standard library source,
  user data).
* :mod:`specpipe.training.data`: the corpus (library text, self-distilled answers), cached;
  :mod:`specpipe.training.features`: the target's hidden states and greedy labels over it.
* :mod:`specpipe.training.config`: hyper-parameters and results; :mod:`specpipe.training.tasks`: the
  per-method modules and losses; :mod:`specpipe.training.train`: the loop (deterministic for a seed,
  resumable, time budget); :mod:`specpipe.training.command`: the ``specpipe train-draft`` flow.

Files are written in the heads file format (:mod:`specpipe.heads_format`). The head modules themselves
live in the CPU runtime (:mod:`specpipe.runtime.cpu.drafters.eagle_head`, :mod:`specpipe.runtime.cpu.drafters.medusa`), so
the CPU engine loads exactly what was trained.
"""
