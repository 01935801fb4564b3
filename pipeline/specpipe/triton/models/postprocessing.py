"""``postprocessing`` Triton model: token ids -> text, exact under streaming.

Tensors (names from TensorRT-LLM's ``inflight_batcher_llm/postprocessing/config.pbtxt`` @ 89fd9b74),
batch size 1: ``TOKENS_BATCH`` INT32 ``[1, beam, T]``, ``SEQUENCE_LENGTH`` INT32 ``[1, beam]`` ->
``OUTPUT`` STRING ``[1, beam]``. specpipe adds the optional input ``PRIOR_TOKENS_BATCH`` INT32
``[1, beam, P]``: the tokens of the same request sent in earlier streamed responses.

Streaming and text boundaries. A token can end in the middle of a multi-byte character, and some
tokenizers decode a token differently depending on what precedes it, so decoding each streamed
chunk on its own does not give the text of the whole sequence. This model is stateless and instead
computes, for prior tokens ``p`` and new tokens ``n``::

    OUTPUT = visible(p + n)[len(visible(p)):]
    visible(ids) = decode(ids) without trailing U+FFFD (an incomplete character so far)

so the chunks of a stream telescope: their concatenation is ``visible(all tokens)``, which is what a
non-streamed request returns (``PRIOR_TOKENS_BATCH`` empty). Decoding uses
``clean_up_tokenization_spaces=False`` so that a later token never changes earlier text, and
``skip_special_tokens`` from the model parameter of that name (default true). Parameter
``tokenizer_dir``: absolute path of the Hugging Face tokenizer.

Abandoned requests. A request that arrives cancelled belongs to an ensemble request whose client went
away: the engine model still decodes it, so this model sends the engine model (parameter
``engine_model_name``, default ``tensorrt_llm``) TensorRT-LLM's stop request for its id, once
(:mod:`~specpipe.triton.models.stop_requests`). It still answers the request as usual: answered with an
error (``CANCELLED``), Triton 2.51 never released the ensemble request (it stayed in flight until the
server's exit timeout). A request sent without an id is named by the id the engine model gave it
(optional input ``ENGINE_REQUEST_ID``, its output ``engine_request_id``).
"""

from __future__ import annotations

import functools

import numpy as np

from specpipe.triton.interface import TENSORRT_LLM
from specpipe.triton.models.common import error_response, input_array, model_parameters, parse_bool, response, strings
from specpipe.triton.models.preprocessing import load_tokenizer
from specpipe.triton.models.stop_requests import AbandonedRequests, send_stop_request

REPLACEMENT = "\ufffd"


class Detokenizer:
    """Token ids -> text with the streaming rule above, independent of Triton.

    Args:
        tokenizer: a Hugging Face tokenizer.
        skip_special_tokens: drop special tokens (EOS ...) from the text.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def visible(self, ids: list[int]) -> str:
        """Text of ``ids`` without trailing replacement characters."""
        if not ids:
            return ""
        text = self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )
        return text.rstrip(REPLACEMENT)

    def delta(self, prior: list[int], new: list[int]) -> str:
        """Text that ``new`` adds after ``prior`` (all of ``visible(new)`` when ``prior`` is empty)."""
        now = self.visible(list(prior) + list(new))
        if not prior:
            return now
        before = self.visible(list(prior))
        if now.startswith(before):
            return now[len(before) :]
        # A decoder that rewrote earlier text: send from the first differing character (rare; the
        # concatenation then differs from the non-streamed text there).
        common = 0
        for a, b in zip(before, now):
            if a != b:
                break
            common += 1
        return now[common:]


def _rows(tokens: np.ndarray, lengths: np.ndarray | None) -> list[list[int]]:
    """Beams of request 0: ``tokens`` ``[1, beam, T]`` cut to ``lengths`` ``[1, beam]``."""
    array = np.asarray(tokens)
    if array.ndim < 2:
        array = array.reshape(1, -1)
    array = array.reshape(int(np.prod(array.shape[:-1])), array.shape[-1])
    limits = None if lengths is None else np.asarray(lengths).reshape(-1).tolist()
    rows = []
    for beam, row in enumerate(array):
        limit = row.shape[0] if limits is None or beam >= len(limits) else max(0, min(int(limits[beam]), row.shape[0]))
        rows.append([int(t) for t in row[:limit]])
    return rows


def _engine_request_id(request) -> str:
    """The engine model's id of the request (``ENGINE_REQUEST_ID``), ``""`` when absent or unreadable."""
    try:
        values = strings(input_array(request, "ENGINE_REQUEST_ID"), "ENGINE_REQUEST_ID")
    except ValueError:
        return ""
    return values[0] if values else ""


class TritonPythonModel:
    """Triton entry point (loaded through the repository's ``postprocessing/1/model.py``)."""

    def initialize(self, args):
        params = model_parameters(args)
        tokenizer = load_tokenizer(params.get("tokenizer_dir", ""))
        self.detok = Detokenizer(tokenizer, parse_bool(params.get("skip_special_tokens"), True))
        engine = params.get("engine_model_name") or TENSORRT_LLM.name
        self.abandoned = AbandonedRequests(functools.partial(send_stop_request, engine))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        self.abandoned.check(request.request_id() or _engine_request_id(request), request.is_cancelled())
        try:
            tokens = input_array(request, "TOKENS_BATCH")
            beams = _rows(tokens, input_array(request, "SEQUENCE_LENGTH"))
            prior_array = input_array(request, "PRIOR_TOKENS_BATCH")
            priors = _rows(prior_array, None) if prior_array is not None and prior_array.size else [[] for _ in beams]
            texts = [self.detok.delta(priors[i] if i < len(priors) else [], ids) for i, ids in enumerate(beams)]
        except ValueError as exc:
            return error_response(str(exc))
        return response({"OUTPUT": np.array([[t.encode("utf-8") for t in texts]], dtype=np.object_)})

    def finalize(self):
        pass
