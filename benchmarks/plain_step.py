"""How long does one plain greedy decoding step at batch 1 take on specpipe's CPU runtime, against
llama.cpp on the same fp32 weights?

Both decode the same chat prompt greedily, one token per forward, after the same prefill; the figure is
the median over ``--reps`` interleaved repetitions of (wall time of ``--tokens`` steps) / ``--tokens``,
in ms. specpipe is timed three ways (:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`, the
scheduler's forward, plus the greedy argmax screen and the argmax): ``specpipe`` with the dense weight
copies used for one row (``--dense-rows all``), ``specpipe_packed`` with the prepacked kernels only (a
deployment's default), ``specpipe_packed_fp32_head`` the latter with the full fp32 lm_head instead of
the screen (what a sampled request's step costs). ``llama.cpp`` is llama-cpp-python's ``generate`` with
``top_k=1`` on an f32 GGUF of the same checkpoint. ``ratio`` divides the medians; ``paired_ratio`` is
the median of each repetition's own ratio (a slow stretch of a shared machine slows a repetition's
runs alike). Run it on an otherwise idle machine::

    PYTHONPATH=pipeline python benchmarks/plain_step.py --engine engines/smollm2-135m-none \\
        --gguf /tmp/smollm2-f32.gguf [--tokens 64] [--reps 5] [--threads 2] \\
        [--out benchmarks/results/plain_step.json]

llama.cpp (also the llama.cpp lane of ``adaptive_interleaved.py`` and column of ``cpu_speculative.py``,
which import the helpers below). Once: llama-cpp-python compiles llama.cpp (about 45 minutes on 2 busy
cores), and ``convert_hf_to_gguf.py`` of its vendored llama.cpp makes the GGUF::

    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF" \\
        pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
    pip install sentencepiece            # convert_hf_to_gguf.py imports it even for BPE tokenizers
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llamasrc
    tar xzf /tmp/llamasrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/llamasrc   # the vendored llama.cpp

then ``--gguf FILE``, or in ``cpu_speculative.py`` ``--llama-convert
/tmp/llamasrc/llama_cpp_python-0.3.36/vendor/llama.cpp`` to make the GGUF with ``convert_hf_to_gguf.py
--outtype f32`` and its own ``gguf-py``. llama.cpp gets the same chat-templated prompt ids (SmolLM2's GGUF
carries the same 49152-token vocabulary), ``top_k=1`` greedy, no repetition penalty, ``n_threads`` =
``n_threads_batch`` = ``--threads``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT = "Why is the sky blue? Explain it to a ten-year-old."


def specpipe_step_seconds(lm, prompt_ids: list[int], tokens: int, screened: bool = True) -> float:
    """Seconds per greedy step of one request on ``lm`` (a BatchedLM), after prefilling ``prompt_ids``;
    ``screened``: logits through the argmax screen (``BatchedLM.project``'s ``argmax_only``)."""
    from specpipe.runtime.cpu.model.batched_lm import BatchEntry

    slot = lm.allocate()
    try:
        with torch.inference_mode():
            token = int(lm.project(lm.hidden([BatchEntry(slot, list(prompt_ids))])[-1:], [screened]).argmax())
            start = time.perf_counter()
            for _ in range(tokens):
                token = int(lm.project(lm.hidden([BatchEntry(slot, [token])]), [screened]).argmax())
            return (time.perf_counter() - start) / tokens
    finally:
        lm.release(slot)


def llama_step_seconds(llm, prompt_ids: list[int], tokens: int) -> float:
    """Seconds per greedy step of llama.cpp after prefilling ``prompt_ids`` (the prefill is not timed)."""
    llm.reset()
    start, produced = None, 0
    for _ in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if start is None:  # the first token comes from the prefill
            start = time.perf_counter()
            continue
        produced += 1
        if produced >= tokens:
            break
    return (time.perf_counter() - start) / produced


def convert_to_gguf(checkpoint: Path, out: Path, llama_cpp_dir: Path) -> Path:
    """Write an f32 GGUF of the Hugging Face ``checkpoint`` with llama.cpp's own converter.

    Raises:
        SystemExit: the converter is missing or fails.
    """
    script = Path(llama_cpp_dir) / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise SystemExit(f"{script} not found: pass --llama-convert <llama.cpp source folder> (see {__file__})")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(llama_cpp_dir) / "gguf-py"), str(llama_cpp_dir)])}
    done = subprocess.run(
        [sys.executable, str(script), str(checkpoint), "--outtype", "f32", "--outfile", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"convert_hf_to_gguf.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return out


def load_llama(checkpoint: Path, gguf: Path, llama_cpp_dir: Path | None, threads: int):
    """A ``llama_cpp.Llama`` on ``gguf`` (converted from ``checkpoint`` first when missing)."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise SystemExit(f"llama-cpp-python is not installed ({exc}): see {__file__}") from exc
    if not Path(gguf).is_file():
        if llama_cpp_dir is None:
            raise SystemExit(f"no GGUF at {gguf}: pass --gguf FILE or --llama-convert <llama.cpp source folder>")
        convert_to_gguf(checkpoint, Path(gguf), llama_cpp_dir)
    return Llama(
        model_path=str(gguf), n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )


def generate_greedy(llm, ids: list[int], max_tokens: int, eos: int) -> list[int]:
    """Greedy continuation of ``ids`` (the end id is not returned)."""
    llm.reset()
    tokens: list[int] = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if token == eos:
            break
        tokens.append(int(token))
        if len(tokens) >= max_tokens:
            break
    return tokens


class LlamaCppLane:
    """llama.cpp's plain greedy decoding as a lane of ``benchmarks/adaptive_interleaved.py``: one request at
    a time (llama-cpp-python's ``generate`` decodes one sequence), one token per :meth:`step`, the first
    step of a request also prefilling its prompt, as the scheduler's first step for a request does. It takes
    part at concurrency 1 only (:attr:`max_concurrency`). Greedy only.

    Args:
        llm: a ``llama_cpp.Llama`` (:func:`load_llama`); eos: the end id (not counted as output).
    """

    max_concurrency = 1

    def __init__(self, llm, eos: int, name: str = "llama.cpp"):
        self.llm, self.eos, self.name = llm, eos, name
        self._current = None

    def start(self, prompt_ids: list[list[int]], concurrency: int, params) -> None:
        if not params.greedy:
            raise ValueError("the llama.cpp lane decodes greedily only")
        self.todo, self.prompt_ids, self.max_tokens = list(range(len(prompt_ids))), prompt_ids, params.max_tokens
        self.outputs: dict[int, list[int]] = {}
        self.seconds, self.lengths, self._current = 0.0, {}, None

    @property
    def busy(self) -> bool:
        return bool(self.todo) or self._current is not None

    def step(self) -> None:
        started = time.perf_counter()
        if self._current is None:
            index = self.todo.pop(0)
            self.llm.reset()
            tokens = self.llm.generate(
                self.prompt_ids[index], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
            )
            self._current, self.outputs[index] = (index, tokens), []
        index, tokens = self._current
        token = int(next(tokens))
        self.seconds += time.perf_counter() - started
        self.lengths[0] = self.lengths.get(0, 0) + 1
        if token != self.eos:
            self.outputs[index].append(token)
        if token == self.eos or len(self.outputs[index]) >= self.max_tokens:
            tokens.close()
            self._current = None

    def texts(self) -> dict[int, list[int]]:
        return self.outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--engine", type=Path, required=True, help="a CPU engine directory (its target is measured)")
    parser.add_argument("--gguf", type=Path, required=True, help="f32 GGUF of the same checkpoint")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.runtime.cpu.model.batched_lm import BatchedLM
    from specpipe.runtime.cpu.model.prepack import set_dense_rows

    engine, manifest = load_engine(args.engine, dense_copy=True)
    tokenizer = AutoTokenizer.from_pretrained(args.engine / manifest.target.path)
    prompt_ids = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    )
    lm = BatchedLM(engine.target.model, 1)
    llm = Llama(
        model_path=str(args.gguf), n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads, verbose=False
    )
    if lm.argmax_screen is None:
        sys.exit("this CPU or model has no argmax screen (bf16 kernels, tied lm_head): nothing to compare")
    ours, packed, fp32_head, theirs = [], [], [], []
    for rows in (1, 0):
        set_dense_rows(engine.target.model, rows)
        specpipe_step_seconds(lm, prompt_ids, 4)
    specpipe_step_seconds(lm, prompt_ids, 4, screened=False)
    llama_step_seconds(llm, prompt_ids, 4)
    for _ in range(args.reps):
        set_dense_rows(engine.target.model, 1)
        ours.append(specpipe_step_seconds(lm, prompt_ids, args.tokens))
        set_dense_rows(engine.target.model, 0)
        packed.append(specpipe_step_seconds(lm, prompt_ids, args.tokens))
        fp32_head.append(specpipe_step_seconds(lm, prompt_ids, args.tokens, screened=False))
        theirs.append(llama_step_seconds(llm, prompt_ids, args.tokens))
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "setup": {
            "prompt_tokens": len(prompt_ids),
            "tokens": args.tokens,
            "reps": args.reps,
            "threads": args.threads,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cpu": _cpu_name(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "specpipe_step_ms": [round(s * 1e3, 2) for s in ours],
        "specpipe_packed_step_ms": [round(s * 1e3, 2) for s in packed],
        "specpipe_packed_fp32_head_step_ms": [round(s * 1e3, 2) for s in fp32_head],
        "llama_cpp_step_ms": [round(s * 1e3, 2) for s in theirs],
        "specpipe_median_ms": round(statistics.median(ours) * 1e3, 2),
        "specpipe_packed_median_ms": round(statistics.median(packed) * 1e3, 2),
        "specpipe_packed_fp32_head_median_ms": round(statistics.median(fp32_head) * 1e3, 2),
        "llama_cpp_median_ms": round(statistics.median(theirs) * 1e3, 2),
        "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
        "packed_ratio": round(statistics.median(packed) / statistics.median(theirs), 3),
        "paired_ratio": round(statistics.median(a / b for a, b in zip(ours, theirs)), 3),
        "paired_packed_ratio": round(statistics.median(a / b for a, b in zip(packed, theirs)), 3),
        "paired_packed_fp32_head_ratio": round(statistics.median(a / b for a, b in zip(fp32_head, theirs)), 3),
        "paired_screen_saving": round(statistics.median(a / b for a, b in zip(packed, fp32_head)), 3),
    }
    report(result, args.out)


def report(result: dict, out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` (its folder created) when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                return line.split(":", 1)[1].strip() + (" (AVX-512)" if "avx512f" in flags else " (AVX2, no AVX-512)")
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
