"""``package_engine``: the repository layout, its configs, atomic writes and error cases."""

from __future__ import annotations

import json

import pytest
from tiny_engine import make_tiny_engine
from tritonclient.grpc import model_config_pb2 as mc

from specpipe.errors import SpecpipeError
from specpipe.triton import writer as repo_mod
from specpipe.triton.config import check_ensemble, find_placeholders, read_config
from specpipe.triton.repository import package_engine, package_plan, repository_runtime

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return make_tiny_engine(tmp_path_factory.mktemp("engines"), "tiny", method="ngram")


def test_repository_layout_and_configs(engine, tmp_path):
    out = package_engine(engine, tmp_path / "triton_repo" / "tiny")
    assert out == (tmp_path / "triton_repo" / "tiny").absolute()
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [
        "ensemble/config.pbtxt",
        "postprocessing/1/model.py",
        "postprocessing/config.pbtxt",
        "preprocessing/1/model.py",
        "preprocessing/config.pbtxt",
        "tensorrt_llm/1/model.py",
        "tensorrt_llm/config.pbtxt",
    ]
    assert (out / "ensemble" / "1").is_dir()
    configs = {name: read_config(out / name / "config.pbtxt") for name in MODELS}
    assert {name: c.name for name, c in configs.items()} == {name: name for name in MODELS}
    check_ensemble(configs["ensemble"], {n: c for n, c in configs.items() if n != "ensemble"})
    assert find_placeholders(out) == []

    trt = configs["tensorrt_llm"]
    assert trt.backend == "python" and trt.model_transaction_policy.decoupled
    assert [(g.kind, g.count) for g in trt.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 1)]
    params = {k: v.string_value for k, v in trt.parameters.items()}
    assert params["gpt_model_path"] == str(engine.resolve())
    assert params["tokenizer_dir"] == str((engine / "target").resolve())
    assert params["specpipe_runtime"] == "cpu" and params["engine_name"] == "tiny"
    assert params["dense_rows"] == "auto"
    for name in ("preprocessing", "postprocessing"):
        assert configs[name].parameters["tokenizer_dir"].string_value == str((engine / "target").resolve())
        assert not configs[name].model_transaction_policy.decoupled
    assert (
        "from specpipe.triton.models.tensorrt_llm_cpu import TritonPythonModel"
        in (out / "tensorrt_llm/1/model.py").read_text()
    )
    assert (
        "from specpipe.triton.models.preprocessing import TritonPythonModel"
        in (out / "preprocessing/1/model.py").read_text()
    )
    assert repository_runtime(out) == "cpu"


def test_model_py_files_import_the_model_classes(engine, tmp_path):
    out = package_engine(engine, tmp_path / "tiny")
    for name in ("preprocessing", "tensorrt_llm", "postprocessing"):
        namespace: dict = {}
        exec(compile((out / name / "1" / "model.py").read_text(), "model.py", "exec"), namespace)
        assert callable(namespace["TritonPythonModel"])


def test_existing_repository_is_replaced(engine, tmp_path):
    out = tmp_path / "tiny"
    package_engine(engine, out)
    (out / "stale.txt").write_text("old")
    package_engine(engine, out)
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no temporary or old copies


def test_failure_mid_write_leaves_nothing(engine, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = repo_mod.write_config

    def failing(config, model_dir):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(config, model_dir)

    monkeypatch.setattr(repo_mod, "write_config", failing)
    with pytest.raises(OSError, match="disk full"):
        package_engine(engine, tmp_path / "tiny")
    assert calls["n"] == 3
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_the_previous_repository(engine, tmp_path, monkeypatch):
    out = package_engine(engine, tmp_path / "tiny")
    before = (out / "tensorrt_llm" / "config.pbtxt").read_text()
    monkeypatch.setattr(repo_mod, "check_no_placeholders", lambda root: (_ for _ in ()).throw(SpecpipeError("boom")))
    with pytest.raises(SpecpipeError, match="boom"):
        package_engine(engine, out)
    assert (out / "tensorrt_llm" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_missing_engine_dir(tmp_path):
    with pytest.raises(SpecpipeError, match="does not exist: run 'specpipe build' first"):
        package_engine(tmp_path / "nope", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_dir_without_manifest(tmp_path):
    (tmp_path / "eng").mkdir()
    with pytest.raises(SpecpipeError, match="has no manifest.json"):
        package_engine(tmp_path / "eng", tmp_path / "repo")


def _copy_with_manifest(engine, tmp_path, **changes):
    import shutil

    copy = tmp_path / "eng"
    shutil.copytree(engine, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.update(changes)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_engine_from_another_specpipe_version(engine, tmp_path):
    copy = _copy_with_manifest(engine, tmp_path, specpipe_version="0.0.1")
    with pytest.raises(SpecpipeError, match="built by specpipe 0.0.1"):
        package_engine(copy, tmp_path / "repo")


def test_cpu_engine_relabelled_trtllm_is_refused(engine, tmp_path):
    copy = _copy_with_manifest(engine, tmp_path, runtime="trtllm")
    with pytest.raises(SpecpipeError, match="manifest.json lacks 'trtllm': rebuild the engine"):
        package_engine(copy, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_engine_without_target_dir(engine, tmp_path):
    target = json.loads((engine / "manifest.json").read_text())["target"]
    copy = _copy_with_manifest(engine, tmp_path, target={**target, "path": "missing"})
    with pytest.raises(SpecpipeError, match="no target checkpoint directory"):
        package_engine(copy, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_package_plan_needs_a_readable_plan(tmp_path):
    with pytest.raises(SpecpipeError, match="cannot read plan .*plan.json.*--dry-run --json"):
        package_plan(tmp_path / "plan.json", "x", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_dense_rows_is_written_and_checked_on_the_command_line(engine, tmp_path):
    from click.testing import CliRunner

    from specpipe.cli import main

    repo_dir = tmp_path / "repos"
    args = ["package", engine.name, "--engines-dir", str(engine.parent), "--repo-dir", str(repo_dir)]
    done = CliRunner().invoke(main, [*args, "--dense-rows", "0"])
    assert done.exit_code == 0, done.output
    config = read_config(repo_dir / engine.name / "tensorrt_llm" / "config.pbtxt")
    assert config.parameters["dense_rows"].string_value == "0"
    done = CliRunner().invoke(main, [*args, "--dense-rows", " ALL "])
    assert done.exit_code == 0, done.output
    config = read_config(repo_dir / engine.name / "tensorrt_llm" / "config.pbtxt")
    assert config.parameters["dense_rows"].string_value == "all"
    for bad in ("many", "", " ", "99999999999999999999"):
        refused = CliRunner().invoke(main, [*args, "--dense-rows", bad])
        assert refused.exit_code == 2 and "expected 'auto', 'all' (dense weights only) or a row count" in refused.output


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_engine_whose_files_changed_since_the_build_is_refused(engine, tmp_path, damage):
    """The manifest holds each file's sha256: a copy cut short or a deleted file is named at package
    time, not found by the server after it starts loading."""
    import shutil

    copy = tmp_path / "eng"
    shutil.copytree(engine, copy)
    target = copy / json.loads((copy / "manifest.json").read_text())["target"]["path"]
    victim = max((p for p in target.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        victim.unlink()
    with pytest.raises(SpecpipeError, match=f"is damaged: {victim} is missing or changed since the build; rebuild"):
        package_engine(copy, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
