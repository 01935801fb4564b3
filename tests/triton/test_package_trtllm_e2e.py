"""A draft-target engine-flow repository in the real local Triton server, with the CPU engine standing
in for both TensorRT-LLM engines: the Python models (preprocessing, postprocessing, tensorrt_llm_bls)
load as written and answer through the ensemble and through the BLS, streamed and not."""

from __future__ import annotations

import dataclasses
import json
import queue

import numpy as np
import pytest
from loopback import free_port
from tiny_engine import make_tiny_engine
from trtllm_deployments import ENGINE_MODES, engine_dir

from specpipe.serve.local import LocalTritonServer
from specpipe.triton.config import python_model_config, read_config, write_config
from specpipe.triton.interface import TENSORRT_LLM
from specpipe.triton.repository import package_engine
from specpipe.triton.writer import model_py

pytestmark = pytest.mark.e2e


def stand_in(repo, cpu_engine):
    """Replace the tensorrtllm-backend models by the CPU runtime's model on ``cpu_engine`` and point the
    tokenizers at its tokenizer; every other file stays as packaged."""
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        config = python_model_config(
            dataclasses.replace(TENSORRT_LLM, name=name),
            {"gpt_model_path": str(cpu_engine), "exclude_input_in_output": "false"},
            decoupled=True,
        )
        write_config(config, repo / name)
        (repo / name / "1").mkdir(exist_ok=True)
        (repo / name / "1" / "model.py").write_text(model_py("specpipe.triton.models.tensorrt_llm_cpu"))
    for name in ("preprocessing", "postprocessing"):
        config = read_config(repo / name / "config.pbtxt")
        config.parameters["tokenizer_dir"].string_value = str(cpu_engine / "target")
        write_config(config, repo / name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trtllm-e2e")
    repo = package_engine(engine_dir(tmp, **ENGINE_MODES["draft-model"]), tmp / "triton_repo" / "dt")
    assert json.loads((repo / "specpipe.json").read_text())["runtime"] == "trtllm"
    stand_in(repo, make_tiny_engine(tmp / "cpu", "tiny", method="none"))
    with LocalTritonServer(
        repo, free_port(), free_port(), free_port(), log_path=tmp / "triton.log", ready_timeout_s=240
    ) as running:
        yield running


def _input(name, array, dtype):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def generate(url, model, prompt, max_tokens, stream, **extra):
    """(text chunks, last perf outputs, error) of one request over the gRPC stream."""
    import tritonclient.grpc as grpcclient

    inputs = [
        _input("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        _input("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        _input("stream", np.array([[stream]]), "BOOL"),
        _input("exclude_input_in_output", np.array([[True]]), "BOOL"),
        _input("return_perf_metrics", np.array([[True]]), "BOOL"),
    ]
    for name, (value, dtype) in extra.items():
        inputs.append(_input(name, np.array([[value]], dtype={"INT32": np.int32, "BOOL": bool}[dtype]), dtype))
    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        chunks, perf = [], {}
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return chunks, perf, str(error)
            text = result.as_numpy("text_output")
            if text is not None:
                chunks.append(text.reshape(-1)[0].decode())
            for name in ("acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens"):
                value = result.as_numpy(name)
                if value is not None:
                    perf[name] = value.reshape(-1)[0].item()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return chunks, perf, None
    finally:
        client.stop_stream()
        client.close()


def test_ensemble_and_bls_answer_with_the_same_greedy_text(server):
    prompt = "Café 日本 🙂 Paris"
    ensemble, _, error = generate(server.grpc_url, "ensemble", prompt, 20, stream=False)
    assert error is None and len(ensemble) == 1 and ensemble[0]
    bls, perf, error = generate(server.grpc_url, "tensorrt_llm_bls", prompt, 20, stream=False)
    assert error is None and bls == ensemble
    # The draft is the target itself here: every draft token is accepted.
    assert perf["acceptance_rate"] == 1.0 and perf["total_draft_tokens"] == perf["total_accepted_draft_tokens"] > 0
    streamed, _, error = generate(
        server.grpc_url, "tensorrt_llm_bls", prompt, 20, stream=True, num_draft_tokens=(3, "INT32")
    )
    assert error is None and "".join(streamed) == ensemble[0] and 1 < len(streamed) < 20


def test_bls_rejects_bad_requests_and_keeps_serving(server):
    _, _, error = generate(server.grpc_url, "tensorrt_llm_bls", "hello", 4, stream=False, num_draft_tokens=(9, "INT32"))
    assert "num_draft_tokens must be in 0..4" in error
    _, _, error = generate(
        server.grpc_url, "tensorrt_llm_bls", "hello", 4, stream=False, use_draft_logits=(True, "BOOL")
    )
    assert "built without --gather_generation_logits" in error
    chunks, _, error = generate(server.grpc_url, "tensorrt_llm_bls", "hello", 4, stream=True)
    assert error is None and chunks
