"""Formatting chat messages with the deployment's tokenizer chat template.

The tokenizer is the one the deployment's ``preprocessing`` model reads (its ``tokenizer_dir``
parameter, TensorRT-LLM's key), so the prompt text is exactly what the model was trained to see.
"""

from __future__ import annotations

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
            raise SpecpipeError(f"cannot load the tokenizer at {tokenizer_source} ({exc}): run the gateway on the "
                                f"server's machine or pass the tokenizer folder") from exc
        if not self.tokenizer.chat_template:
            raise SpecpipeError(f"the tokenizer at {tokenizer_source} has no chat template: use /v1/completions with a formatted prompt")
        self.source = tokenizer_source

    def format(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages`` with the assistant's turn opened (generation prompt added)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
