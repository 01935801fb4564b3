"""The method registry against vLLM's own definitions: every method that claims ``Runtime.VLLM`` has a
``speculative_config.method`` of the pinned release (``flags.json``, read from its wheel), every flavour
spelling is one too, and a method without a vLLM spelling does not claim the runtime."""

import pytest

from specpipe.speculative import METHODS, VLLM_FLAVOUR_METHODS, Method, Runtime
from specpipe.vllm.flagcheck import load_table
from specpipe.vllm.settings import nearest_method, vllm_method

VLLM_METHODS = set(load_table()["speculative_methods"])
CLAIMING = [m for m, s in METHODS.items() if s.runs_on(Runtime.VLLM)]
NOT_CLAIMING = [m for m, s in METHODS.items() if not s.runs_on(Runtime.VLLM)]


def test_vllm_runs_speculation_and_the_table_is_the_release_s():
    assert set(CLAIMING) - {Method.NONE}
    assert {"ngram", "draft_model", "eagle", "eagle3", "mtp"} <= VLLM_METHODS
    assert "medusa" not in VLLM_METHODS  # gone from vLLM 0.34.0: the registry must not claim it


@pytest.mark.parametrize("method", CLAIMING, ids=lambda m: m.value)
def test_methods_on_vllm_have_a_method_spelling_of_the_release(method):
    spec = METHODS[method]
    if method is Method.NONE:
        assert spec.vllm_method is None
        return
    assert spec.vllm_method in VLLM_METHODS, f"{method.value}: speculative_config.method {spec.vllm_method!r}"
    for flavour in spec.flavours:
        assert vllm_method(method, flavour) in VLLM_METHODS, f"{method.value} flavour {flavour}"


@pytest.mark.parametrize("method", NOT_CLAIMING, ids=lambda m: m.value)
def test_methods_vllm_lacks_have_no_spelling_and_a_nearest_method_that_it_runs(method):
    assert METHODS[method].vllm_method is None
    near = nearest_method(method)
    assert near is not None and METHODS[near].runs_on(Runtime.VLLM) and near is not Method.NONE
    assert METHODS[near].weights == METHODS[method].weights


def test_flavour_spellings_belong_to_a_method_that_has_the_flavour():
    for flavour, spelling in VLLM_FLAVOUR_METHODS.items():
        assert spelling in VLLM_METHODS
        assert any(flavour in s.flavours and s.runs_on(Runtime.VLLM) for s in METHODS.values())
    assert vllm_method(Method.EAGLE, "eagle3") == "eagle3"
    assert vllm_method(Method.EAGLE, "eagle1") == "eagle"
