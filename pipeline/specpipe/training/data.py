"""Offline training data for draft heads: text with a clear licence, and the target's own answers.

Two sources, both available without a network:

* **CPython standard library source** (``sysconfig.get_paths()["stdlib"]``, Python Software Foundation
  License, ``LICENSE.txt`` in the same folder): ``.py`` files outside test and IDLE folders, cut into
  fixed-length token chunks.
* **Self-distilled chat** (the recipe of Medusa-2, Cai et al. 2024, arXiv:2401.10774, §2.3.2, and of
  EAGLE, Li et al. 2024, arXiv:2401.15077): varied prompts written for this project (explanations,
  advice, lists, code writing, and summarization/editing of standard-library docstrings and functions)
  wrapped in the target's chat template, answered by the target itself with greedy decoding. The heads
  thus learn the distribution they face when deployed (chat answers), which plain text does not give
  (measured: heads trained on library text alone reach 0.16/0.05/0.03 top-1 on chat answers).

A user may add a JSONL of prompts (``{"prompt": "..."}`` or ``{"messages": [...]}`` per line; the
target answers them) or a text file / folder of ``.txt``/``.md``/``.py``/``.rst`` files (chunked).

Everything generated is cached under ``$SPECPIPE_CACHE/training/``; generation appends one batch at a
time, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.model.prepack import prepack_linear_layers
from specpipe.training.features import Features, extract_features
from specpipe.training.prompts import Prompt, builtin_prompts, chat_input_ids, read_user_data, stdlib_files
from specpipe.training.self_instruct import self_instruct_prompts


def chunk_texts(tokenizer, texts: Iterable[str], chunk_len: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Tokenize ``texts`` (each truncated to 20k characters) and cut them into ``chunk_len``-token chunks.

    Chunks are shuffled with ``seed`` and kept up to ``max_tokens`` tokens in total.
    """
    chunks: list[list[int]] = []
    for text in texts:
        ids = tokenizer(text[:20000], add_special_tokens=False)["input_ids"]
        chunks += [ids[i : i + chunk_len] for i in range(0, len(ids) - chunk_len // 2, chunk_len)]
    random.Random(seed).shuffle(chunks)
    out, total = [], 0
    for chunk in chunks:
        if total >= max_tokens:
            break
        out.append(chunk)
        total += len(chunk)
    return out


def stdlib_chunks(tokenizer, chunk_len: int = 256, max_tokens: int = 100_000, seed: int = 0) -> list[list[int]]:
    """Token chunks of standard-library source, ``max_tokens`` in total (shuffled by ``seed``)."""
    files = stdlib_files()
    random.Random(seed).shuffle(files)
    texts = (f.read_text(errors="replace") for f in files[:400])
    return chunk_texts(tokenizer, texts, chunk_len, max_tokens, seed)


#: Temperature of sampled self-distilled answers (``CorpusSpec.sampled_answers``).
SAMPLE_TEMPERATURE = 0.8


def prompts_key(prompts: list[Prompt], max_new_tokens: int, model_dir: Path) -> str:
    """Cache key of a self-distillation run: prompts, answer length and target weights' config."""
    digest = hashlib.sha256()
    digest.update(json.dumps([[p.category, p.text] for p in prompts]).encode())
    digest.update(str(max_new_tokens).encode())
    digest.update((Path(model_dir) / "config.json").read_bytes())
    return digest.hexdigest()[:16]


@torch.inference_mode()
def self_distill(
    model,
    tokenizer,
    prompts: list[Prompt],
    out_file: Path,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    progress=None,
    sample_seed: int | None = None,
) -> list[dict[str, Any]]:
    """Answer ``prompts`` with the target (greedy) and append ``{"category", "prompt_ids", "answer_ids"}``
    records to ``out_file`` (JSONL), one batch at a time; answers already there (same prompt tokens) are
    reused, so an interrupted run resumes and a larger prompt set only generates the new ones.

    Batches group prompts of similar length (left padding). Answers stop at the end token or after
    ``max_new_tokens`` tokens. Batched greedy decoding may differ from batch-1 decoding in rare near-ties;
    the labels used for training are recomputed by :func:`extract_features` anyway.

    ``sample_seed``: sample at :data:`SAMPLE_TEMPERATURE` instead, each batch seeded from ``sample_seed`` and
    its first prompt (the target's own varied answers; labels stay its greedy tokens along them).

    Returns:
        one record per prompt, in prompt order.
    """
    out_file.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[int, ...], dict[str, Any]] = {}
    if out_file.is_file():
        for line in out_file.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from an interrupted run: that answer is generated again
            done[tuple(record["prompt_ids"])] = record
    encoded = [(p, chat_input_ids(tokenizer, p)) for p in prompts]
    todo = sorted(
        (i for i in range(len(encoded)) if tuple(encoded[i][1]) not in done), key=lambda i: len(encoded[i][1])
    )
    if progress and len(encoded) > len(todo):
        progress(len(encoded) - len(todo))
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    with open(out_file, "a") as f:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            width = max(len(encoded[i][1]) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                seq = encoded[i][1]
                ids[row, width - len(seq) :] = torch.tensor(seq)
                mask[row, width - len(seq) :] = 1
            sampling = {"do_sample": False}
            if sample_seed is not None:
                torch.manual_seed(sample_seed * 1_000_003 + sum(encoded[batch[0]][1]))
                sampling = {"do_sample": True, "temperature": SAMPLE_TEMPERATURE, "top_k": 0, "top_p": 1.0}
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
                **sampling,
            )
            for row, i in enumerate(batch):
                answer = out[row, width:].tolist()
                if eos in answer:
                    answer = answer[: answer.index(eos) + 1]
                record = {"category": encoded[i][0].category, "prompt_ids": encoded[i][1], "answer_ids": answer}
                done[tuple(encoded[i][1])] = record
                f.write(json.dumps(record) + "\n")
            f.flush()
            if progress:
                progress(len(batch))
    return [done[tuple(ids)] for _, ids in encoded]


def _prepacked_copy(model):
    """An inference-only copy of the frozen target with prepacked linear layers (faster generation and
    feature extraction on CPU); the original keeps its dense weights for training."""
    fast = copy.deepcopy(model)
    prepack_linear_layers(fast)
    return fast


@dataclass(frozen=True)
class CorpusSpec:
    """What goes into a training corpus; its hash names the cached features.

    Attributes:
        seed: shuffles prompts, text chunks and the held-out split.
        num_prompts: built-in self-distillation prompts used (``0``: none).
        max_new_tokens: longest self-distilled answer, tokens.
        stdlib_tokens: tokens of standard-library text (``0``: none).
        chunk_len: tokens per text chunk.
        user_data: ``--data`` path, or ``None``.
        self_instruct: requests for a user message sent to the target (:mod:`~specpipe.training.self_instruct`;
            ``0``: none); its usable replies are answered like the built-in prompts.
        sampled_answers: answers per prompt sampled from the target besides the greedy one (``0``: none).
    """

    seed: int = 0
    num_prompts: int = 1200
    max_new_tokens: int = 128
    stdlib_tokens: int = 60_000
    chunk_len: int = 256
    user_data: str | None = None
    self_instruct: int = 0
    sampled_answers: int = 0

    def key(self) -> str:
        """Hash of the recipe (fields at their defaults since they were added are left out: same keys as before)."""
        fields = {k: v for k, v in self.__dict__.items() if not (k == "sampled_answers" and v == 0)}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def build_corpus(
    model,
    tokenizer,
    model_dir: Path,
    spec: CorpusSpec,
    cache: Path,
    progress_factory=None,
    capture_layers: tuple[int, ...] = (),
) -> Features:
    """Self-distil the prompts, chunk the texts, and extract the target's features (all cached).

    Args:
        model, tokenizer: the target (fp32, eval) and its tokenizer.
        model_dir: the target checkpoint (its config enters the cache key).
        spec: the corpus recipe.
        cache: folder for ``chat-<key>.jsonl`` and ``features-<key>.pt``.
        progress_factory: ``(description, total) -> callable(advance)`` for progress bars, or ``None``.
        capture_layers: also keep these decoder layers' outputs (EAGLE-3; part of the cache key).

    Raises:
        SpecpipeError: the recipe yields no data (no prompts and no text).
    """
    prompts = builtin_prompts(spec.seed, spec.num_prompts) if spec.num_prompts > 0 else []
    texts: list[str] = []
    if spec.user_data:
        user_prompts, texts = read_user_data(Path(spec.user_data))
        prompts += user_prompts
    chunks = stdlib_chunks(tokenizer, spec.chunk_len, spec.stdlib_tokens, spec.seed) if spec.stdlib_tokens > 0 else []
    if texts:
        chunks += chunk_texts(tokenizer, texts, spec.chunk_len, 10**9, spec.seed)
    if not prompts and not chunks and not spec.self_instruct:
        raise SpecpipeError(
            "the training corpus is empty: give --data or --self-instruct N, or keep the built-in prompts/text"
        )
    key = f"{spec.key()}-{prompts_key(prompts, spec.max_new_tokens, model_dir)[:8]}"
    answers_key = prompts_key([], spec.max_new_tokens, model_dir)[:12]
    cache.mkdir(parents=True, exist_ok=True)
    layers = "".join(f"-l{i}" for i in capture_layers)
    features_file = cache / f"features-{key}{layers}.pt"
    if features_file.is_file():
        return Features.load(features_file)
    model = _prepacked_copy(model)
    if spec.self_instruct > 0:
        bar = (
            progress_factory("Target writing prompts (self-instruct)", spec.self_instruct) if progress_factory else None
        )
        written = cache / f"self-instruct-{answers_key}-{spec.self_instruct}-{spec.seed}.jsonl"
        prompts += self_instruct_prompts(model, tokenizer, spec.self_instruct, spec.seed, written, progress=bar)
        if not prompts and not chunks:
            raise SpecpipeError(
                f"the target wrote no usable prompt in {spec.self_instruct} tries and the corpus has "
                "nothing else: raise --self-instruct, or keep the built-in prompts/text"
            )
    sequences: list[tuple[list[int], int]] = []
    if prompts:
        bar = (
            progress_factory("Self-distilling chat answers (target, greedy)", len(prompts))
            if progress_factory
            else None
        )
        records = self_distill(
            model, tokenizer, prompts, cache / f"answers-{answers_key}.jsonl", spec.max_new_tokens, progress=bar
        )
        for n in range(spec.sampled_answers):
            bar = (
                progress_factory(f"Sampling answers {n + 1}/{spec.sampled_answers} (target)", len(prompts))
                if progress_factory
                else None
            )
            records += self_distill(
                model,
                tokenizer,
                prompts,
                cache / f"sampled-{answers_key}-{spec.seed}-{n}.jsonl",
                spec.max_new_tokens,
                progress=bar,
                sample_seed=spec.seed * 100 + n,
            )
        sequences += [(r["prompt_ids"] + r["answer_ids"], len(r["prompt_ids"])) for r in records if r["answer_ids"]]
    sequences += [(c, len(c)) for c in chunks]
    total = sum(len(s) for s, _ in sequences)
    bar = progress_factory("Extracting target hidden states and labels", total) if progress_factory else None
    features = extract_features(model, sequences, progress=bar, capture_layers=capture_layers)
    features.save(features_file)
    return features
