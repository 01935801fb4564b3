"""The Triton tensor interface of a specpipe deployment, as data.

The names, data types and dims follow TensorRT-LLM's ``inflight_batcher_llm`` model repository, read
in NVIDIA/TensorRT-LLM at commit 2a9abd9536aa62ad3e4b9314be9286b1b1be523b:

- ``triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt`` (2a9abd95)
- ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` (2a9abd95)
- ``triton_backend/all_models/inflight_batcher_llm/preprocessing/config.pbtxt`` (808059da)
- ``triton_backend/all_models/inflight_batcher_llm/postprocessing/config.pbtxt`` (89fd9b74)

Only the tensors the CPU runtime implements are listed; each keeps the upstream name, data type,
dims, ``optional`` flag and (``tensorrt_llm`` inputs) ``reshape``. A client written for a TensorRT-LLM
ensemble therefore works unchanged against a specpipe CPU deployment, as long as it only uses these.

Dims exclude the batch dimension: every model is written with ``max_batch_size`` =
:data:`MAX_BATCH_SIZE` (> 0), so clients send ``text_input`` as ``[1, 1]``, as with TensorRT-LLM.

Differences from upstream, all of them additions internal to the repository:

- ``tensorrt_llm`` has one extra output, ``prior_output_ids`` (INT32 ``[-1, -1]``), and
  ``postprocessing`` the matching optional input ``PRIOR_TOKENS_BATCH``: the tokens of the same
  request already sent in earlier streamed responses. Postprocessing uses them to turn each streamed
  chunk into exactly the text it adds (see :mod:`specpipe.triton.models.postprocessing`).
- Upstream, ``num_input_tokens`` / ``num_output_tokens`` are returned when the request sets
  ``return_num_input_tokens`` / ``return_num_output_tokens``; specpipe also returns them with
  ``return_perf_metrics``, so that one flag gives every per-request counter.
- The ensemble and ``preprocessing`` have one extra optional input, ``text_segments`` /
  ``QUERY_SEGMENTS`` (STRING ``[-1]``): the prompt split into pieces whose concatenation is
  ``text_input``; pieces at odd positions (user text inside a chat template) are tokenized as plain
  text, so a special-token string typed by a user is not turned into a control token.
- The seed input of ``tensorrt_llm`` is ``seed`` at 2a9abd95; releases before ~0.15 named it
  ``random_seed``.
- CPU runtime only: ``tensorrt_llm`` and the ensemble (:data:`CPU_ENSEMBLE`) have two extra outputs,
  returned with ``return_perf_metrics``: ``draft_length`` (INT32 ``[1]``), the draft length the
  load-adaptive rule chose for the request's latest step (0 = plain decoding; a tree method: the
  tree's depth; TensorRT-LLM drafts a fixed length), and ``target_forwards`` (INT32 ``[1]``), the
  target forward passes of the request so far, the prefill included (with the accepted drafts it gives
  the exact mean accepted length: :class:`specpipe.generation.api.RequestStats`). The engine flow's
  ensemble has neither.
"""

from __future__ import annotations

from specpipe.triton.tensor_spec import SCALAR, EnsembleStep, ModelInterface, TensorSpec, tensor

#: ``max_batch_size`` of every model: one prompt per request, as TensorRT-LLM's ensemble is used (the
#: CPU engine batches requests itself, in flight). Tensors carry a leading batch dimension of 1.
MAX_BATCH_SIZE = 1

# --- ensemble (the client-facing model) -----------------------------------------------------------

ENSEMBLE = ModelInterface(
    name="ensemble",
    inputs=(
        tensor("text_input", "STRING", [1], doc="prompt text, UTF-8; chat template already applied by the client"),
        tensor("max_tokens", "INT32", [1], doc="new tokens to generate at most (>= 1)"),
        tensor("bad_words", "STRING", [-1], True, doc="strings that must not be generated"),
        tensor("stop_words", "STRING", [-1], True, doc="strings that end generation (not returned)"),
        tensor("exclude_input_in_output", "BOOL", [1], True, doc="non-streamed text_output without the prompt"),
        tensor("end_id", "INT32", [1], True, doc="end-of-sequence token id (default: the tokenizer's EOS)"),
        tensor("pad_id", "INT32", [1], True, doc="padding token id (default: the tokenizer's pad, else EOS)"),
        tensor("top_k", "INT32", [1], True, doc="top-k sampling; 1 = greedy, 0 = off"),
        tensor("top_p", "FP32", [1], True, doc="nucleus mass in (0, 1]"),
        tensor("temperature", "FP32", [1], True, doc="> 0; divides the logits when sampling"),
        tensor("seed", "UINT64", [1], True, doc="seed of the request's random generator"),
        tensor(
            "repetition_penalty",
            "FP32",
            [1],
            True,
            doc="> 0, 1 = off: logits of seen tokens divided (positive) or multiplied (negative)",
        ),
        tensor(
            "min_tokens", "INT32", [1], True, doc=">= 0: the end id is masked until this many tokens were generated"
        ),
        tensor("presence_penalty", "FP32", [1], True, doc="subtracted once from the logits of seen tokens; 0 = off"),
        tensor(
            "frequency_penalty",
            "FP32",
            [1],
            True,
            doc="subtracted per occurrence from the logits of seen tokens; 0 = off",
        ),
        tensor("return_perf_metrics", "BOOL", [1], True, doc="return the speculative-decoding counters"),
        tensor("return_num_input_tokens", "BOOL", [1], True, doc="return num_input_tokens"),
        tensor("return_num_output_tokens", "BOOL", [1], True, doc="return num_output_tokens"),
        tensor("stream", "BOOL", [1], True, doc="one response per engine step instead of one at the end"),
        tensor(
            "text_segments",
            "STRING",
            [-1],
            True,
            doc="specpipe: text_input in pieces; odd pieces (user text) are tokenized as plain text, special-token strings included",
        ),
    ),
    outputs=(
        tensor("text_output", "STRING", [-1], doc="generated text (a streamed response: the text it adds)"),
        tensor("acceptance_rate", "FP32", [1], doc="accepted / proposed draft tokens so far, in [0, 1]"),
        tensor("total_accepted_draft_tokens", "INT32", [1], doc="draft tokens accepted so far"),
        tensor("total_draft_tokens", "INT32", [1], doc="draft tokens proposed so far"),
        tensor("num_input_tokens", "INT32", [1], doc="prompt length, tokens"),
        tensor("num_output_tokens", "INT32", [1], doc="tokens generated so far"),
    ),
)

# --- preprocessing: text -> token ids -------------------------------------------------------------

PREPROCESSING = ModelInterface(
    name="preprocessing",
    inputs=(
        tensor("QUERY", "STRING", [1], doc="prompt text"),
        tensor("REQUEST_OUTPUT_LEN", "INT32", [1], doc="max_tokens, passed through"),
        tensor("BAD_WORDS_DICT", "STRING", [-1], True, doc="bad-word strings"),
        tensor("STOP_WORDS_DICT", "STRING", [-1], True, doc="stop-word strings"),
        tensor("END_ID", "INT32", [1], True, doc="end id given by the client"),
        tensor("PAD_ID", "INT32", [1], True, doc="pad id given by the client"),
        tensor(
            "QUERY_SEGMENTS", "STRING", [-1], True, doc="specpipe: QUERY in pieces, odd ones tokenized as plain text"
        ),
    ),
    outputs=(
        tensor("INPUT_ID", "INT32", [-1], doc="prompt token ids"),
        tensor("REQUEST_INPUT_LEN", "INT32", [1], doc="prompt length, tokens"),
        tensor("BAD_WORDS_IDS", "INT32", [2, -1], doc="bad words in the [2, N] ids/offsets layout"),
        tensor("STOP_WORDS_IDS", "INT32", [2, -1], doc="stop words in the [2, N] ids/offsets layout"),
        tensor("REQUEST_OUTPUT_LEN", "INT32", [-1], doc="max_tokens"),
        tensor("OUT_END_ID", "INT32", [1], doc="end id to use"),
        tensor("OUT_PAD_ID", "INT32", [1], doc="pad id to use"),
    ),
)

# --- tensorrt_llm: the engine (decoupled) ----------------------------------------------------------

TENSORRT_LLM = ModelInterface(
    name="tensorrt_llm",
    inputs=(
        tensor("input_ids", "INT32", [-1], True, doc="prompt token ids"),
        tensor("input_lengths", "INT32", [1], reshape=SCALAR, doc="prompt length, tokens"),
        tensor("request_output_len", "INT32", [1], reshape=SCALAR, doc="new tokens at most"),
        tensor("end_id", "INT32", [1], True, SCALAR, doc="end-of-sequence token id"),
        tensor("pad_id", "INT32", [1], True, SCALAR, doc="padding token id"),
        tensor("stop_words_list", "INT32", [2, -1], True, doc="stop words, [2, N] ids/offsets layout"),
        tensor("bad_words_list", "INT32", [2, -1], True, doc="bad words, [2, N] ids/offsets layout"),
        tensor("temperature", "FP32", [1], True, SCALAR),
        tensor("runtime_top_k", "INT32", [1], True, SCALAR),
        tensor("runtime_top_p", "FP32", [1], True, SCALAR),
        tensor("seed", "UINT64", [1], True, SCALAR),
        tensor("repetition_penalty", "FP32", [1], True, SCALAR),
        tensor("min_tokens", "INT32", [1], True, SCALAR),
        tensor("presence_penalty", "FP32", [1], True, SCALAR),
        tensor("frequency_penalty", "FP32", [1], True, SCALAR),
        tensor("return_perf_metrics", "BOOL", [1], True, SCALAR),
        tensor("return_num_input_tokens", "BOOL", [1], True, SCALAR),
        tensor("return_num_output_tokens", "BOOL", [1], True, SCALAR),
        tensor("exclude_input_in_output", "BOOL", [1], True, SCALAR),
        tensor("streaming", "BOOL", [1], True, SCALAR),
        tensor(
            "stop",
            "BOOL",
            [1],
            True,
            SCALAR,
            doc="true: a stop request, cancelling the running request with this request's id",
        ),
        tensor("draft_input_ids", "INT32", [-1], True, doc="draft tokens to verify in one target step (draft-target)"),
    ),
    outputs=(
        tensor(
            "output_ids",
            "INT32",
            [-1, -1],
            doc="[beam=1, T]: streamed: the new tokens; else prompt (unless excluded) + output",
        ),
        tensor("sequence_length", "INT32", [-1], doc="[beam=1]: valid tokens in output_ids"),
        tensor(
            "prior_output_ids", "INT32", [-1, -1], doc="specpipe: [beam=1, P] tokens sent in earlier streamed responses"
        ),
        tensor("acceptance_rate", "FP32", [1]),
        tensor("total_accepted_draft_tokens", "INT32", [1]),
        tensor("total_draft_tokens", "INT32", [1]),
        tensor("num_input_tokens", "INT32", [1]),
        tensor("num_output_tokens", "INT32", [1]),
        tensor(
            "draft_length", "INT32", [1], doc="specpipe: draft length chosen for the latest step (0 = plain decoding)"
        ),
        tensor("target_forwards", "INT32", [1], doc="specpipe: target forward passes so far, the prefill included"),
        tensor(
            "engine_request_id",
            "STRING",
            [1],
            doc="specpipe: the id the engine model knows the request by: the "
            "client's, or one it gave a request sent without (postprocessing stops an abandoned request by it)",
        ),
    ),
)

# --- postprocessing: token ids -> text ------------------------------------------------------------

POSTPROCESSING = ModelInterface(
    name="postprocessing",
    inputs=(
        tensor("TOKENS_BATCH", "INT32", [-1, -1], doc="[beam, T] token ids"),
        tensor("SEQUENCE_LENGTH", "INT32", [-1], doc="[beam] valid tokens per beam"),
        tensor("PRIOR_TOKENS_BATCH", "INT32", [-1, -1], True, doc="specpipe: [beam, P] tokens of earlier chunks"),
        tensor("ENGINE_REQUEST_ID", "STRING", [1], True, doc="specpipe: the engine model's id of the request"),
    ),
    outputs=(tensor("OUTPUT", "STRING", [-1], doc="[beam] text"),),
)

STEP_MODELS: tuple[ModelInterface, ...] = (PREPROCESSING, TENSORRT_LLM, POSTPROCESSING)

# --- the ensemble's wiring (TensorRT-LLM's internal tensor names) ----------------------------------

ENSEMBLE_STEPS: tuple[EnsembleStep, ...] = (
    EnsembleStep(
        "preprocessing",
        input_map=(
            ("QUERY", "text_input"),
            ("REQUEST_OUTPUT_LEN", "max_tokens"),
            ("BAD_WORDS_DICT", "bad_words"),
            ("STOP_WORDS_DICT", "stop_words"),
            ("END_ID", "end_id"),
            ("PAD_ID", "pad_id"),
            ("QUERY_SEGMENTS", "text_segments"),
        ),
        output_map=(
            ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN"),
            ("INPUT_ID", "_INPUT_ID"),
            ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN"),
            ("STOP_WORDS_IDS", "_STOP_WORDS_IDS"),
            ("BAD_WORDS_IDS", "_BAD_WORDS_IDS"),
            ("OUT_END_ID", "_PREPROCESSOR_END_ID"),
            ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID"),
        ),
    ),
    EnsembleStep(
        "tensorrt_llm",
        input_map=(
            ("input_ids", "_INPUT_ID"),
            ("input_lengths", "_REQUEST_INPUT_LEN"),
            ("exclude_input_in_output", "exclude_input_in_output"),
            ("request_output_len", "_REQUEST_OUTPUT_LEN"),
            ("end_id", "_PREPROCESSOR_END_ID"),
            ("pad_id", "_PREPROCESSOR_PAD_ID"),
            ("runtime_top_k", "top_k"),
            ("runtime_top_p", "top_p"),
            ("temperature", "temperature"),
            ("seed", "seed"),
            ("repetition_penalty", "repetition_penalty"),
            ("min_tokens", "min_tokens"),
            ("presence_penalty", "presence_penalty"),
            ("frequency_penalty", "frequency_penalty"),
            ("return_perf_metrics", "return_perf_metrics"),
            ("return_num_input_tokens", "return_num_input_tokens"),
            ("return_num_output_tokens", "return_num_output_tokens"),
            ("streaming", "stream"),
            ("stop_words_list", "_STOP_WORDS_IDS"),
            ("bad_words_list", "_BAD_WORDS_IDS"),
        ),
        output_map=(
            ("output_ids", "_TOKENS_BATCH"),
            ("sequence_length", "_SEQUENCE_LENGTH"),
            ("prior_output_ids", "_PRIOR_TOKENS_BATCH"),
            ("acceptance_rate", "acceptance_rate"),
            ("total_accepted_draft_tokens", "total_accepted_draft_tokens"),
            ("total_draft_tokens", "total_draft_tokens"),
            ("num_input_tokens", "num_input_tokens"),
            ("num_output_tokens", "num_output_tokens"),
            ("draft_length", "draft_length"),
            ("target_forwards", "target_forwards"),
            ("engine_request_id", "_ENGINE_REQUEST_ID"),
        ),
    ),
    EnsembleStep(
        "postprocessing",
        input_map=(
            ("TOKENS_BATCH", "_TOKENS_BATCH"),
            ("SEQUENCE_LENGTH", "_SEQUENCE_LENGTH"),
            ("PRIOR_TOKENS_BATCH", "_PRIOR_TOKENS_BATCH"),
            ("ENGINE_REQUEST_ID", "_ENGINE_REQUEST_ID"),
        ),
        output_map=(("OUTPUT", "text_output"),),
    ),
)

#: The CPU runtime's ensemble: :data:`ENSEMBLE` plus ``draft_length`` and ``target_forwards`` (module doc).
CPU_ENSEMBLE = ModelInterface(
    name=ENSEMBLE.name,
    inputs=ENSEMBLE.inputs,
    outputs=ENSEMBLE.outputs
    + (
        tensor(
            "draft_length",
            "INT32",
            [1],
            doc="specpipe, CPU runtime: draft length the load-adaptive rule chose for the latest step (0 = plain decoding)",
        ),
        tensor(
            "target_forwards",
            "INT32",
            [1],
            doc="specpipe, CPU runtime: target forward passes of the request so far, the prefill included",
        ),
    ),
)

#: Ensemble outputs filled only on request (``return_perf_metrics`` and the ``return_num_*`` flags).
PERF_OUTPUTS = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
    "draft_length",
    "target_forwards",
)

#: Outputs of the CPU runtime's models that TensorRT-LLM's engine flow does not have.
_CPU_ONLY_OUTPUTS = ("prior_output_ids", "draft_length", "target_forwards", "engine_request_id")


# --- the TensorRT-LLM engine flow ----------------------------------------------------------------------
#
# ``tensorrt_llm`` served by the C++ backend (``backend: "tensorrtllm"``): the tensors specpipe's models
# send or read, with names, types, dims, ``optional``, ``reshape`` and ``allow_ragged_batch`` as in
# NVIDIA/TensorRT-LLM ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``
# @ 0c8de69a1ca6213eebb20a51873890ff128666c2. It has no ``prior_output_ids``: the engine-flow ensemble
# decodes each streamed chunk on its own (as upstream's does); ``tensorrt_llm_bls`` streams exact text.

_DRAFT_TARGET_INPUTS = (
    tensor(
        "draft_logits",
        "FP32",
        [-1, -1],
        True,
        doc="draft model logits of the draft tokens (use_draft_logits)",
        ragged=True,
    ),
    tensor("draft_acceptance_threshold", "FP32", [1], True, SCALAR, doc="acceptance threshold with draft logits"),
    tensor(
        "return_generation_logits",
        "BOOL",
        [1],
        True,
        SCALAR,
        doc="return generation_logits (draft model, use_draft_logits)",
    ),
)
_RAGGED = {"input_ids", "draft_input_ids", "stop_words_list", "bad_words_list"}

TENSORRT_LLM_ENGINE = ModelInterface(
    name="tensorrt_llm",
    inputs=tuple(
        TensorSpec(s.name, s.dtype, s.dims, s.optional, s.reshape, s.doc, s.name in _RAGGED)
        for s in TENSORRT_LLM.inputs
    )
    + _DRAFT_TARGET_INPUTS,
    outputs=tuple(s for s in TENSORRT_LLM.outputs if s.name not in _CPU_ONLY_OUTPUTS)
    + (
        tensor(
            "generation_logits", "FP32", [-1, -1, -1], doc="[beam, T, vocab] logits of generated tokens (on request)"
        ),
    ),
)

ENGINE_ENSEMBLE_STEPS: tuple[EnsembleStep, ...] = tuple(
    EnsembleStep(
        step.model_name,
        input_map=tuple(m for m in step.input_map if m[0] not in ("PRIOR_TOKENS_BATCH", "ENGINE_REQUEST_ID")),
        output_map=tuple(m for m in step.output_map if m[0] not in _CPU_ONLY_OUTPUTS),
    )
    for step in ENSEMBLE_STEPS
)

# --- tensorrt_llm_bls: specpipe's Python BLS model (draft-target) --------------------------------------
#
# The ensemble's inputs and outputs plus the two per-request draft-target inputs of TensorRT-LLM's
# ``tensorrt_llm_bls`` (``num_draft_tokens`` INT32 [1], ``use_draft_logits`` BOOL [1]; tensorrtllm_backend
# ``all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt`` @ c2e65b8).

TENSORRT_LLM_BLS = ModelInterface(
    name="tensorrt_llm_bls",
    inputs=ENSEMBLE.inputs
    + (
        tensor("num_draft_tokens", "INT32", [1], True, doc="draft tokens per step (<= the engine's max_draft_len)"),
        tensor(
            "use_draft_logits",
            "BOOL",
            [1],
            True,
            doc="verify with the draft model's logits (draft engine built with gather_generation_logits)",
        ),
    ),
    outputs=ENSEMBLE.outputs,
)
