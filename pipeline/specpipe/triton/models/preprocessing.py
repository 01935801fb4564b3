"""``preprocessing`` Triton model: prompt text and word lists -> token ids.

Tensors (see :data:`specpipe.triton.interface.PREPROCESSING`; names from TensorRT-LLM's
``inflight_batcher_llm/preprocessing/config.pbtxt`` @ 808059da), per request with batch size 1:

- ``QUERY`` STRING ``[1, 1]`` -> ``INPUT_ID`` INT32 ``[1, L]`` and ``REQUEST_INPUT_LEN`` INT32 ``[1, 1]``.
- ``REQUEST_OUTPUT_LEN`` INT32 ``[1, 1]`` -> ``REQUEST_OUTPUT_LEN`` INT32 ``[1, 1]`` (passed through).
- ``STOP_WORDS_DICT`` / ``BAD_WORDS_DICT`` STRING ``[1, W]`` (optional) -> ``STOP_WORDS_IDS`` /
  ``BAD_WORDS_IDS`` INT32 ``[1, 2, N]`` (layout in :mod:`specpipe.triton.models.words`).
- ``QUERY_SEGMENTS`` STRING ``[1, S]`` (optional, specpipe): ``QUERY`` in pieces; their concatenation
  must equal ``QUERY``. Even pieces (0, 2, ...) are tokenized like ``QUERY`` (special-token strings
  become control tokens: a chat template's own markers); odd pieces (user text) are tokenized as
  plain text (``split_special_tokens``), so ``<|im_end|>`` typed by a user stays text.
- ``END_ID`` / ``PAD_ID`` INT32 ``[1, 1]`` (optional) -> ``OUT_END_ID`` / ``OUT_PAD_ID`` INT32 ``[1, 1]``:
  the client's value, else the tokenizer's EOS (pad: the tokenizer's pad, else EOS); -1 when the
  tokenizer has none.

The chat template is not applied here: clients send the final prompt text. Parameters:
``tokenizer_dir`` (absolute path of a Hugging Face tokenizer) and ``add_special_tokens``
(``true``: the tokenizer's special tokens such as BOS are added, but never a second BOS when the
text already starts with it).
"""

from __future__ import annotations

import numpy as np

from specpipe.triton.models.common import (
    error_response,
    input_array,
    model_parameters,
    parse_bool,
    response,
    scalar,
    strings,
)
from specpipe.triton.models.words import to_words_layout


class Preprocessor:
    """Tokenizer-side work of the ``preprocessing`` model, independent of Triton.

    Args:
        tokenizer: a Hugging Face tokenizer (``PreTrainedTokenizerBase``).
        add_special_tokens: let the tokenizer add its special tokens (e.g. BOS) to prompts.
    """

    def __init__(self, tokenizer, add_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of ``text``.

        Raises:
            ValueError: ``text`` is empty.
        """
        if text == "":
            raise ValueError("text_input is empty: send a prompt of at least one character")
        ids = list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))
        bos, bos_id = self.tokenizer.bos_token, self.tokenizer.bos_token_id
        if bos and bos_id is not None and text.startswith(bos) and ids[:2] == [bos_id, bos_id]:
            ids = ids[1:]  # the prompt already carried BOS (chat templates often do)
        return ids

    def special_strings(self) -> list[str]:
        """Strings the tokenizer turns into added (control) tokens, e.g. ``<|im_end|>``."""
        decoder = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return sorted({str(token) for token in decoder.values() if str(token)} | set(self.tokenizer.all_special_tokens))

    def encode_segments(self, segments: list[str]) -> list[int]:
        """Token ids of the concatenated ``segments``: even pieces as :meth:`encode_prompt` would (the
        tokenizer's special tokens such as BOS added once, at the start), odd pieces as plain text.

        Raises:
            ValueError: the pieces are all empty.
        """
        if not "".join(segments):
            raise ValueError("text_input is empty: send a prompt of at least one character")
        if len(segments) == 1:
            return self.encode_prompt(segments[0])
        ids: list[int] = []
        for index, piece in enumerate(segments):
            if not piece:
                continue
            if index % 2:
                ids += list(self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True))
            else:
                ids += list(self.tokenizer.encode(piece, add_special_tokens=False))
        if self.add_special_tokens:
            ids = self._with_special_tokens(ids)
        return ids

    def _with_special_tokens(self, ids: list[int]) -> list[int]:
        """``ids`` with the tokenizer's added BOS/EOS (as ``encode`` would add), never a second BOS."""
        build = getattr(self.tokenizer, "build_inputs_with_special_tokens", None)
        full = list(build(ids)) if build is not None else list(ids)
        bos_id = self.tokenizer.bos_token_id
        if bos_id is not None and full[:2] == [bos_id, bos_id]:
            full = full[1:]
        return full

    def encode_words(self, words: list[str]) -> np.ndarray:
        """``[2, N]`` INT32 layout of ``words``, each tokenized without special tokens."""
        return to_words_layout([self.tokenizer.encode(w, add_special_tokens=False) for w in words if w])

    @property
    def default_end_id(self) -> int:
        """The tokenizer's EOS id, or -1 when it has none."""
        eos = self.tokenizer.eos_token_id
        return -1 if eos is None else int(eos)

    @property
    def default_pad_id(self) -> int:
        """The tokenizer's pad id, else its EOS id, else -1."""
        pad = self.tokenizer.pad_token_id
        return self.default_end_id if pad is None else int(pad)

    def outputs(
        self,
        query: str,
        output_len: int,
        stop_words: list[str],
        bad_words: list[str],
        end_id: int | None,
        pad_id: int | None,
        segments: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """All output tensors for one request (batch size 1), keyed by output name.

        Raises:
            ValueError: an empty prompt, ``max_tokens`` < 1, segments that do not join to ``query``.
        """
        if output_len < 1:
            raise ValueError(f"max_tokens must be >= 1, got {output_len}")
        if segments:
            if "".join(segments) != query:
                raise ValueError("text_segments must join to exactly text_input: send the same prompt in both")
            ids = self.encode_segments(segments)
        else:
            ids = self.encode_prompt(query)
        end = self.default_end_id if end_id is None else int(end_id)
        pad = self.default_pad_id if pad_id is None else int(pad_id)
        return {
            "INPUT_ID": np.array([ids], dtype=np.int32).reshape(1, len(ids)),
            "REQUEST_INPUT_LEN": np.array([[len(ids)]], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[output_len]], dtype=np.int32),
            "STOP_WORDS_IDS": self.encode_words(stop_words)[np.newaxis],
            "BAD_WORDS_IDS": self.encode_words(bad_words)[np.newaxis],
            "OUT_END_ID": np.array([[end]], dtype=np.int32),
            "OUT_PAD_ID": np.array([[pad]], dtype=np.int32),
        }


def load_tokenizer(tokenizer_dir: str):
    """``AutoTokenizer.from_pretrained(tokenizer_dir)``.

    Raises:
        ValueError: ``tokenizer_dir`` is unset (the model config lacks the parameter).
    """
    if not tokenizer_dir:
        raise ValueError(
            "parameter 'tokenizer_dir' is missing from the model config: regenerate it with 'specpipe package'"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


class TritonPythonModel:
    """Triton entry point (loaded through the repository's ``preprocessing/1/model.py``)."""

    def initialize(self, args):
        params = model_parameters(args)
        tokenizer = load_tokenizer(params.get("tokenizer_dir", ""))
        self.pre = Preprocessor(tokenizer, parse_bool(params.get("add_special_tokens"), True))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            query = strings(input_array(request, "QUERY"), "text_input")
            if len(query) != 1:
                raise ValueError(f"text_input must hold one prompt per request, got {len(query)}")
            output_len = scalar(input_array(request, "REQUEST_OUTPUT_LEN"), "max_tokens")
            outputs = self.pre.outputs(
                query[0],
                int(output_len),
                strings(input_array(request, "STOP_WORDS_DICT"), "stop_words"),
                strings(input_array(request, "BAD_WORDS_DICT"), "bad_words"),
                scalar(input_array(request, "END_ID"), "end_id"),
                scalar(input_array(request, "PAD_ID"), "pad_id"),
                strings(input_array(request, "QUERY_SEGMENTS"), "text_segments") or None,
            )
        except (ValueError, UnicodeDecodeError) as exc:
            return error_response(str(exc))
        return response(outputs)

    def finalize(self):
        pass
