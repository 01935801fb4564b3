"""``tensorrt_llm_bls``: specpipe's Python BLS model for draft-target speculative decoding.

Per request (decoupled; streaming included):

1. ``preprocessing`` tokenizes the prompt, stop words and bad words;
2. :class:`~specpipe.triton.models.draft_loop.DraftTargetLoop` alternates ``tensorrt_llm_draft``
   (``request_output_len`` = k, greedy, prompt excluded from the output) and ``tensorrt_llm`` (the
   drafts as ``draft_input_ids``, ``request_output_len`` = k + 1, the request's sampling inputs), the
   tensors TensorRT-LLM's draft-target mode reads (``draft_input_ids``; with ``use_draft_logits`` also
   ``draft_logits``, the draft engine's ``generation_logits``);
3. ``postprocessing`` turns tokens into text: with ``stream`` one response per target step, whose
   text is exactly what the step adds (``PRIOR_TOKENS_BATCH`` carries the tokens already sent);
   otherwise one response at the end (prompt included unless ``exclude_input_in_output``).

Inputs and outputs: :data:`specpipe.triton.interface.TENSORRT_LLM_BLS` (the ensemble's plus
``num_draft_tokens`` INT32 and ``use_draft_logits`` BOOL, as TensorRT-LLM's own BLS). Bad requests
(``max_tokens`` < 1, ``num_draft_tokens`` outside 0..max_draft_len, ``use_draft_logits`` without
draft logits ...) get an ``INVALID_ARG`` error response; failures of a called model are passed on.

Parameters: ``tensorrt_llm_model_name``, ``tensorrt_llm_draft_model_name``,
``preprocessing_model_name``, ``postprocessing_model_name``, ``num_draft_tokens`` (default per
request), ``max_draft_len`` (the target engine's), ``draft_logits_available`` (the draft engine was
built with ``--gather_generation_logits``), ``max_concurrent_requests`` (worker threads).
"""

from __future__ import annotations

import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from specpipe.triton.models.common import (
    error_response,
    input_array,
    model_parameters,
    parse_bool,
    pb_utils,
    response,
    scalar,
)
from specpipe.triton.models.draft_loop import DraftTargetLoop, LoopStats
from specpipe.triton.models.words import from_words_layout


class RequestError(ValueError):
    """A bad request: answered with ``INVALID_ARG``."""


class CalledModelError(RuntimeError):
    """A model called by the BLS answered with an error."""


@dataclass
class BlsRequest:
    """One request's inputs (arrays with the batch dimension, as received)."""

    text: np.ndarray
    max_tokens: int
    stream: bool
    exclude_input: bool
    perf: bool
    num_input: bool
    num_output: bool
    num_draft_tokens: int
    use_draft_logits: bool
    sampling: dict[str, np.ndarray]
    words: dict[str, np.ndarray]


def _flag(request, name: str, default: bool = False) -> bool:
    value = scalar(input_array(request, name), name)
    return default if value is None else bool(value)


def _i32(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def _ids(tokens: list[int]) -> np.ndarray:
    return np.array(tokens, dtype=np.int32).reshape(1, len(tokens))


class Caller:
    """BLS calls to the other models of the repository (``exec`` of ``pb_utils.InferenceRequest``)."""

    def __init__(self, names: dict[str, str]):
        self.names = names

    def call(
        self, model: str, inputs: dict[str, np.ndarray], outputs: list[str], decoupled: bool
    ) -> dict[str, np.ndarray]:
        """Outputs of one request to ``model``; for decoupled models the response carrying data.

        Raises:
            CalledModelError: the model answered with an error.
        """
        pb = pb_utils()
        request = pb.InferenceRequest(
            model_name=self.names[model],
            requested_output_names=outputs,
            inputs=[pb.Tensor(k, v) for k, v in inputs.items()],
        )
        responses = request.exec(decoupled=True) if decoupled else [request.exec()]
        found: dict[str, np.ndarray] = {}
        for reply in responses:
            if reply.has_error():
                raise CalledModelError(f"{self.names[model]}: {reply.error().message()}")
            for name in outputs:
                tensor = pb.get_output_tensor_by_name(reply, name)
                if tensor is not None:
                    found[name] = tensor.as_numpy()
        return found


class BlsModel:
    """The model's logic, given a :class:`Caller`-like object (tests pass a fake one)."""

    def __init__(self, caller, max_draft_len: int, default_draft_tokens: int, draft_logits: bool):
        self.caller = caller
        self.max_draft_len = max_draft_len
        self.default_draft_tokens = default_draft_tokens
        self.draft_logits = draft_logits

    def check(self, req: BlsRequest) -> None:
        """Raises :class:`RequestError` for a request the loop cannot serve."""
        if req.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {req.max_tokens}")
        if not 0 <= req.num_draft_tokens <= self.max_draft_len:
            raise RequestError(
                f"num_draft_tokens must be in 0..{self.max_draft_len} (the target engine's max_draft_len), got {req.num_draft_tokens}"
            )
        if req.use_draft_logits and not self.draft_logits:
            raise RequestError(
                "use_draft_logits needs the draft engine's generation logits, but it was built without "
                "--gather_generation_logits: send use_draft_logits false"
            )

    def preprocess(self, req: BlsRequest) -> dict[str, np.ndarray]:
        inputs = {"QUERY": req.text, "REQUEST_OUTPUT_LEN": _i32(req.max_tokens), **req.words}
        return self.caller.call(
            "preprocessing",
            inputs,
            ["INPUT_ID", "STOP_WORDS_IDS", "BAD_WORDS_IDS", "OUT_END_ID", "OUT_PAD_ID"],
            decoupled=False,
        )

    def _engine_inputs(self, sequence: list[int], output_len: int, pre: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {
            "input_ids": _ids(sequence),
            "input_lengths": _i32(len(sequence)),
            "request_output_len": _i32(output_len),
            "end_id": pre["OUT_END_ID"].astype(np.int32).reshape(1, 1),
            "pad_id": pre["OUT_PAD_ID"].astype(np.int32).reshape(1, 1),
            "exclude_input_in_output": np.array([[True]]),
            "streaming": np.array([[False]]),
        }
        if from_words_layout(pre.get("BAD_WORDS_IDS")):
            inputs["bad_words_list"] = pre["BAD_WORDS_IDS"].astype(np.int32)
        return inputs

    @staticmethod
    def _tokens(outputs: dict[str, np.ndarray]) -> list[int]:
        ids = outputs.get("output_ids")
        if ids is None:
            return []
        row = np.asarray(ids).reshape(-1, np.asarray(ids).shape[-1])[0] if np.asarray(ids).size else np.array([])
        length = outputs.get("sequence_length")
        n = int(np.asarray(length).reshape(-1)[0]) if length is not None else len(row)
        return [int(t) for t in row[:n]]

    def draft(self, sequence: list[int], k: int, pre, req: BlsRequest, logits_out: list) -> list[int]:
        inputs = self._engine_inputs(sequence, k, pre)
        wanted = ["output_ids", "sequence_length"]
        if req.use_draft_logits:
            inputs["return_generation_logits"] = np.array([[True]])
            wanted.append("generation_logits")
        outputs = self.caller.call("tensorrt_llm_draft", inputs, wanted, decoupled=True)
        tokens = self._tokens(outputs)
        if req.use_draft_logits:
            logits = outputs.get("generation_logits")
            if logits is None:
                raise CalledModelError("the draft model returned no generation_logits for use_draft_logits")
            logits_out[:] = [
                np.asarray(logits, dtype=np.float32).reshape(-1, np.asarray(logits).shape[-1])[: len(tokens)]
            ]
        return tokens

    def verify(self, sequence: list[int], drafts: list[int], pre, req: BlsRequest, logits: list) -> list[int]:
        inputs = self._engine_inputs(sequence, len(drafts) + 1, pre)
        inputs.update(req.sampling)
        if drafts:
            inputs["draft_input_ids"] = _ids(drafts)
            if req.use_draft_logits and logits:
                inputs["draft_logits"] = logits[0][np.newaxis]
        return self._tokens(self.caller.call("tensorrt_llm", inputs, ["output_ids", "sequence_length"], decoupled=True))

    def postprocess(self, tokens: list[int], prior: list[int]) -> np.ndarray:
        inputs = {
            "TOKENS_BATCH": np.array(tokens, dtype=np.int32).reshape(1, 1, len(tokens)),
            "SEQUENCE_LENGTH": _i32(len(tokens)),
        }
        if prior:
            inputs["PRIOR_TOKENS_BATCH"] = np.array(prior, dtype=np.int32).reshape(1, 1, len(prior))
        return self.caller.call("postprocessing", inputs, ["OUTPUT"], decoupled=False)["OUTPUT"]

    def outputs(
        self, req: BlsRequest, text: np.ndarray, stats: LoopStats, n_in: int, n_out: int
    ) -> dict[str, np.ndarray]:
        out = {"text_output": np.asarray(text, dtype=np.object_).reshape(1, -1)}
        if req.perf:
            out["acceptance_rate"] = np.array([[stats.acceptance_rate]], dtype=np.float32)
            out["total_accepted_draft_tokens"] = _i32(stats.total_accepted_draft_tokens)
            out["total_draft_tokens"] = _i32(stats.total_draft_tokens)
        if req.perf or req.num_input:
            out["num_input_tokens"] = _i32(n_in)
        if req.perf or req.num_output:
            out["num_output_tokens"] = _i32(n_out)
        return out

    def run(self, req: BlsRequest, emit) -> None:
        """Serve ``req``; ``emit(outputs, final)`` sends a response.

        Raises:
            RequestError: a bad request. CalledModelError: a called model failed.
        """
        self.check(req)
        pre = self.preprocess(req)
        prompt = [int(t) for t in np.asarray(pre["INPUT_ID"]).reshape(-1)]
        end_id = int(np.asarray(pre["OUT_END_ID"]).reshape(-1)[0])
        logits: list = []
        loop = DraftTargetLoop(
            lambda seq, k: self.draft(seq, k, pre, req, logits),
            lambda seq, drafts: self.verify(seq, drafts, pre, req, logits),
        )
        generated: list[int] = []
        stats = LoopStats()
        for chunk in loop.run(
            prompt,
            req.max_tokens,
            req.num_draft_tokens,
            [end_id] if end_id >= 0 else [],
            from_words_layout(pre.get("STOP_WORDS_IDS")),
        ):
            stats = chunk.stats
            if req.stream and (chunk.tokens or chunk.finished):
                text = (
                    self.postprocess(chunk.tokens, generated) if chunk.tokens else np.array([[b""]], dtype=np.object_)
                )
                emit(self.outputs(req, text, stats, len(prompt), len(generated) + len(chunk.tokens)), chunk.finished)
            generated.extend(chunk.tokens)
        if not req.stream:
            tokens = generated if req.exclude_input else prompt + generated
            emit(self.outputs(req, self.postprocess(tokens, []), stats, len(prompt), len(generated)), True)


def read_request(request, default_draft_tokens: int) -> BlsRequest:
    """A :class:`BlsRequest` from a Triton request.

    Raises:
        RequestError: missing ``text_input``/``max_tokens`` or a malformed scalar.
    """
    try:
        text = input_array(request, "text_input")
        max_tokens = scalar(input_array(request, "max_tokens"), "max_tokens")
        if text is None or max_tokens is None:
            raise RequestError("text_input and max_tokens are required")
        draft_tokens = scalar(input_array(request, "num_draft_tokens"), "num_draft_tokens")
        min_tokens = scalar(input_array(request, "min_tokens"), "min_tokens")
        if min_tokens is not None and int(min_tokens) != 0:
            raise RequestError(
                f"min_tokens is not supported by tensorrt_llm_bls (draft-target), got {int(min_tokens)}: send 0 or leave it out"
            )
        sampling = {}
        for src, dst in (
            ("top_k", "runtime_top_k"),
            ("top_p", "runtime_top_p"),
            ("temperature", "temperature"),
            ("seed", "seed"),
            ("repetition_penalty", "repetition_penalty"),
            ("presence_penalty", "presence_penalty"),
            ("frequency_penalty", "frequency_penalty"),
        ):
            value = input_array(request, src)
            if value is not None:
                sampling[dst] = np.asarray(value).reshape(1, 1)
        words = {}
        for src, dst in (
            ("bad_words", "BAD_WORDS_DICT"),
            ("stop_words", "STOP_WORDS_DICT"),
            ("end_id", "END_ID"),
            ("pad_id", "PAD_ID"),
        ):
            value = input_array(request, src)
            if value is not None:
                words[dst] = np.asarray(value).reshape(1, -1)
        return BlsRequest(
            text=np.asarray(text).reshape(1, 1),
            max_tokens=int(max_tokens),
            stream=_flag(request, "stream"),
            exclude_input=_flag(request, "exclude_input_in_output"),
            perf=_flag(request, "return_perf_metrics"),
            num_input=_flag(request, "return_num_input_tokens"),
            num_output=_flag(request, "return_num_output_tokens"),
            num_draft_tokens=default_draft_tokens if draft_tokens is None else int(draft_tokens),
            use_draft_logits=_flag(request, "use_draft_logits"),
            sampling=sampling,
            words=words,
        )
    except ValueError as exc:
        raise RequestError(str(exc)) from exc


class TritonPythonModel:
    """Triton entry point (loaded through the repository's ``tensorrt_llm_bls/1/model.py``)."""

    def initialize(self, args):
        params = model_parameters(args)
        names = {
            "tensorrt_llm": params.get("tensorrt_llm_model_name") or "tensorrt_llm",
            "tensorrt_llm_draft": params.get("tensorrt_llm_draft_model_name") or "tensorrt_llm_draft",
            "preprocessing": params.get("preprocessing_model_name") or "preprocessing",
            "postprocessing": params.get("postprocessing_model_name") or "postprocessing",
        }
        max_draft_len = int(params.get("max_draft_len") or 0)
        self.default_draft_tokens = int(params.get("num_draft_tokens") or max_draft_len)
        self.model = BlsModel(
            Caller(names),
            max_draft_len,
            self.default_draft_tokens,
            parse_bool(params.get("draft_logits_available"), False),
        )
        self.pool = ThreadPoolExecutor(
            max_workers=max(1, int(params.get("max_concurrent_requests") or 1)), thread_name_prefix="specpipe-bls"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = read_request(request, self.default_draft_tokens)
            except RequestError as exc:
                sender.send(error_response(str(exc)), flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self.pool.submit(self._serve, request, parsed, sender)
        return None

    def _serve(self, request, parsed: BlsRequest, sender) -> None:
        final = pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sent_final = False

        def emit(outputs, is_final):
            nonlocal sent_final
            sender.send(response(outputs), flags=final if is_final else 0)
            sent_final = sent_final or is_final

        try:
            self.model.run(parsed, emit)
        except RequestError as exc:
            sender.send(error_response(str(exc)), flags=final)
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            pb_utils().Logger.log_error(f"tensorrt_llm_bls failed: {exc}\n{traceback.format_exc()}")
            if not sent_final:
                sender.send(
                    error_response(f"tensorrt_llm_bls failed: {type(exc).__name__}: {exc}", "INTERNAL"), flags=final
                )

    def finalize(self):
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
