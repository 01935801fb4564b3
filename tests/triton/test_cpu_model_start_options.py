"""``specpipe package``'s start options of a CPU model (``--dense-rows``, ``--draft-lengths``, ``--warm-up``):
written as the ``tensorrt_llm`` model's parameters, checked where given, refused for other runtimes, and
honoured by the model's ``initialize``: ``max`` measures no forward cost and drafts ``max_draft_len`` every
step, ``--no-warm-up`` serves no warm-up request; the defaults do both."""

import json
import sys
import types

import pytest
from click.testing import CliRunner
from tiny_engine import make_tiny_engine
from triton_fakes import FAKE_PB

from specpipe.cli import main
from specpipe.errors import SpecpipeError
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.triton import repository
from specpipe.triton.config import read_config
from specpipe.triton.models import tensorrt_llm_cpu
from specpipe.triton.models.common import parse_draft_lengths
from specpipe.triton.repository import package_engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return make_tiny_engine(tmp_path_factory.mktemp("engines"), method="ngram", max_draft_len=3)


def parameters(repo) -> dict[str, str]:
    config = read_config(repo / "tensorrt_llm" / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def test_the_options_are_written_as_the_models_parameters_with_the_defaults_unchanged(engine, tmp_path):
    runner, args = CliRunner(), ["package", engine.name, "--engines-dir", str(engine.parent)]
    done = runner.invoke(main, [*args, "--repo-dir", str(tmp_path / "a")])
    assert done.exit_code == 0, done.output
    assert {k: parameters(tmp_path / "a" / engine.name)[k] for k in ("dense_rows", "draft_lengths", "warm_up")} == {
        "dense_rows": "auto",
        "draft_lengths": "adaptive",
        "warm_up": "true",
    }
    quick = ["--dense-rows", "0", "--draft-lengths", "max", "--no-warm-up", "--repo-dir", str(tmp_path / "b")]
    done = runner.invoke(main, [*args, *quick])
    assert done.exit_code == 0, done.output
    written = parameters(tmp_path / "b" / engine.name)
    assert (written["dense_rows"], written["draft_lengths"], written["warm_up"]) == ("0", "max", "false")
    refused = runner.invoke(main, [*args, "--draft-lengths", "longest", "--repo-dir", str(tmp_path / "c")])
    assert refused.exit_code == 2 and "'longest' is not one of 'adaptive', 'max'" in refused.output
    with pytest.raises(SpecpipeError, match="draft_lengths: expected adaptive or max, got 'fixed'"):
        package_engine(engine, tmp_path / "d", draft_lengths="fixed")
    assert parse_draft_lengths(" MAX ") == "max" and parse_draft_lengths("") == "adaptive"


def test_other_runtimes_refuse_the_cpu_start_options(engine, tmp_path, monkeypatch):
    manifest = json.loads((engine / "manifest.json").read_text())
    monkeypatch.setattr(repository, "read_manifest", lambda path: types.SimpleNamespace(runtime=_trtllm(manifest)))
    with pytest.raises(SpecpipeError, match=r"--draft-lengths, --no-warm-up: settings of the CPU runtime.*leave them"):
        package_engine(engine, tmp_path / "r", draft_lengths="max", warm_up=False)
    with pytest.raises(SpecpipeError, match=r"--dense-rows: settings of the CPU runtime.*leave it out"):
        package_engine(engine, tmp_path / "r", dense_rows="0")


def _trtllm(manifest):
    from specpipe.speculative import Runtime

    assert manifest["runtime"] == "cpu"
    return Runtime.TRTLLM


class Calls:
    def __init__(self):
        self.warm_ups, self.measures = 0, 0


@pytest.fixture
def loaded(engine, tmp_path, monkeypatch, single_thread):
    """``initialize`` of the CPU model on a repository packaged with the given options: (model, calls)."""
    calls = Calls()
    measure = ForwardCostModel.measure.__func__

    def counted_measure(cls, lm, *args, **kwargs):
        calls.measures += 1
        return measure(cls, lm, *args, **kwargs)

    def counted_warm_up(deployment, log=None, **kwargs):
        calls.warm_ups += 1
        return 0.0

    logged = types.SimpleNamespace(log_info=lambda m: None, log_error=lambda m: None, log_warn=lambda m: None)
    monkeypatch.setitem(
        sys.modules, "triton_python_backend_utils", types.SimpleNamespace(**vars(FAKE_PB), Logger=logged)
    )
    monkeypatch.setattr(ForwardCostModel, "measure", classmethod(counted_measure))
    monkeypatch.setattr(tensorrt_llm_cpu, "warm_up_deployment", counted_warm_up)
    models = []

    def load(**options):
        repo = package_engine(engine, tmp_path / f"r{len(models)}", **options)
        config = {"parameters": {k: {"string_value": v} for k, v in parameters(repo).items()}}
        model = tensorrt_llm_cpu.TritonPythonModel()
        model.initialize({"model_config": json.dumps(config)})
        models.append(model)
        return model, calls

    yield load
    for model in models:
        model.finalize()


def test_max_draft_lengths_and_no_warm_up_measure_and_warm_nothing(loaded):
    model, calls = loaded(dense_rows="0", draft_lengths="max", warm_up=False)
    scheduler = model.worker.engine
    assert (calls.measures, calls.warm_ups) == (0, 0)
    assert scheduler.policy.adaptive is False and scheduler.policy.cost_model.tokens == (1, 64)


def test_the_defaults_measure_the_forward_cost_and_warm_up(loaded):
    model, calls = loaded()
    assert (calls.measures, calls.warm_ups) == (1, 1)
    assert model.worker.engine.policy.adaptive is True and len(model.worker.engine.policy.cost_model.tokens) > 2
