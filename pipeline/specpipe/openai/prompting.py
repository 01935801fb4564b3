"""The gateway's tokenizer-side work before a request is sent: prompt text, token count, token budget.

Everything here runs before the HTTP status is sent, so that a request the deployment cannot serve is
a 400 with an OpenAI error object, streamed or not (issue 12, kind 4). The prompt is tokenized exactly
as the deployment's ``preprocessing`` model will tokenize it
(:class:`~specpipe.triton.models.preprocessing.Preprocessor`, same tokenizer, same
``add_special_tokens``), so the counts agree with the engine's.

Budget rules (as OpenAI and vLLM): ``max_tokens`` absent means the rest of the context; a prompt of
``max_context`` tokens or more, or ``prompt + max_tokens > max_context``, is refused naming the numbers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from specpipe.errors import SpecpipeError
from specpipe.openai.chat_template import ChatTemplate
from specpipe.openai.protocol import APIError, ParsedRequest
from specpipe.triton.models.preprocessing import Preprocessor


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt, ready for the ensemble.

    Attributes:
        text: the prompt text (``text_input``).
        segments: ``text_segments`` to send (empty when no message content needs plain-text tokenization).
        num_tokens: prompt length in tokens (``None`` when no tokenizer is known).
        max_tokens: the resolved token budget.
    """

    text: str
    segments: tuple[str, ...]
    num_tokens: int | None
    max_tokens: int


def context_limit(tokenizer_dir: str | Path) -> int | None:
    """``max_position_embeddings`` of the model config beside the tokenizer (the CPU engine's
    context; for TensorRT-LLM engines an upper bound), or ``None`` when there is none."""
    path = Path(tokenizer_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 1 else None


class Prompter:
    """Formats and measures prompts for one deployment.

    Args:
        tokenizer_dir: the deployment's tokenizer (``preprocessing``'s ``tokenizer_dir``).
        add_special_tokens: ``preprocessing``'s parameter of that name.
        max_context: prompt + output tokens the engine holds (``None``: read :func:`context_limit`).

    Raises (on construction):
        SpecpipeError: the tokenizer cannot be loaded.
    """

    def __init__(self, tokenizer_dir: str, add_special_tokens: bool = True, max_context: int | None = None):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        except OSError as exc:
            raise SpecpipeError(
                f"cannot load the tokenizer at {tokenizer_dir} ({exc}): run the gateway on the "
                f"server's machine or pass the tokenizer folder"
            ) from exc
        self.pre = Preprocessor(tokenizer, add_special_tokens)
        self.max_context = max_context if max_context is not None else context_limit(tokenizer_dir)
        self.specials = [s for s in self.pre.special_strings() if s]
        self._template: ChatTemplate | None = None
        self.tokenizer_dir = tokenizer_dir

    def template(self) -> ChatTemplate:
        """The chat template (loaded once).

        Raises:
            APIError: 400 when the tokenizer has no chat template.
        """
        if self._template is None:
            if not self.pre.tokenizer.chat_template:
                raise APIError(
                    400, "the deployment's tokenizer has no chat template: use /v1/completions with a formatted prompt"
                )
            self._template = ChatTemplate(self.tokenizer_dir)
        return self._template

    def prepare(self, parsed: ParsedRequest, segments_supported: bool = True) -> PreparedPrompt:
        """Prompt text, segments, token count and budget of ``parsed``.

        Raises:
            APIError: 400 when the prompt does not fit the context, ``max_tokens`` does not fit beside
                it, or content holds a special-token string that this deployment cannot keep as text.
        """
        segments: tuple[str, ...] = ()
        if parsed.chat:
            template = self.template()
            text = template.format(parsed.messages)
            if any(s in m["content"] for m in parsed.messages for s in self.specials):
                pieces = template.segments(parsed.messages)
                if pieces is None or not segments_supported:
                    raise APIError(
                        400,
                        "message content holds a special-token string (such as "
                        f"{next(s for s in self.specials if any(s in m['content'] for m in parsed.messages))!r}) "
                        "that this deployment cannot keep as plain text",
                        "messages",
                    )
                segments = tuple(pieces)
        else:
            text = parsed.prompt or ""
        try:
            ids = self.pre.encode_segments(list(segments)) if segments else self.pre.encode_prompt(text)
        except ValueError as exc:
            raise APIError(400, str(exc), "messages" if parsed.chat else "prompt") from exc
        return PreparedPrompt(
            text, segments, len(ids), self.budget(len(ids), parsed.max_tokens, "messages" if parsed.chat else "prompt")
        )

    def budget(self, prompt_tokens: int, max_tokens: int | None, prompt_param: str = "prompt") -> int:
        """The token budget: ``max_tokens``, or the rest of the context when absent.

        Raises:
            APIError: 400 naming the numbers when the prompt or the budget does not fit the context.
        """
        limit = self.max_context
        if limit is None:
            return max_tokens if max_tokens is not None else 512
        if prompt_tokens >= limit:
            raise APIError(
                400,
                f"the prompt has {prompt_tokens} tokens but the context limit is {limit} tokens: "
                f"shorten it to at most {limit - 1} tokens to leave room for output",
                prompt_param,
            )
        room = limit - prompt_tokens
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise APIError(
                400,
                f"max_tokens is {max_tokens} but the prompt has {prompt_tokens} tokens and the context "
                f"limit is {limit} tokens: ask for at most {room} tokens",
                "max_tokens",
            )
        return max_tokens

    def count_tokens(self, text: str) -> int:
        """Tokens of generated ``text`` (no special tokens added)."""
        return len(self.pre.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def warm_up(self) -> None:
        """Pay the first use's costs now: the chat template, one formatting and tokenization."""
        messages = [{"role": "user", "content": "Hello"}]
        text = self.template().format(messages) if self.pre.tokenizer.chat_template else "Hello"
        self.pre.encode_prompt(text)
        self.count_tokens(text)


#: Seconds between tries to load the tokenizer while Triton cannot name it yet.
WARM_UP_RETRY_S = 1.0


async def warm_up(prompter: Callable[[], Awaitable[Prompter]]) -> None:
    """Load a gateway's tokenizer (``prompter()``: transformers' import and the files, seconds) and warm
    it up before its first request, retrying while Triton cannot be asked (503); other failures are left
    to the requests to report."""
    while True:
        try:
            loaded = await prompter()
            break
        except APIError as exc:
            if exc.status != 503:
                return
        await asyncio.sleep(WARM_UP_RETRY_S)
    try:
        await asyncio.to_thread(loaded.warm_up)
    except Exception:  # noqa: BLE001 - the first request meets the same failure and reports it
        pass
