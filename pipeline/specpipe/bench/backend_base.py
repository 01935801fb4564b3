"""What both bench backends (:mod:`specpipe.bench.backends`, :mod:`specpipe.bench.openai_backend`) share:
how their requests decode (:class:`Sampling`), how a request's output token count is found
(:func:`output_count`, :class:`TokenCounter`) and the one-line text of a failure (:func:`short_error`)."""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.client.llm import GenerationResult


@dataclass(frozen=True)
class Sampling:
    """How requests decode: greedy when ``temperature`` is ``None`` or 0 and ``top_p`` is ``None``.

    Attributes:
        temperature: softmax temperature (> 0 samples), or ``None``.
        top_p: nucleus probability mass in (0, 1], or ``None``.
        ignore_eos: generate exactly ``max_tokens`` tokens (module doc of :mod:`specpipe.bench.backends`).
    """

    temperature: float | None = None
    top_p: float | None = None
    ignore_eos: bool = False


class TokenCounter:
    """Counts tokens of a text with a tokenizer (a local directory or a Hugging Face id), lazily loaded."""

    def __init__(self, source: str | None):
        self.source = source
        self._tokenizer = None

    def __bool__(self) -> bool:
        return bool(self.source)

    def count(self, text: str) -> int:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.source)
        return len(self._tokenizer.encode(text, add_special_tokens=False))


def output_count(
    result: GenerationResult, usage_tokens: int | None, counter: TokenCounter | None
) -> tuple[int | None, str]:
    """The output token count of one request and where it came from (see ``RequestRecord``)."""
    if "num_output_tokens" in result.perf:
        return int(result.perf["num_output_tokens"]), "server"
    if usage_tokens is not None:
        return int(usage_tokens), "usage"
    if counter:
        return counter.count(result.text), "tokenizer"
    return len(result.chunks), "chunks"


def short_error(exc: BaseException) -> str:
    """The first line of ``exc``'s message (gRPC errors: their ``message()``), at most 200 characters."""
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return (message or type(exc).__name__).strip().splitlines()[0][:200]
