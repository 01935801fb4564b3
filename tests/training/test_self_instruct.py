"""Self-instruct prompts: the target writes the requests it then answers (specpipe.training.self_instruct)."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_llama

from specpipe.training import self_instruct
from specpipe.training.self_instruct import KINDS, TOPICS, extract_request, meta_requests, self_instruct_prompts


def test_meta_requests_are_drawn_from_the_seed_alone():
    first, again, other = meta_requests(50, 0), meta_requests(50, 0), meta_requests(50, 1)
    assert first == again and first != other
    assert len({seed for _, seed in first}) == 50
    text = first[0][0]
    assert text.startswith("Write ") and any(f" {kind} about " in text for kind in KINDS)
    assert any(f" about {topic} that a person" in text for topic in TOPICS)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ('A person might ask, "How can I manage my stress effectively?"', "How can I manage my stress effectively?"),
        ('"What is the best way to ride a bike?', "What is the best way to ride a bike?"),
        (
            "Plan a three-day trip to Rome on a budget.\n\nThis request asks for...",
            "Plan a three-day trip to Rome on a budget.",
        ),
        ("Ghost in the Shell", "Ghost in the Shell"),
        ("Too short.", None),
        ("I'm ready to help. What can I assist you with today?", None),
        ("I'm sorry for any misunderstanding, but as a chatbot I cannot", None),
        ('Someone might write: "Hi"', None),
    ],
)
def test_extract_request_keeps_the_user_message(reply, expected):
    assert extract_request(reply) == expected


class _LetterTokenizer:
    """Ids <-> text for a 64-token model: a chat request becomes ids from its characters; ids decode to
    letters with a space every fifth token."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return {"input_ids": [ord(c) % 60 + 2 for c in messages[0]["content"]][:40]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) + (" " if n % 5 == 4 else "") for n, i in enumerate(ids))


def test_prompts_are_reproducible_whatever_the_batch_and_are_cached(tmp_path, monkeypatch):
    model, tokenizer = tiny_llama(3), _LetterTokenizer()
    finished = []
    batched = self_instruct_prompts(
        model, tokenizer, 12, seed=5, cache_file=tmp_path / "a.jsonl", progress=finished.append
    )
    monkeypatch.setattr(self_instruct, "BATCH", 1)
    alone = self_instruct_prompts(model, tokenizer, 12, seed=5, cache_file=tmp_path / "b.jsonl")
    assert [p.text for p in batched] == [p.text for p in alone] and sum(finished) == 12
    assert 0 < len(batched) <= 12 and len({p.text.lower() for p in batched}) == len(batched)
    assert {p.category for p in batched} == {"self-instruct"}
    other = self_instruct_prompts(model, tokenizer, 12, seed=6, cache_file=tmp_path / "c.jsonl")
    assert [p.text for p in other] != [p.text for p in batched]

    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == [p.text for p in batched]
    monkeypatch.setattr(self_instruct, "BatchScheduler", None)  # a cached set is read, not generated again
    assert self_instruct_prompts(model, tokenizer, 12, seed=5, cache_file=tmp_path / "a.jsonl") == batched
    assert not list(tmp_path.glob("*.partial"))


class _ChatLetterTokenizer(_LetterTokenizer):
    """What self-distillation also reads: end and padding ids."""

    eos_token_id, pad_token_id = 1, 0


def test_a_corpus_of_self_instruct_prompts_alone_is_answered_and_extracted(tmp_path):
    from specpipe.errors import SpecpipeError
    from specpipe.training.data import CorpusSpec, build_corpus

    model, tokenizer = tiny_llama(4, eos_token_id=1), _ChatLetterTokenizer()
    model.save_pretrained(tmp_path / "target")
    spec = CorpusSpec(num_prompts=0, stdlib_tokens=0, max_new_tokens=6, self_instruct=10)
    features = build_corpus(model, tokenizer, tmp_path / "target", spec, tmp_path / "cache")
    written = [
        json.loads(line)["prompt"]
        for line in next((tmp_path / "cache").glob("self-instruct-*-10-0.jsonl")).read_text().splitlines()
    ]
    answers = [json.loads(line) for line in next((tmp_path / "cache").glob("answers-*.jsonl")).read_text().splitlines()]
    assert written and len(answers) == len(written)
    assert int(features.is_answer.sum()) == sum(len(a["answer_ids"]) for a in answers) > 0
    with pytest.raises(SpecpipeError, match="corpus is empty"):
        build_corpus(
            model, tokenizer, tmp_path / "target", CorpusSpec(num_prompts=0, stdlib_tokens=0), tmp_path / "cache"
        )
