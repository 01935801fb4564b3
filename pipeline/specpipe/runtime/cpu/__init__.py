"""The CPU reference runtime: speculative decoding in PyTorch with the TensorRT-LLM tensor interface.

Parts, each a sub-package, importing downward only (contract ``runtime-cpu-parts`` in ``pyproject.toml``):
:mod:`~specpipe.runtime.cpu.scheduler` (in-flight batching) -> the engines at this level (``engine``,
``tree_engine``, ``external_drafts``, assembled by ``loader``) -> :mod:`~specpipe.runtime.cpu.drafters`
-> :mod:`~specpipe.runtime.cpu.verify` and :mod:`~specpipe.runtime.cpu.model` (independent of each other).
"""
