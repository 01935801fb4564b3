"""The text of the training corpus: built-in prompts, CPython standard library source, and user data.

Both built-in sources are available without a network:

* **CPython standard library source** (``sysconfig.get_paths()["stdlib"]``, Python Software Foundation
  License, ``LICENSE.txt`` in the same folder): ``.py`` files outside test and IDLE folders.
* **Prompts** written for this project (explanations, advice, lists, code writing, and
  summarization/editing of standard-library docstrings and functions), which the target answers itself
  (:mod:`specpipe.training.data`).

A user may add a JSONL of prompts (``{"prompt": "..."}`` or ``{"messages": [...]}`` per line) or a text
file / folder of ``.txt``/``.md``/``.py``/``.rst`` files.
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from specpipe.errors import SpecpipeError
from specpipe.jsonl import json_objects, nonempty_string

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")

# ---------------------------------------------------------------------------------------------------
# Prompts written for this project (no external data set). Combined with templates they give a few
# hundred varied chat requests in the four benchmark families: chat/explanations, code, summaries, lists.
# ---------------------------------------------------------------------------------------------------
_CONCEPTS = [
    "hash tables",
    "recursion",
    "binary search",
    "photosynthesis",
    "inflation",
    "the water cycle",
    "black holes",
    "vaccines",
    "compound interest",
    "machine learning",
    "the French Revolution",
    "plate tectonics",
    "public-key cryptography",
    "garbage collection",
    "the TCP handshake",
    "the greenhouse effect",
    "supply and demand",
    "DNA replication",
    "neural networks",
    "the Internet",
    "climate change",
    "the immune system",
    "blockchains",
    "the stock market",
    "electric cars",
    "solar panels",
    "operating systems",
    "databases and indexes",
    "version control with git",
    "unit testing",
    "regular expressions",
    "virtual memory",
    "the Pythagorean theorem",
    "probability",
    "the scientific method",
    "gravity",
    "evolution by natural selection",
    "the Roman Empire",
    "renewable energy",
    "caching",
    "sorting algorithms",
    "linked lists",
    "REST APIs",
    "containers and Docker",
    "cloud computing",
    "the human heart",
    "sleep",
    "meditation",
    "nutrition",
    "time zones",
    "prime numbers",
    "the speed of light",
    "volcanoes",
    "earthquakes",
    "bees and pollination",
    "the printing press",
    "democracy",
    "opportunity cost",
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
    "dealing with exam stress",
    "learning a new programming language",
    "saving money each month",
    "sleeping better",
    "preparing for a job interview",
    "staying focused while working from home",
    "starting to run",
    "writing a good cover letter",
    "learning to cook",
    "making new friends in a new city",
    "keeping a plant alive",
    "giving a presentation",
    "managing my time",
    "learning to play the guitar",
    "reducing screen time",
    "eating healthier",
    "traveling on a budget",
    "writing clean code",
    "reading more books",
    "staying motivated",
    "organizing my desk",
    "planning a small garden",
    "asking for a raise",
    "studying for a math test",
    "being more productive in the morning",
]
_ADVICE_TEMPLATES = [
    "Give me some advice on {x}.",
    "I need tips for {x}. What should I do?",
    "What are five practical tips for {x}?",
    "What mistakes should I avoid when {x}?",
    "Can you make a simple plan for {x}?",
]
_LISTS = [
    "countries in Europe and their capitals",
    "fruits that are high in vitamin C",
    "programming languages",
    "famous scientists and what they discovered",
    "planets in the solar system",
    "ideas for a weekend trip",
    "healthy breakfast ideas",
    "common Linux commands",
    "board games for families",
    "animals that live in the ocean",
    "musical instruments",
    "tips for writing an essay",
    "Python built-in functions",
    "kitchen tools",
    "hobbies to try",
    "vegetables that grow fast",
    "famous paintings and their painters",
    "sports played with a ball",
    "things to pack for a camping trip",
    "ways to reduce plastic waste",
    "features of a good website",
    "common data structures",
    "rivers in Africa",
    "inventions of the 20th century",
    "birthday party ideas",
    "books for learning programming",
    "exercises you can do at home",
    "reasons to learn history",
]
_LIST_TEMPLATES = [
    "List 10 {x}.",
    "Give me a numbered list of {x}.",
    "Name some {x}, one per line.",
    "Write a bulleted list of {x} with a short note for each.",
    "What are the 5 most important {x}? Number them.",
]
_CODE_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "merges two sorted lists",
    "counts the words in a text",
    "computes the factorial of n",
    "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping the order",
    "finds the largest element of a list",
    "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit",
    "reads a CSV file and returns its rows",
    "flattens a nested list",
    "computes the average of a list",
    "sorts a list of dictionaries by a key",
    "counts the vowels in a string",
    "implements binary search",
    "returns the intersection of two lists",
    "validates an email address with a regular expression",
    "capitalizes the first letter of every word",
    "computes the greatest common divisor",
    "generates all permutations of a list",
    "implements a stack class",
    "reads a JSON file",
    "chunks a list into pieces of size n",
    "returns the frequency of each character",
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
    """One chat request. ``category``: chat, advice, list, code, summary or code_edit (built in), user
    (``--data``) or self-instruct (written by the target, :mod:`specpipe.training.self_instruct`)."""

    category: str
    text: str


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
    pools.append(
        [
            Prompt("summary", template.format(x=doc))
            for doc in _module_docstrings(files)
            for template in _SUMMARY_TEMPLATES
        ]
    )
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
                    f'list: write {{"prompt": "..."}} or {{"messages": [...]}} on each line'
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
