"""The method registry against TensorRT-LLM's own definitions: every method that claims a TensorRT-LLM
runtime has the spellings that runtime accepts (vendored flag definitions, the backend's parameter
table, the LLM API's config classes), and every quantization it allows is a scheme specpipe can build."""

import pytest

from specpipe.speculative import ALL_QUANTIZATIONS, METHODS, Method, Runtime
from specpipe.triton.backend_parameters import DECODING_MODES, PARAMETERS
from specpipe.trtllm.flagcheck import load_tool
from specpipe.trtllm.llmapi_schema import ACCEPTED_KEYS, NEEDS_MODEL
from specpipe.trtllm.quant import QUANTIZATIONS, SCHEMES

BUILD_MODES = set(load_tool("trtllm-build").flags["--speculative_decoding_mode"]["choices"]) - {"none"}
ENGINE = [m for m, s in METHODS.items() if s.runs_on(Runtime.TRTLLM)]
LLMAPI = [m for m, s in METHODS.items() if s.runs_on(Runtime.TRTLLM_LLMAPI) and m is not Method.NONE]


def test_the_registry_claims_both_flows():
    assert ENGINE and LLMAPI


@pytest.mark.parametrize("method", ENGINE, ids=lambda m: m.value)
def test_engine_flow_methods_have_a_build_mode_and_a_backend_decoding_mode(method):
    spec = METHODS[method]
    if method is Method.NONE:
        assert spec.build_mode is None
    else:
        assert spec.build_mode in BUILD_MODES, f"{method.value}: --speculative_decoding_mode {spec.build_mode!r}"
    assert spec.decoding_mode in DECODING_MODES, f"{method.value}: decoding_mode {spec.decoding_mode!r}"
    assert set(spec.quantizations) <= set(SCHEMES), f"{method.value}: {spec.quantizations}"
    if method is not Method.NONE:
        assert spec.quantization_source, f"{method.value}: where its support matrix comes from"
    if spec.has_tree:
        assert spec.choices_key in PARAMETERS, f"{method.value}: the backend reads no {spec.choices_key!r}"


@pytest.mark.parametrize("method", LLMAPI, ids=lambda m: m.value)
def test_llmapi_methods_have_a_decoding_type_of_the_release(method):
    spec = METHODS[method]
    assert spec.decoding_type in ACCEPTED_KEYS, f"{method.value}: decoding_type {spec.decoding_type!r}"
    assert (spec.decoding_type in NEEDS_MODEL) == (spec.weights is not None), method.value


def test_one_list_of_quantizations():
    assert tuple(SCHEMES) == ALL_QUANTIZATIONS
    assert QUANTIZATIONS == ("auto", *ALL_QUANTIZATIONS)
