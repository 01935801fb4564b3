"""Prompts the target writes itself (self-instruct), for self-distillation corpora.

Heads trained on answers to templated prompts learn those answers more than the target's language
(``benchmarks/draft_acceptance.py`` measures the gap; figures in ``docs/cpu-measurements.md``).
Requests that the target writes itself, sampled, vary in subject and phrasing. They need no downloaded
data set and no stronger model. The scheme follows Self-Instruct (Wang et al. 2023, arXiv:2212.10560),
reduced to one round without the paper's filtering model: the target is asked for a user message and its
reply becomes a prompt.

Each request is "Write {kind} about {topic} that a person might send to an AI assistant. Reply with only
that message, in one or two sentences.", in the target's chat template. Kind and topic come from
:data:`KINDS` and :data:`TOPICS`, drawn by ``random.Random(seed)``, which also draws each request's
sampling seed. The target answers with temperature 1.0, top-p 0.95 and at most 48 tokens. It runs on
the CPU runtime's batch scheduler, where a seeded request's text does not depend on its batch, so the
prompts are reproducible. :func:`extract_request` then keeps the user message from each reply.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from specpipe.generation.api import SamplingParams
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.drafters.drafters import NoDrafter
from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler
from specpipe.training.prompts import Prompt, chat_input_ids

TOPICS = (
    "cooking",
    "baking",
    "travel",
    "personal finance",
    "fitness",
    "running",
    "yoga",
    "gardening",
    "pets",
    "dogs",
    "cats",
    "parenting",
    "school homework",
    "mathematics",
    "algebra",
    "geometry",
    "statistics",
    "physics",
    "chemistry",
    "biology",
    "astronomy",
    "geology",
    "history",
    "ancient Rome",
    "world war history",
    "geography",
    "languages",
    "learning English",
    "grammar",
    "poetry",
    "novels",
    "writing stories",
    "music",
    "guitar",
    "piano",
    "movies",
    "video games",
    "board games",
    "sports",
    "football",
    "basketball",
    "chess",
    "photography",
    "painting",
    "drawing",
    "fashion",
    "home repair",
    "cleaning",
    "moving house",
    "renting an apartment",
    "buying a car",
    "car maintenance",
    "cycling",
    "public transport",
    "job interviews",
    "resumes",
    "careers",
    "starting a business",
    "marketing",
    "sales",
    "email writing",
    "meetings",
    "time management",
    "productivity",
    "stress",
    "mental health",
    "friendship",
    "relationships",
    "weddings",
    "birthdays",
    "holidays",
    "gifts",
    "shopping",
    "budgeting",
    "taxes",
    "insurance",
    "health",
    "nutrition",
    "vitamins",
    "sleep",
    "weather",
    "climate",
    "environment",
    "recycling",
    "energy",
    "electricity",
    "computers",
    "smartphones",
    "the internet",
    "social media",
    "privacy",
    "passwords",
    "Python programming",
    "JavaScript",
    "SQL databases",
    "Linux",
    "spreadsheets",
    "machine learning",
    "robots",
    "space travel",
    "oceans",
    "animals",
    "birds",
    "insects",
    "plants",
    "forests",
    "mountains",
    "rivers",
    "cities",
    "architecture",
    "philosophy",
    "ethics",
    "law",
    "politics",
    "economics",
    "psychology",
    "medicine",
    "first aid",
    "camping",
    "hiking",
    "fishing",
    "coffee",
    "tea",
    "wine",
    "restaurants",
    "etiquette",
    "public speaking",
    "debate",
    "negotiation",
    "volunteering",
    "charity",
    "art history",
    "museums",
    "science fiction",
    "mythology",
)
KINDS = (
    "a question",
    "a request for advice",
    "a request to write something",
    "a request to explain something",
    "a question that needs a list as an answer",
    "a request to compare two things",
    "a how-to question",
    "a request for a short plan",
    "a request for ideas",
    "a question a student might ask",
)
#: Replies that are the assistant talking, not a user message.
NOT_REQUESTS = ("I'm ready", "I'm sorry", "I'm here to help")
MIN_CHARS = 15
REQUEST_TOKENS = 48
BATCH = 32


def meta_requests(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` requests for a user message, each with the sampling seed of its answer."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        text = (
            f"Write {rng.choice(KINDS)} about {rng.choice(TOPICS)} that a person might send to an AI "
            "assistant. Reply with only that message, in one or two sentences."
        )
        requests.append((text, rng.randrange(2**31)))
    return requests


def extract_request(reply: str) -> str | None:
    """The user message in the target's reply: the part in the first pair of double quotes if there is
    one (it often writes ``A person might ask, "..."``), else the reply; its first line. ``None`` when
    that is shorter than :data:`MIN_CHARS` characters or the assistant speaking (:data:`NOT_REQUESTS`)."""
    text = reply.strip().strip('"').strip()
    if '"' in text:
        text = text.split('"')[1]
    text = text.split("\n")[0].strip()
    if len(text) < MIN_CHARS or text.startswith(NOT_REQUESTS):
        return None
    return text


def self_instruct_prompts(model, tokenizer, count: int, seed: int, cache_file: Path, progress=None) -> list[Prompt]:
    """Up to ``count`` distinct prompts written by the target (fewer: replies that are not usable
    requests or repeat an earlier one are dropped; about 40 % are kept with SmolLM2-135M).

    Args:
        model: the target (fp32, eval; prepacked linear layers make it faster); tokenizer: its tokenizer.
        count: requests for a user message sent to the target.
        seed: draws kinds, topics and sampling seeds.
        cache_file: JSONL of ``{"prompt": ...}`` lines, read instead of generating when it exists, written
            when generation completes (a partial run leaves nothing).
        progress: called with the number of replies finished, or ``None``.

    Returns:
        prompts of category ``"self-instruct"``, in request order.
    """
    if cache_file.is_file():
        return [Prompt("self-instruct", json.loads(line)["prompt"]) for line in cache_file.read_text().splitlines()]
    scheduler = BatchScheduler(
        Deployment(model, NoDrafter(), max_draft_len=0), max_batch_size=BATCH, max_queue=max(count, 1), adaptive=False
    )
    replies: list[list[int]] = []
    for text, sampling_seed in meta_requests(count, seed):
        ids = chat_input_ids(tokenizer, Prompt("self-instruct", text))
        reply: list[int] = []
        replies.append(reply)
        params = SamplingParams(max_tokens=REQUEST_TOKENS, temperature=1.0, top_p=0.95, seed=sampling_seed)

        def emit(out, reply=reply):
            reply.extend(out.token_ids)
            if out.finished and progress:
                progress(1)

        scheduler.submit(ids, params, emit)
    while scheduler.has_work:
        scheduler.step()
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for reply in replies:
        request = extract_request(tokenizer.decode(reply, skip_special_tokens=True))
        if request is not None and request.lower() not in seen:
            seen.add(request.lower())
            prompts.append(Prompt("self-instruct", request))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    partial = cache_file.with_suffix(".partial")
    partial.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
    partial.replace(cache_file)
    return prompts
