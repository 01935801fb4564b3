"""The CPU reference runtime: speculative decoding in PyTorch with the TensorRT-LLM tensor interface.

Parts, each a sub-package, importing downward only (contract ``runtime-cpu-parts`` in ``pyproject.toml``):
:mod:`~specpipe.runtime.cpu.scheduler` (in-flight batching: every request, one or many, is served by its
step), ``loader`` and ``external_drafts`` -> ``deployment`` (target, drafter, settings: no decoding loop of
its own) -> :mod:`~specpipe.runtime.cpu.drafters`
-> :mod:`~specpipe.runtime.cpu.verify` and :mod:`~specpipe.runtime.cpu.model` (independent of each other).
"""
