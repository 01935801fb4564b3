"""vLLM as a second GPU engine: the ``vllm serve`` command and its ``--speculative-config`` for a spec.

:mod:`~specpipe.vllm.release` pins the release, :mod:`~specpipe.vllm.flagcheck` checks every command
against ``flags.json`` (vLLM's own definitions, read from the wheel by :mod:`~specpipe.vllm.vendor`),
:mod:`~specpipe.vllm.settings` maps methods and quantizations, :mod:`~specpipe.vllm.plan` makes the plan,
:mod:`~specpipe.vllm.build` writes the engine directory and :mod:`~specpipe.vllm.legacy` translates a
guide's old-style flags.
"""
