"""``deploy k8s`` outputs that must hold wherever they are used: the generated scripts run from any
folder (absolute host paths) and check their inputs before touching the cluster; ``--storage-size``
is a Kubernetes quantity that fits the data; rollouts never need spare GPUs; a local serving tag is
warned about. The scripts run for real with fake ``kubectl`` and ``docker`` on ``PATH``."""

import os
import shutil
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from trtllm_deployments import plan_json

from specpipe.cli import main
from specpipe.deploy.k8s import write_k8s
from specpipe.errors import SpecpipeError
from specpipe.triton.repository import package_plan

ENGINE = "llama3-8b-none"
GiB = 2**30


@pytest.fixture()
def built(tmp_path, monkeypatch):
    """A TP 1 repository in tmp/repos/small with its engine on disk (2 GiB sparse); cwd is tmp."""
    repo = package_plan(plan_json(tmp_path, target="llama3-8b", draft="none"), "small", tmp_path / "repos")
    engine = tmp_path / "engines" / ENGINE
    (engine / "target").mkdir(parents=True)
    (engine / "tokenizer").mkdir()
    with open(engine / "target" / "rank0.engine", "wb") as f:
        f.truncate(2 * GiB)
    (engine / "tokenizer" / "tokenizer.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    return tmp_path, repo


def fake_tools(tmp_path):
    """A folder with ``kubectl`` and ``docker`` that log their arguments to tmp/calls.log."""
    bins = tmp_path / "bins"
    bins.mkdir()
    for tool in ("kubectl", "docker"):
        (bins / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls.log\n')
        (bins / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bins}:{os.environ['PATH']}"}


def deploy(*args):
    return CliRunner().invoke(
        main, ["deploy", "k8s", "small", "--repo-dir", "repos", *args]
    )  # relative, as users type it


@pytest.mark.parametrize("script, extra", [("load-data.sh", []), ("build-image.sh", ["--image", "r.example.com/x:1"])])
def test_scripts_run_from_another_folder_and_check_inputs_before_the_cluster(built, script, extra):
    tmp, repo = built
    assert deploy("--out-dir", "k8s/small", "--serving-image", "r.example.com/serving:1", *extra).exit_code == 0
    env, elsewhere = fake_tools(tmp), tmp / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([f"../k8s/small/{script}"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = (tmp / "calls.log").read_text().splitlines()
    copied = [c.split()[2] for c in calls if c.startswith("kubectl cp")]
    contexts = [c.split("=", 1)[1] for c in " ".join(calls).split() if c.startswith(("repository=", "engines-"))]
    sources = copied or contexts
    assert sources and all(os.path.isabs(s) and os.path.exists(s) for s in sources), sources
    assert str(repo) in sources
    (tmp / "calls.log").unlink()
    shutil.rmtree(tmp / "engines" / ENGINE / "tokenizer")
    done = subprocess.run([f"../k8s/small/{script}"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and f"{tmp / 'engines' / ENGINE / 'tokenizer'} is missing" in done.stderr
    assert not (tmp / "calls.log").exists()  # nothing applied, started or deleted


def test_host_path_volumes_are_absolute(built):
    tmp, repo = built
    assert deploy("--out-dir", "out", "--host-path", "--serving-image", "r.example.com/s:1").exit_code == 0
    volumes = yaml.safe_load((tmp / "out" / "deployment.yaml").read_text())["spec"]["template"]["spec"]["volumes"]
    assert [v["hostPath"]["path"] for v in volumes if "hostPath" in v] == [str(repo), str(tmp / "engines")]


@pytest.mark.parametrize(
    "size, message",
    [
        ("200", "--storage-size 200 has no unit, so Kubernetes reads it as 200 bytes: add one, e.g. 200Gi"),
        ("", "--storage-size '' is not a storage quantity"),
        ("1K", "--storage-size '1K' is not a storage quantity"),
        ("1Mi", r"--storage-size 1Mi \(0.00 GiB\) is smaller than the data on disk \(2.00 GiB\): give at least 3Gi"),
        ("1.5Gi", r"--storage-size 1.5Gi \(1.50 GiB\) is smaller than the data on disk"),
    ],
)
def test_wrong_storage_sizes_are_refused(built, size, message):
    tmp, repo = built
    with pytest.raises(SpecpipeError, match=message):
        write_k8s(repo, tmp / "out", storage_size=size)
    assert not (tmp / "out").exists()


@pytest.mark.parametrize("size", ["1.5Ti", "2.5Gi", "3G", "3000000000", "1E"])
def test_kubernetes_quantities_that_fit_are_written_as_given(built, size):
    tmp, repo = built
    claim = yaml.safe_load((write_k8s(repo, tmp / "out", storage_size=size) / "pvc.yaml").read_text())
    assert claim["spec"]["resources"]["requests"]["storage"] == size


@pytest.mark.parametrize("variant", [[], ["--host-path"], ["--image", "r.example.com/x:1"], ["--pvc", "mine"]])
def test_one_replica_recreates_in_every_variant(built, variant):
    tmp, _ = built
    assert deploy("--out-dir", "out", "--serving-image", "r.example.com/s:1", *variant).exit_code == 0
    assert yaml.safe_load((tmp / "out" / "deployment.yaml").read_text())["spec"]["strategy"] == {"type": "Recreate"}


def test_a_local_serving_tag_is_warned_about_on_stderr(built):
    tmp, _ = built
    result = deploy("--out-dir", "out")
    assert result.exit_code == 0
    said = " ".join(result.stderr.split())  # the console wraps long lines
    assert "a local tag a cluster cannot pull" in said and "--serving-image REGISTRY/specpipe-triton:" in said
    pushed = deploy("--out-dir", "out2", "--serving-image", "r.example.com/s:1")
    assert pushed.exit_code == 0 and "cannot pull" not in pushed.stderr
