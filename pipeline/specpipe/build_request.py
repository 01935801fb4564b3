"""The inputs of ``specpipe build``, shared by the CPU and TensorRT-LLM build stages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specpipe.speculative import Runtime
from specpipe.tree import Tree

RUNTIMES = tuple(r.value for r in Runtime)
#: ``--tp auto`` / ``--pp auto``: the TensorRT-LLM build chooses the size by memory
#: (:mod:`specpipe.trtllm.parallelism`); the CPU runtime reads it as 1.
AUTO = "auto"
#: A parallel size: GPUs (>= 1), or :data:`AUTO` until the plan resolves it.
ParallelSize = int | Literal["auto"]


@dataclass(frozen=True)
class GpuCount:
    """How many GPUs a TensorRT-LLM deployment may spread over (``count`` >= 1) and where that number came
    from (``source``: ``--gpus``, or what ``nvidia-smi`` reported, e.g. ``nvidia-smi: 8 x NVIDIA H100 80GB HBM3``)."""

    count: int
    source: str


@dataclass(frozen=True)
class BuildRequest:
    """Everything ``specpipe build`` was asked to do.

    Attributes:
        target: target preset name or TOML path (``smollm2-135m``, ``llama3-70b``).
        draft: draft preset name or TOML path (``none``, ``ngram``, ``smollm2-draft``, ``eagle`` ...).
        runtime: one of :data:`RUNTIMES`.
        name: engine name; ``None`` derives ``<target>-<draft>``.
        engines_dir: root of engine directories (default ``engines/``).
        max_draft_len: overrides the draft preset's ``max_draft_len`` (tokens, >= 1).
        draft_model: local directory or Hugging Face id of draft weights (Medusa/EAGLE heads or a
            causal LM) replacing the preset's source.
        gpu: GPU name from the GPU table (``h100-80gb`` ...), TensorRT-LLM runtimes only.
        tp, pp: tensor- and pipeline-parallel sizes (GPUs), or :data:`AUTO`: chosen by the memory plan
            (TensorRT-LLM runtimes; the resolved plan carries ints), 1 on the CPU runtime.
        gpus: the GPUs ``tp`` x ``pp`` auto may use (:class:`GpuCount`); ``None``: none detected and no
            ``--gpus``, so auto assumes a node of 8 and says so.
        gpu_unknown: why no GPU is known to plan for (``nvidia-smi`` missing, its error, a board the GPU
            table lacks), set by the CLI when ``gpu`` is ``None``; the plan says it.
        quantization: ``auto`` | ``bf16`` | ``fp16`` | ``fp8`` | ``int4-awq`` | ``int8-wo`` | ``int4-wo``.
        max_batch_size, max_input_len, max_seq_len: engine limits (requests, tokens, tokens).
        lookahead: (window W, n-gram N, verification set G) for lookahead decoding, or ``None``.
        choices: ``eagle_choices``/``medusa_choices`` override: text :meth:`Tree.parse` reads
            (``'[[0],[0,0],[1]]'``), or a :class:`~specpipe.tree.Tree` (a tuned tree, :mod:`specpipe.tuned`).
        executor: ``auto`` | ``local`` | ``docker`` (TensorRT-LLM runtimes).
        dry_run: print the plan and memory table, run nothing, write nothing.
        json_output: with ``dry_run``, print exactly one JSON document on stdout instead.
        force: rebuild even when the inputs are unchanged.
        ngram_lookup: n-gram lookup's (longest, shortest) match in tokens, replacing the preset's
            ``max_matching_ngram_size`` (and shortest 1); set by ``--from-vllm-args`` (vLLM's
            ``prompt_lookup_max``/``min``), read by the vLLM plan only.
    """

    target: str
    draft: str
    runtime: str = "cpu"
    name: str | None = None
    engines_dir: Path = Path("engines")
    max_draft_len: int | None = None
    draft_model: str | None = None
    gpu: str | None = None
    tp: ParallelSize = 1
    pp: ParallelSize = 1
    gpus: GpuCount | None = None
    gpu_unknown: str | None = None
    quantization: str = "auto"
    max_batch_size: int = 8
    max_input_len: int = 4096
    max_seq_len: int = 8192
    lookahead: tuple[int, int, int] | None = None
    choices: str | Tree | None = None
    executor: str = "auto"
    dry_run: bool = False
    json_output: bool = False
    force: bool = False
    ngram_lookup: tuple[int, int] | None = None

    def engine_name(self, target_name: str, draft_name: str) -> str:
        return self.name or f"{target_name}-{draft_name}"
