"""Triton configs from the interface data: strict parsing, ensemble wiring, no placeholders."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from specpipe.errors import SpecpipeError
from specpipe.triton import interface as itf
from specpipe.triton.config import (
    check_ensemble,
    check_no_placeholders,
    config_text,
    ensemble_model_config,
    ensemble_problems,
    find_placeholders,
    parse_config,
    python_model_config,
    read_config,
    write_config,
)
from specpipe.triton.models.words import from_words_layout, to_words_layout

# TensorRT-LLM inflight_batcher_llm/ensemble/config.pbtxt @ 2a9abd95: (dtype, dims, optional).
UPSTREAM_ENSEMBLE_INPUTS = {
    "text_input": ("STRING", (1,), False),
    "max_tokens": ("INT32", (1,), False),
    "stream": ("BOOL", (1,), True),
    "temperature": ("FP32", (1,), True),
    "top_k": ("INT32", (1,), True),
    "top_p": ("FP32", (1,), True),
    "seed": ("UINT64", (1,), True),
    "end_id": ("INT32", (1,), True),
    "pad_id": ("INT32", (1,), True),
    "stop_words": ("STRING", (-1,), True),
    "bad_words": ("STRING", (-1,), True),
    "exclude_input_in_output": ("BOOL", (1,), True),
    "return_perf_metrics": ("BOOL", (1,), True),
    "return_num_input_tokens": ("BOOL", (1,), True),
    "return_num_output_tokens": ("BOOL", (1,), True),
    "repetition_penalty": ("FP32", (1,), True),
    "min_tokens": ("INT32", (1,), True),
    "presence_penalty": ("FP32", (1,), True),
    "frequency_penalty": ("FP32", (1,), True),
}
#: specpipe's documented additions to the ensemble's inputs (see specpipe.triton.interface).
SPECPIPE_ENSEMBLE_INPUTS = {"text_segments": ("STRING", (-1,), True)}
UPSTREAM_ENSEMBLE_OUTPUTS = {
    "text_output": ("STRING", (-1,)),
    "acceptance_rate": ("FP32", (1,)),
    "total_accepted_draft_tokens": ("INT32", (1,)),
    "total_draft_tokens": ("INT32", (1,)),
    "num_input_tokens": ("INT32", (1,)),
    "num_output_tokens": ("INT32", (1,)),
}


#: specpipe's documented addition to the CPU runtime's ensemble outputs (see specpipe.triton.interface).
SPECPIPE_CPU_ENSEMBLE_OUTPUTS = {"draft_length": ("INT32", (1,)), "target_forwards": ("INT32", (1,))}


def step_configs() -> dict[str, mc.ModelConfig]:
    return {
        m.name: python_model_config(m, {"tokenizer_dir": "/abs/tok"}, decoupled=m.name == "tensorrt_llm")
        for m in itf.STEP_MODELS
    }


def test_ensemble_interface_matches_tensorrt_llm():
    assert {s.name: (s.dtype, s.dims, s.optional) for s in itf.ENSEMBLE.inputs} == {
        **UPSTREAM_ENSEMBLE_INPUTS,
        **SPECPIPE_ENSEMBLE_INPUTS,
    }
    assert {s.name: (s.dtype, s.dims) for s in itf.ENSEMBLE.outputs} == UPSTREAM_ENSEMBLE_OUTPUTS
    required = [s.name for s in itf.ENSEMBLE.inputs if not s.optional]
    assert required == ["text_input", "max_tokens"]
    assert itf.CPU_ENSEMBLE.inputs == itf.ENSEMBLE.inputs
    assert {s.name: (s.dtype, s.dims) for s in itf.CPU_ENSEMBLE.outputs} == {
        **UPSTREAM_ENSEMBLE_OUTPUTS,
        **SPECPIPE_CPU_ENSEMBLE_OUTPUTS,
    }


def test_engine_flow_has_none_of_the_cpu_only_outputs():
    cpu_only = {"prior_output_ids", "draft_length", "target_forwards", "engine_request_id"}
    assert {s.name for s in itf.TENSORRT_LLM.outputs} >= cpu_only
    assert not {s.name for s in itf.TENSORRT_LLM_ENGINE.outputs} & cpu_only
    for step in itf.ENGINE_ENSEMBLE_STEPS:
        assert not {name for name, _ in step.output_map} & cpu_only
        assert not {name for name, _ in step.input_map} & {"PRIOR_TOKENS_BATCH", "ENGINE_REQUEST_ID"}
    cpu_engine_outputs = dict(next(s for s in itf.ENSEMBLE_STEPS if s.model_name == "tensorrt_llm").output_map)
    assert {"draft_length", "target_forwards"} <= cpu_engine_outputs.keys()


def test_step_interfaces_keep_tensorrt_llm_names_and_types():
    trt = itf.TENSORRT_LLM
    assert (trt.input("input_ids").dtype, trt.input("input_ids").dims) == ("INT32", (-1,))
    assert trt.input("stop_words_list").dims == (2, -1) and trt.input("bad_words_list").dims == (2, -1)
    assert trt.input("runtime_top_k").dtype == "INT32" and trt.input("runtime_top_p").dtype == "FP32"
    assert trt.input("seed").dtype == "UINT64" and trt.input("streaming").dtype == "BOOL"
    assert trt.input("request_output_len").reshape == () and not trt.input("request_output_len").optional
    assert (trt.output("output_ids").dtype, trt.output("output_ids").dims) == ("INT32", (-1, -1))
    assert trt.output("sequence_length").dims == (-1,)
    pre = itf.PREPROCESSING
    assert [s.name for s in pre.inputs if not s.optional] == ["QUERY", "REQUEST_OUTPUT_LEN"]
    assert pre.output("STOP_WORDS_IDS").dims == (2, -1) and pre.output("REQUEST_OUTPUT_LEN").dims == (-1,)
    post = itf.POSTPROCESSING
    assert post.input("TOKENS_BATCH").dims == (-1, -1) and post.output("OUTPUT").dtype == "STRING"
    with pytest.raises(KeyError):
        trt.input("random_seed")


@pytest.mark.parametrize("interface", [itf.PREPROCESSING, itf.TENSORRT_LLM, itf.POSTPROCESSING])
def test_python_config_carries_the_interface(interface):
    config = python_model_config(interface, {"tokenizer_dir": "/t"}, decoupled=True)
    assert config.backend == "python" and config.max_batch_size == itf.MAX_BATCH_SIZE
    assert config.model_transaction_policy.decoupled is True
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 1)]
    got = [(i.name, mc.DataType.Name(i.data_type), tuple(i.dims), i.optional) for i in config.input]
    assert got == [(s.name, f"TYPE_{s.dtype}", s.dims, s.optional) for s in interface.inputs]
    got = [(o.name, mc.DataType.Name(o.data_type), tuple(o.dims)) for o in config.output]
    assert got == [(s.name, f"TYPE_{s.dtype}", s.dims) for s in interface.outputs]
    assert config.parameters["tokenizer_dir"].string_value == "/t"


def test_scalar_reshape_survives_the_text_format():
    config = python_model_config(itf.TENSORRT_LLM, {})
    text = config_text(config)
    parsed = parse_config(text)
    lengths = next(i for i in parsed.input if i.name == "input_lengths")
    assert lengths.HasField("reshape") and list(lengths.reshape.shape) == []
    ids = next(i for i in parsed.input if i.name == "input_ids")
    assert not ids.HasField("reshape")


def test_write_config_round_trips(tmp_path):
    for config in [*step_configs().values(), ensemble_model_config()]:
        model_dir = tmp_path / config.name
        model_dir.mkdir()
        path = write_config(config, model_dir)
        assert path.name == "config.pbtxt"
        assert read_config(path) == config
        assert "${" not in path.read_text()


def test_strict_parse_rejects_unknown_fields_and_values():
    with pytest.raises(SpecpipeError, match="not a valid Triton model config"):
        parse_config('name: "x"\nbackend: "python"\nmax_batch_sise: 1\n', "bad.pbtxt")
    with pytest.raises(SpecpipeError, match="bad.pbtxt"):
        parse_config('name: "x"\ninput { name: "a" data_type: TYPE_INT33 dims: 1 }\n', "bad.pbtxt")


def test_write_config_refuses_placeholders(tmp_path):
    config = python_model_config(itf.PREPROCESSING, {"tokenizer_dir": "${tokenizer_dir}"})
    with pytest.raises(SpecpipeError, match="unreplaced"):
        write_config(config, tmp_path)
    assert not (tmp_path / "config.pbtxt").exists()


def test_placeholder_scan_names_every_offending_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text('name: "a"\n')
    (tmp_path / "b.pbtxt").write_text('backend: "${triton_backend}"\n')
    (tmp_path / "a" / "model.py").write_text("x = '${engine_dir}'\n")
    assert find_placeholders(tmp_path) == [tmp_path / "a" / "model.py", tmp_path / "b.pbtxt"]
    with pytest.raises(SpecpipeError, match="b.pbtxt"):
        check_no_placeholders(tmp_path)


def test_generated_ensemble_is_wired_correctly():
    ensemble = ensemble_model_config()
    assert ensemble.platform == "ensemble"
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
    ]
    trt_step = ensemble.ensemble_scheduling.step[1]
    assert trt_step.input_map["streaming"] == "stream" and trt_step.input_map["runtime_top_k"] == "top_k"
    assert trt_step.output_map["output_ids"] == "_TOKENS_BATCH"
    assert ensemble.ensemble_scheduling.step[2].output_map["OUTPUT"] == "text_output"
    assert ensemble_problems(ensemble, step_configs()) == []
    check_ensemble(ensemble, step_configs())


def _broken(edit):
    ensemble = ensemble_model_config()
    edit(ensemble.ensemble_scheduling.step)
    return ensemble_problems(ensemble, step_configs())


def test_broken_maps_are_caught():
    def rename_key(steps):
        del steps[1].input_map["streaming"]
        steps[1].input_map["stream"] = "stream"

    assert _broken(rename_key) == ["input_map key 'stream' is not an input of 'tensorrt_llm'"]

    def dangling_value(steps):
        steps[2].input_map["TOKENS_BATCH"] = "_TOKENS"

    assert _broken(dangling_value) == [
        "input_map value '_TOKENS' of 'postprocessing' is neither an ensemble input nor produced by a step"
    ]

    def wrong_output_key(steps):
        del steps[2].output_map["OUTPUT"]
        steps[2].output_map["TEXT"] = "text_output"

    assert _broken(wrong_output_key) == [
        "output_map key 'TEXT' is not an output of 'postprocessing'",
        "ensemble output 'text_output' is produced by no step",
    ]

    def unmapped_required(steps):
        del steps[1].input_map["request_output_len"]

    assert _broken(unmapped_required) == ["required input 'request_output_len' of 'tensorrt_llm' is not mapped"]

    def type_mismatch(steps):
        steps[1].input_map["runtime_top_k"] = "top_p"

    assert _broken(type_mismatch) == ["'top_p' feeds 'tensorrt_llm.runtime_top_k' with another data type"]

    def unknown_model(steps):
        steps[0].model_name = "preprocess"

    problems = _broken(unknown_model)
    assert problems[0] == "step model 'preprocess' has no config" and len(problems) > 1

    ensemble = ensemble_model_config()
    ensemble.ensemble_scheduling.step[2].input_map["TOKENS_BATCH"] = "_nothing"
    with pytest.raises(SpecpipeError, match="miswired: input_map value '_nothing'"):
        check_ensemble(ensemble, step_configs())


def test_words_layout_matches_tensorrt_llm():
    layout = to_words_layout([[5, 6], [7]])
    assert layout.dtype == np.int32
    assert layout.tolist() == [[5, 6, 7], [2, 3, -1]]
    assert to_words_layout([]).tolist() == [[0], [-1]]
    assert to_words_layout([[9], [], [4]]).tolist() == [[9, 4], [1, 2]]
    assert from_words_layout(layout[np.newaxis]) == ((5, 6), (7,))
    assert from_words_layout(to_words_layout([])) == ()
    assert from_words_layout(None) == ()
    with pytest.raises(ValueError, match=r"shape \[2, N\]"):
        from_words_layout(np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match="offsets must increase"):
        from_words_layout(np.array([[1, 2], [2, 1]], np.int32))
