"""llama.cpp as a column of ``benchmarks/cpu_speculative.py``: plain greedy decoding through
llama-cpp-python on an f32 GGUF of the same checkpoint (optional; not part of the test suite).

Setup (once; llama-cpp-python compiles llama.cpp, about 45 minutes on 2 busy cores)::

    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF" \\
        pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
    pip install sentencepiece            # convert_hf_to_gguf.py imports it even for BPE tokenizers
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llamasrc
    tar xzf /tmp/llamasrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/llamasrc   # the vendored llama.cpp

then pass ``--llama-convert /tmp/llamasrc/llama_cpp_python-0.3.36/vendor/llama.cpp`` (the GGUF is made
with ``convert_hf_to_gguf.py --outtype f32`` and its own ``gguf-py``) or ``--gguf FILE``.

Decoding: the prompt ids are the same chat-templated ids the other columns get (SmolLM2's GGUF carries
the same 49152-token vocabulary); ``top_k=1`` greedy, no repetition penalty, stop at the end id or after
``max_tokens``; ``n_threads`` = ``n_threads_batch`` = the benchmark's ``--threads``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


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
    done = subprocess.run([sys.executable, str(script), str(checkpoint), "--outtype", "f32", "--outfile", str(out)],
                          env=env, capture_output=True, text=True)
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
    return Llama(model_path=str(gguf), n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 verbose=False)


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
            tokens = self.llm.generate(self.prompt_ids[index], top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                       repeat_penalty=1.0, reset=True)
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
