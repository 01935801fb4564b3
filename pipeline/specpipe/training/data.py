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

import hashlib
import json
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from specpipe.errors import SpecpipeError
from specpipe.jsonl import json_objects, nonempty_string

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")

# ---------------------------------------------------------------------------------------------------
# Prompts written for this project (no external data set). Combined with templates they give a few
# hundred varied chat requests in the four benchmark families: chat/explanations, code, summaries, lists.
# ---------------------------------------------------------------------------------------------------
_CONCEPTS = [
    "hash tables", "recursion", "binary search", "photosynthesis", "inflation", "the water cycle",
    "black holes", "vaccines", "compound interest", "machine learning", "the French Revolution",
    "plate tectonics", "public-key cryptography", "garbage collection", "the TCP handshake",
    "the greenhouse effect", "supply and demand", "DNA replication", "neural networks", "the Internet",
    "climate change", "the immune system", "blockchains", "the stock market", "electric cars",
    "solar panels", "operating systems", "databases and indexes", "version control with git",
    "unit testing", "regular expressions", "virtual memory", "the Pythagorean theorem",
    "probability", "the scientific method", "gravity", "evolution by natural selection",
    "the Roman Empire", "renewable energy", "caching", "sorting algorithms", "linked lists",
    "REST APIs", "containers and Docker", "cloud computing", "the human heart", "sleep",
    "meditation", "nutrition", "time zones", "prime numbers", "the speed of light", "volcanoes",
    "earthquakes", "bees and pollination", "the printing press", "democracy", "opportunity cost",
]
_CONCEPT_TEMPLATES = [
    "Explain {x} in simple terms.",
    "What is {x}? Give a short explanation with an example.",
    "Can you explain how {x} works to a beginner?",
    "Write a short paragraph about {x}.",
    "What are the main advantages and disadvantages of {x}?",
    "Why does {x} matter? Answer briefly.",
    "Describe {x} step by step.",
    "What are common misconceptions about {x}?",
]
_ADVICE = [
    "dealing with exam stress", "learning a new programming language", "saving money each month",
    "sleeping better", "preparing for a job interview", "staying focused while working from home",
    "starting to run", "writing a good cover letter", "learning to cook", "making new friends in a new city",
    "keeping a plant alive", "giving a presentation", "managing my time", "learning to play the guitar",
    "reducing screen time", "eating healthier", "traveling on a budget", "writing clean code",
    "reading more books", "staying motivated", "organizing my desk", "planning a small garden",
    "asking for a raise", "studying for a math test", "being more productive in the morning",
]
_ADVICE_TEMPLATES = [
    "Give me some advice on {x}.",
    "I need tips for {x}. What should I do?",
    "What are five practical tips for {x}?",
    "What mistakes should I avoid when {x}?",
    "Can you make a simple plan for {x}?",
]
_LISTS = [
    "countries in Europe and their capitals", "fruits that are high in vitamin C", "programming languages",
    "famous scientists and what they discovered", "planets in the solar system", "ideas for a weekend trip",
    "healthy breakfast ideas", "common Linux commands", "board games for families", "animals that live in the ocean",
    "musical instruments", "tips for writing an essay", "Python built-in functions", "kitchen tools",
    "hobbies to try", "vegetables that grow fast", "famous paintings and their painters", "sports played with a ball",
    "things to pack for a camping trip", "ways to reduce plastic waste", "features of a good website",
    "common data structures", "rivers in Africa", "inventions of the 20th century", "birthday party ideas",
    "books for learning programming", "exercises you can do at home", "reasons to learn history",
]
_LIST_TEMPLATES = [
    "List 10 {x}.",
    "Give me a numbered list of {x}.",
    "Name some {x}, one per line.",
    "Write a bulleted list of {x} with a short note for each.",
    "What are the 5 most important {x}? Number them.",
]
_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "merges two sorted lists",
    "counts the words in a text", "computes the factorial of n", "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping the order", "finds the largest element of a list",
    "checks whether a string is a palindrome", "converts Celsius to Fahrenheit",
    "reads a CSV file and returns its rows", "flattens a nested list", "computes the average of a list",
    "sorts a list of dictionaries by a key", "counts the vowels in a string", "implements binary search",
    "returns the intersection of two lists", "validates an email address with a regular expression",
    "capitalizes the first letter of every word", "computes the greatest common divisor",
    "generates all permutations of a list", "implements a stack class", "reads a JSON file",
    "chunks a list into pieces of size n", "returns the frequency of each character",
]
_CODE_TEMPLATES = [
    "Write a Python function that {x}.",
    "Write a Python function that {x}. Include a docstring and an example.",
    "How do I write a function in Python that {x}?",
    "Write a JavaScript function that {x}.",
    "Write a Python function that {x}, and show how to call it.",
    "Explain, with Python code, how to write a function that {x}.",
]
_SUMMARY_TEMPLATES = [
    "Summarize the following text in 3 sentences:\n\n{x}",
    "Summarize this documentation in a few bullet points:\n\n{x}",
    "Explain in simple words what this text says:\n\n{x}",
]
_CODE_EDIT_TEMPLATES = [
    "Add type hints and a docstring to this function:\n\n```python\n{x}\n```",
    "Explain what this Python function does:\n\n```python\n{x}\n```",
    "Review this code and suggest improvements:\n\n```python\n{x}\n```",
]


@dataclass(frozen=True)
class Prompt:
    """One chat request. ``category``: chat, advice, list, code, summary or code_edit."""

    category: str
    text: str


def stdlib_dir() -> Path:
    """The running interpreter's standard library folder (PSF licence)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Standard-library ``.py`` files outside tests, IDLE, site-packages, sorted by path."""
    root = root or stdlib_dir()
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))


def _module_docstrings(files: Iterable[Path], min_chars: int = 300, max_chars: int = 1200) -> list[str]:
    out = []
    for path in files:
        text = path.read_text(errors="replace")
        match = re.match(r'\s*(?:#[^\n]*\n\s*)*[rRuU]?("""|\'\'\')(.*?)\1', text, re.S)
        if match:
            doc = match.group(2).strip()
            if len(doc) >= min_chars:
                out.append(doc[:max_chars])
    return out


def _small_functions(files: Iterable[Path], min_lines: int = 4, max_lines: int = 14) -> list[str]:
    out = []
    pattern = re.compile(r"^def [A-Za-z_]\w*\(.*?\):\n(?:(?:    .*|\s*)\n)+", re.M)
    for path in files:
        for match in pattern.finditer(path.read_text(errors="replace")):
            lines = match.group(0).rstrip().splitlines()
            if min_lines <= len(lines) <= max_lines and '"""' not in match.group(0):
                out.append("\n".join(lines))
    return out


def builtin_prompts(seed: int = 0, limit: int | None = None) -> list[Prompt]:
    """The project's self-distillation prompts, shuffled deterministically for ``seed``.

    About 2,000 requests in six categories: every concept/advice/list/code topic with every template,
    summaries of standard-library module docstrings (three templates each) and edits/explanations of
    small library functions (one template each). Each category is shuffled, then the categories are
    interleaved one prompt at a time, so that any ``limit`` keeps them balanced until the smaller ones
    run out.
    """
    rng = random.Random(seed)
    pools: list[list[Prompt]] = []
    for items, templates, category in (
        (_CONCEPTS, _CONCEPT_TEMPLATES, "chat"),
        (_ADVICE, _ADVICE_TEMPLATES, "advice"),
        (_LISTS, _LIST_TEMPLATES, "list"),
        (_CODE_TASKS, _CODE_TEMPLATES, "code"),
    ):
        pools.append([Prompt(category, template.format(x=item)) for item in items for template in templates])
    files = stdlib_files()
    pools.append([Prompt("summary", template.format(x=doc)) for doc in _module_docstrings(files) for template in _SUMMARY_TEMPLATES])
    pools.append([Prompt("code_edit", rng.choice(_CODE_EDIT_TEMPLATES).format(x=fn)) for fn in _small_functions(files)])
    for pool in pools:
        rng.shuffle(pool)
    prompts = [pool[i] for i in range(max(map(len, pools))) for pool in pools if i < len(pool)]
    return prompts[:limit] if limit else prompts


def read_user_data(path: Path) -> tuple[list[Prompt], list[str]]:
    """Read ``--data``: a JSONL of prompts, or a text file / folder of text files.

    Returns:
        (prompts to self-distil, raw texts to chunk).

    Raises:
        SpecpipeError: missing path, unreadable JSONL line, or no usable content.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise SpecpipeError(f"training data {path} does not exist: pass an existing JSONL file or text folder")
    prompts: list[Prompt] = []
    texts: list[str] = []
    if path.is_file() and path.suffix == ".jsonl":
        for number, record in json_objects(path.read_text(errors="replace").splitlines(), f"training data {path}"):
            if nonempty_string(record, "prompt") is not None:
                prompts.append(Prompt("user", record["prompt"]))
            elif isinstance(record.get("messages"), list) and record["messages"]:
                prompts.append(Prompt("user", json.dumps(record["messages"])))
            else:
                raise SpecpipeError(
                    f"training data {path} line {number} has neither a non-empty 'prompt' string nor a 'messages' "
                    f"list: write {{\"prompt\": \"...\"}} or {{\"messages\": [...]}} on each line"
                )
    else:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES)
        texts = [t for t in (f.read_text(errors="replace") for f in files) if t.strip()]
    if not prompts and not texts:
        raise SpecpipeError(
            f"training data {path} is empty (no prompts, no non-empty {'/'.join(TEXT_SUFFIXES)} text): "
            f"give a JSONL of prompts or a folder of text files"
        )
    return prompts, texts


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


def chat_input_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt wrapped in the target's chat template with the assistant turn opened."""
    if prompt.category == "user" and prompt.text.startswith("["):
        messages = json.loads(prompt.text)
    else:
        messages = [{"role": "user", "content": prompt.text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


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
) -> list[dict[str, Any]]:
    """Answer ``prompts`` with the target (greedy) and append ``{"category", "prompt_ids", "answer_ids"}``
    records to ``out_file`` (JSONL), one batch at a time; answers already there (same prompt tokens) are
    reused, so an interrupted run resumes and a larger prompt set only generates the new ones.

    Batches group prompts of similar length (left padding). Answers stop at the end token or after
    ``max_new_tokens`` tokens. Batched greedy decoding may differ from batch-1 decoding in rare near-ties;
    the labels used for training are recomputed by :func:`extract_features` anyway.

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
    todo = sorted((i for i in range(len(encoded)) if tuple(encoded[i][1]) not in done), key=lambda i: len(encoded[i][1]))
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
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=pad, eos_token_id=eos,
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


@dataclass
class Features:
    """The target's view of a corpus, flattened over sequences.

    Attributes:
        tokens: int64 ``[N]`` token ids of all sequences, concatenated.
        hidden: float16 ``[N, hidden]`` the target's final hidden state (after the final RMSNorm, the
            input of ``lm_head``) at each position.
        labels: int64 ``[N]`` the target's greedy next token at each position (argmax of its logits).
        seq_end: int64 ``[N]`` index one past the last position of the position's sequence.
        is_answer: bool ``[N]`` the position belongs to a self-distilled answer (not prompt or text).
    """

    tokens: torch.Tensor
    hidden: torch.Tensor
    labels: torch.Tensor
    seq_end: torch.Tensor
    is_answer: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(self.__dict__, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Features":
        return cls(**torch.load(path, weights_only=True))

    def split(self, holdout_fraction: float, seed: int) -> tuple["Features", "Features"]:
        """Split by whole sequences: (train, held-out)."""
        ends = torch.unique(self.seq_end).tolist()
        starts = [0, *ends[:-1]]
        spans = list(zip(starts, ends))
        random.Random(seed).shuffle(spans)
        n_hold = max(1, int(len(spans) * holdout_fraction))
        return self._subset(spans[n_hold:]), self._subset(spans[:n_hold])

    def _subset(self, spans: list[tuple[int, int]]) -> "Features":
        spans = sorted(spans)
        index = torch.cat([torch.arange(a, b) for a, b in spans])
        lengths = torch.tensor([b - a for a, b in spans])
        ends = torch.cumsum(lengths, 0)
        seq_end = torch.repeat_interleave(ends, lengths)
        return Features(self.tokens[index], self.hidden[index], self.labels[index], seq_end, self.is_answer[index])


@torch.inference_mode()
def extract_features(
    model, sequences: list[tuple[list[int], int]], batch_tokens: int = 2048, progress=None
) -> Features:
    """Run the frozen target over ``sequences`` and collect hidden states and greedy labels.

    Args:
        model: the target ``LlamaForCausalLM`` (fp32, eval).
        sequences: ``(token_ids, answer_start)`` pairs; positions ``>= answer_start`` are answers
            (``answer_start = len(ids)`` for plain text).
        batch_tokens: about this many tokens per forward (sequences of equal length are batched).

    Returns:
        :class:`Features` over all sequences in the given order.
    """
    tokens, hidden, labels, ends, answers = [], [], [], [], []
    total = 0
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    i = 0
    while i < len(order):
        length = len(sequences[order[i]][0])
        group = [order[i]]
        while i + len(group) < len(order) and len(sequences[order[i + len(group)]][0]) == length and (len(group) + 1) * length <= batch_tokens:
            group.append(order[i + len(group)])
        ids = torch.tensor([sequences[j][0] for j in group], dtype=torch.long)
        h = model.model(input_ids=ids).last_hidden_state
        logits = model.lm_head(h)
        best = logits.argmax(-1)
        for row, j in enumerate(group):
            results[j] = (h[row].to(torch.float16), best[row])
        i += len(group)
        if progress:
            progress(len(group) * length)
    for j, (ids, answer_start) in enumerate(sequences):
        h, best = results[j]
        n = len(ids)
        tokens.append(torch.tensor(ids, dtype=torch.long))
        hidden.append(h)
        labels.append(best.long())
        total += n
        ends.append(torch.full((n,), total, dtype=torch.long))
        answers.append(torch.arange(n) >= answer_start)
    return Features(torch.cat(tokens), torch.cat(hidden), torch.cat(labels), torch.cat(ends), torch.cat(answers))


def _prepacked_copy(model):
    """An inference-only copy of the frozen target with prepacked linear layers (faster generation and
    feature extraction on CPU); the original keeps its dense weights for training."""
    import copy

    from specpipe.runtime.cpu.prepack import prepack_linear_layers

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
    """

    seed: int = 0
    num_prompts: int = 1200
    max_new_tokens: int = 128
    stdlib_tokens: int = 60_000
    chunk_len: int = 256
    user_data: str | None = None


def build_corpus(model, tokenizer, model_dir: Path, spec: CorpusSpec, cache: Path, progress_factory=None) -> Features:
    """Self-distil the prompts, chunk the texts, and extract the target's features (all cached).

    Args:
        model, tokenizer: the target (fp32, eval) and its tokenizer.
        model_dir: the target checkpoint (its config enters the cache key).
        spec: the corpus recipe.
        cache: folder for ``chat-<key>.jsonl`` and ``features-<key>.pt``.
        progress_factory: ``(description, total) -> callable(advance)`` for progress bars, or ``None``.

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
    if not prompts and not chunks:
        raise SpecpipeError("the training corpus is empty: give --data, or keep the built-in prompts/text")
    key = hashlib.sha256(json.dumps(spec.__dict__, sort_keys=True).encode()).hexdigest()[:12]
    key = f"{key}-{prompts_key(prompts, spec.max_new_tokens, model_dir)[:8]}"
    answers_key = prompts_key([], spec.max_new_tokens, model_dir)[:12]
    cache.mkdir(parents=True, exist_ok=True)
    features_file = cache / f"features-{key}.pt"
    if features_file.is_file():
        return Features.load(features_file)
    model = _prepacked_copy(model)
    sequences: list[tuple[list[int], int]] = []
    if prompts:
        bar = progress_factory("Self-distilling chat answers (target, greedy)", len(prompts)) if progress_factory else None
        records = self_distill(model, tokenizer, prompts, cache / f"answers-{answers_key}.jsonl", spec.max_new_tokens, progress=bar)
        sequences += [(r["prompt_ids"] + r["answer_ids"], len(r["prompt_ids"])) for r in records if r["answer_ids"]]
    sequences += [(c, len(c)) for c in chunks]
    total = sum(len(s) for s, _ in sequences)
    bar = progress_factory("Extracting target hidden states and labels", total) if progress_factory else None
    features = extract_features(model, sequences, progress=bar)
    features.save(features_file)
    return features
