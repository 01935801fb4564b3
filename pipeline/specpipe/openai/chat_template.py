"""Formatting chat messages with the deployment's tokenizer chat template.

The tokenizer is the one the deployment's ``preprocessing`` model reads (its ``tokenizer_dir``
parameter, TensorRT-LLM's key), so the prompt text is exactly what the model was trained to see.

Message content is user text, never markup: :meth:`ChatTemplate.segments` splits the formatted prompt
into the template's own text and each message's content, so that content holding a special-token
string such as ``<|im_end|>`` is tokenized as plain text (it cannot close its turn or open another
role's) while the template's markers stay control tokens.
"""

from __future__ import annotations

import uuid

from specpipe.errors import SpecpipeError


class ChatTemplate:
    """``tokenizer.apply_chat_template`` of one tokenizer, loaded once.

    Raises (on construction):
        SpecpipeError: the tokenizer cannot be loaded or has no chat template.
    """

    def __init__(self, tokenizer_source: str):
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
        except OSError as exc:
            raise SpecpipeError(
                f"cannot load the tokenizer at {tokenizer_source} ({exc}): run the gateway on the "
                f"server's machine or pass the tokenizer folder"
            ) from exc
        if not self.tokenizer.chat_template:
            raise SpecpipeError(
                f"the tokenizer at {tokenizer_source} has no chat template: use /v1/completions with a formatted prompt"
            )
        self.source = tokenizer_source

    def format(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages`` with the assistant's turn opened (generation prompt added)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def segments(self, messages: list[dict[str, str]]) -> list[str] | None:
        """The formatted prompt as alternating pieces: template text (even positions) and message
        content (odd positions), joining to exactly :meth:`format`'s text.

        Each content is replaced by a unique marker, the template applied, and the markers put back;
        ``None`` when the template transforms content so that this does not reproduce the prompt.
        """
        markers = [f"\x00specpipe-content-{i}-{uuid.uuid4().hex}\x00" for i in range(len(messages))]
        marked = self.format([{**m, "content": marker} for m, marker in zip(messages, markers)])
        pieces: list[str] = []
        rest = marked
        for marker, message in zip(markers, messages):
            before, found, rest = rest.partition(marker)
            if not found or marker in rest:
                return None
            pieces += [before, message["content"]]
        pieces.append(rest)
        if "".join(pieces) != self.format(messages):
            return None
        return pieces
