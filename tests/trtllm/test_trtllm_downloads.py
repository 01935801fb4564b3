"""TensorRT-LLM build downloads against a fake Hugging Face Hub on 127.0.0.1 (tests/helpers/fake_hub.py).

Each build runs in a subprocess with its own environment (HF_ENDPOINT at the fake, HF_HOME in tmp_path,
HF_HUB_OFFLINE=0: tests/conftest.py sets it to 1 for this process): the LLM API flow of the gated preset
llama3.1-8b with ``--draft ngram``, i.e. the first-contact step (a stand-in ``python3``) and the target's
download. The fake counts the bytes it serves per file.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub, FakeRepo
from fake_programs import write_program

from specpipe.build_request import BuildRequest
from specpipe.trtllm import release
from specpipe.trtllm.build import HUB_CHECK, plan_build

REPO = "meta-llama/Llama-3.1-8B-Instruct"
SHARD = "model-00001-of-00002.safetensors"
CHUNK = 64 * 1024
rnd = random.Random(32)
FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
    "tokenizer.json": b'{"version": "1.0"}',
    SHARD: rnd.randbytes(3_000_000),
    "model-00002-of-00002.safetensors": rnd.randbytes(2_000_000),
    "original/consolidated.00.pth": rnd.randbytes(300_000),  # left out by --exclude 'original/*'
}
KEPT = sorted(name for name in FILES if not name.startswith("original/"))

DRIVER = textwrap.dedent(
    """\
    import os, shutil, sys
    import huggingface_hub.constants
    huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = %d  # many chunks in a few MB (the default is 10 MiB)
    if os.environ.get("FAKE_FREE_BYTES"):
        real = shutil.disk_usage
        shutil.disk_usage = lambda path: real(path)._replace(free=int(os.environ["FAKE_FREE_BYTES"]))
    from specpipe.build_request import BuildRequest
    from specpipe.errors import SpecpipeError
    from specpipe.trtllm.build import build_trtllm
    request = BuildRequest(target="llama3.1-8b", draft="ngram", runtime="trtllm-llmapi", engines_dir=sys.argv[1],
                           executor="local", quantization="auto")
    try:
        print("engine", build_trtllm(request, importable=lambda: True))
    except SpecpipeError as exc:
        print("error: " + str(exc))
        sys.exit(1)
"""
    % CHUNK
)

STANDIN_PYTHON3 = """#!{python}
import sys
from pathlib import Path
if "--report" in sys.argv:
    Path(sys.argv[sys.argv.index("--report") + 1]).parent.mkdir(parents=True, exist_ok=True)
"""


@pytest.fixture
def hub(tmp_path):
    repo = FakeRepo(REPO, dict(FILES), gated=True, granted={"hf_granted"})
    with FakeHub([repo], tokens={"hf_granted", "hf_not_granted"}) as server:
        yield server


@pytest.fixture
def build(tmp_path, hub):
    """``build(engines_dir, **env) -> CompletedProcess`` of one build against the fake hub."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_program(bin_dir, "python3", STANDIN_PYTHON3.format(python=sys.executable))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    base |= {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_TOKEN": "hf_granted",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        release.EXAMPLES_ENV: str(tmp_path / "examples"),
        "SPECPIPE_CACHE": str(tmp_path / "cache"),
    }

    def run(engines: Path, wrap: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in (base | env).items() if v is not None}
        return subprocess.run(
            [*wrap, sys.executable, "-c", DRIVER, str(engines)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def blobs(tmp_path) -> Path:
    return tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "blobs"


def download_folder(engines: Path) -> Path:
    (folder,) = [p for p in (engines / ".trtllm-work").glob("download-target-*") if not p.name.endswith(".partial")]
    return folder


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and lines, proc.stdout + proc.stderr
    return lines[0]


def test_an_interrupted_download_resumes_where_it_stopped_and_ends_byte_identical(tmp_path, hub, build):
    hub.drop_after[SHARD] = 1_000_000  # the connection drops after 1 MB, then the file answers 503
    first = build(tmp_path / "engines")
    line = error_line(first)
    assert line.startswith(
        f"error: step download-target failed with exit status 1: download of {REPO}@main failed: "
        "HfHubHTTPError: Server error '503 Service Unavailable' for url"
    )
    assert "run the build again to resume" in line
    assert (
        "Traceback" not in first.stdout and "lines of the log" not in first.stdout
    )  # the cause only: traceback in the log
    assert line.endswith(".log") and "Traceback" in Path(line.rsplit("see ", 1)[1]).read_text()
    partial = blobs(tmp_path) / (FakeRepo(REPO, FILES).entry(SHARD)["lfs"]["oid"] + ".incomplete")
    kept = partial.stat().st_size
    assert 1_000_000 - CHUNK < kept <= 1_000_000 and partial.read_bytes() == FILES[SHARD][:kept]
    assert not list((tmp_path / "engines" / ".trtllm-work").glob("download-target-*"))  # no step folder, half or whole
    assert hub.served["model-00002-of-00002.safetensors"] == 2_000_000  # the other files finished meanwhile
    assert "original/consolidated.00.pth" not in hub.served

    hub.heal()
    hub.reset_counts()
    second = build(tmp_path / "engines")
    assert second.returncode == 0, second.stdout + second.stderr
    assert dict(hub.served) == {SHARD: len(FILES[SHARD]) - kept}  # only the rest of the cut-off file
    assert hub.ranges == [(SHARD, kept)]
    folder = download_folder(tmp_path / "engines")
    placed = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name[0] != ".")
    assert placed == KEPT and all((folder / name).read_bytes() == FILES[name] for name in KEPT)
    assert not partial.exists()
    manifest = json.loads(next((tmp_path / "engines").glob("llama3.1-8b-*/manifest.json")).read_text())
    assert manifest["target"]["path"] == str(folder)


def test_a_killed_download_resumes_on_the_next_run(tmp_path, hub, build):
    """SIGKILL mid-file (no cleanup runs at all): the next run continues the partial blob."""
    hub.stall_after[SHARD] = 1_500_000
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_TOKEN": "hf_granted",
    }
    code = (
        "import huggingface_hub.constants as c; c.DOWNLOAD_CHUNK_SIZE = %d\n"
        "from specpipe.models.hub_access import HubSource\nfrom specpipe.models.hub_download import download_snapshot\n"
        "download_snapshot(HubSource(%r, 'main', ('original/*',)))" % (CHUNK, REPO)
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    partial = blobs(tmp_path) / (FakeRepo(REPO, FILES).entry(SHARD)["lfs"]["oid"] + ".incomplete")
    deadline = time.monotonic() + 60
    while not (partial.is_file() and partial.stat().st_size >= 1_500_000 - CHUNK) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    kept = partial.stat().st_size
    assert kept >= 1_500_000 - CHUNK
    hub.heal()
    hub.reset_counts()
    assert build(tmp_path / "engines").returncode == 0
    assert hub.served[SHARD] == len(FILES[SHARD]) - kept and hub.ranges.count((SHARD, kept)) == 1
    assert (download_folder(tmp_path / "engines") / SHARD).read_bytes() == FILES[SHARD]


def test_a_second_build_with_the_model_in_the_cache_downloads_nothing(tmp_path, hub, build):
    assert build(tmp_path / "one").returncode == 0
    assert sum(hub.served.values()) == sum(len(FILES[n]) for n in KEPT)
    hub.reset_counts()
    second = build(tmp_path / "two")  # another engines directory: its download step runs again
    assert second.returncode == 0, second.stdout + second.stderr
    assert sum(hub.served.values()) == 0 and hub.ranges == []
    assert "0.0 MiB not yet in the cache" in second.stderr
    one, two = download_folder(tmp_path / "one"), download_folder(tmp_path / "two")
    for name in KEPT:  # hard links to the cache's blobs (one filesystem): the weights exist once on disk
        assert (one / name).stat().st_ino == (two / name).stat().st_ino
        assert (two / name).read_bytes() == FILES[name]


def test_a_gated_repository_without_access_fails_before_anything_is_written(tmp_path, hub, build):
    proc = build(tmp_path / "engines", HF_TOKEN="hf_not_granted")
    assert error_line(proc) == (
        f"error: {REPO} is a gated repository and this account has not been granted access (HTTP 403): accept its "
        f"licence at {hub.endpoint}/{REPO}, then log in with `hf auth login` or set HF_TOKEN to a token of an account "
        "that has access"
    )
    assert not (tmp_path / "engines").exists() and not hub.served and not (tmp_path / "hf" / "hub").exists()


def test_a_gated_repository_without_a_token_names_the_licence_and_the_login(tmp_path, hub, build):
    line = error_line(build(tmp_path / "engines", HF_TOKEN=None))
    assert f"{REPO} is a gated repository" in line and "(HTTP 401)" in line and f"{hub.endpoint}/{REPO}" in line
    assert "`hf auth login`" in line and "HF_TOKEN" in line and not (tmp_path / "engines").exists()


def test_a_refused_token_names_hf_auth_login_and_hf_token(tmp_path, hub, build):
    proc = build(tmp_path / "engines", HF_TOKEN="hf_revoked")
    assert error_line(proc) == (
        f"error: the Hugging Face Hub refused the token for {REPO} (HTTP 401): log in with `hf auth login` or set "
        "HF_TOKEN to a token of an account that has access (tokens: https://huggingface.co/settings/tokens)"
    )
    assert not (tmp_path / "engines").exists() and not hub.served


def test_not_enough_free_disk_refuses_with_the_numbers(tmp_path, hub, build):
    need = sum(len(FILES[n]) for n in KEPT)
    proc = build(tmp_path / "engines", FAKE_FREE_BYTES=str(1_048_576))
    line = error_line(proc)
    cache = tmp_path / "hf" / "hub"
    assert line == (
        f"error: not enough free disk for the downloads: the Hugging Face cache {cache} has 1.0 MiB free, "
        f"they need {need / 2**20:.1f} MiB ({REPO} {need / 2**20:.1f} MiB): free space there, or put the "
        "cache on a larger disk with HF_HOME=/path (or HF_HUB_CACHE)"
    )
    assert not cache.exists() or not any(cache.iterdir())
    assert not (tmp_path / "engines").exists() and not hub.served


def test_the_planned_download_uses_only_flags_of_the_installed_hf_download():
    """The plan's display argv (``hf download REPO --revision R --exclude P``) is a valid ``hf download``
    command of the installed huggingface_hub: its flags appear in the CLI's own help."""
    plan, _, _ = plan_build(BuildRequest(target="llama3.1-8b", draft="ngram", runtime="trtllm-llmapi", dry_run=True))
    (step,) = [s for s in plan.steps if s.name == "download-target"]
    assert step.argv == ["hf", "download", REPO, "--revision", "main", "--exclude", "original/*"]
    hf = shutil.which("hf", path=str(Path(sys.executable).parent))
    help_text = subprocess.run(
        [hf, "download", "--help"], capture_output=True, text=True, timeout=60, env=dict(os.environ, NO_COLOR="1")
    ).stdout
    flags = [token for token in step.argv if token.startswith("--")]
    assert flags and all(f"{flag} " in help_text for flag in flags)
    assert "--local-dir" not in step.argv  # the cache, not a private copy


def test_a_dry_run_lists_the_hub_check_as_not_checked_naming_the_gated_licence():
    plan, _, _ = plan_build(BuildRequest(target="llama3.1-8b", draft="ngram", runtime="trtllm-llmapi", dry_run=True))
    (check,) = [c for c in plan.preflight.checks if c.name == HUB_CHECK]
    assert check.status == "not checked" and check.detail.startswith("dry run (offline)")
    assert f"gated: {REPO} (accept the licence at https://huggingface.co/{REPO})" in check.detail


def offline_error(tmp_path: Path) -> str:
    return (
        f"error: {REPO}@main is not in the Hugging Face cache {tmp_path / 'hf' / 'hub'} and HF_HUB_OFFLINE=1: "
        f"unset it or run `hf download {REPO} --exclude 'original/*'`"
    )


def test_offline_with_an_empty_cache_refuses_before_any_step(tmp_path, hub, build):
    proc = build(tmp_path / "engines", HF_HUB_OFFLINE="1")
    assert error_line(proc) == offline_error(tmp_path)
    assert "first-contact" not in proc.stderr and not (tmp_path / "engines").exists() and not hub.served


def test_offline_with_the_model_cached_builds_and_with_a_shard_missing_refuses(tmp_path, hub, build):
    assert build(tmp_path / "online").returncode == 0
    hub.reset_counts()
    offline = build(tmp_path / "offline", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert f"hub: {REPO}@main in the Hugging Face cache" in offline.stderr and not hub.served
    (snapshot,) = (tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots").iterdir()
    (snapshot / SHARD).unlink()
    line = error_line(build(tmp_path / "again", HF_HUB_OFFLINE="1"))
    assert line.startswith(f"error: {REPO}@main is only partly in the Hugging Face cache {tmp_path / 'hf' / 'hub'}")
    assert line.endswith(f"and HF_HUB_OFFLINE=1: unset it or run `hf download {REPO} --exclude 'original/*'`")
    assert not (tmp_path / "again").exists()


def test_a_cache_this_user_cannot_write_refuses_before_any_step(tmp_path, hub, build):
    """As an unprivileged user (root writes everywhere): HF_HOME in a folder owned by root, mode 755."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("needs setpriv to run as an unprivileged user")
    shared = Path(tempfile.mkdtemp(prefix="specpipe-rohf-"))
    try:
        (shared / "hf").mkdir()
        engines = shared / "engines"
        engines.mkdir(mode=0o777)
        engines.chmod(0o777)
        shared.chmod(0o755)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        proc = build(engines, HF_HOME=str(shared / "hf"), SPECPIPE_CACHE=str(engines / "cache"), wrap=drop)
        assert error_line(proc) == (
            f"error: the Hugging Face cache {shared / 'hf' / 'hub'} cannot be written: "
            f"{shared / 'hf'} is not writable by this user: set HF_HOME (or HF_HUB_CACHE) to "
            "a folder this user can write, or fix its permissions"
        ), proc.stdout + proc.stderr
        assert not hub.served and not (engines / ".trtllm-work").exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_ctrl_c_during_a_stalled_download_takes_effect_at_once_and_keeps_the_partial_file(tmp_path, hub):
    """huggingface_hub waits up to 10 s (its read timeout) for a stalled connection: the interrupt does not."""
    hub.stall_after[SHARD] = 1_500_000
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_TOKEN": "hf_granted",
    }
    code = (
        "import huggingface_hub.constants as c; c.DOWNLOAD_CHUNK_SIZE = %d\n"
        "from specpipe.models.hub_access import HubSource\nfrom specpipe.models.hub_download import download_snapshot\n"
        "download_snapshot(HubSource(%r, 'main', ('original/*',)))" % (CHUNK, REPO)
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    partial = blobs(tmp_path) / (FakeRepo(REPO, FILES).entry(SHARD)["lfs"]["oid"] + ".incomplete")
    deadline = time.monotonic() + 60
    while not (partial.is_file() and partial.stat().st_size >= 1_500_000 - CHUNK) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the other files are done: the shard's read is stalled
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - start < 3 and "KeyboardInterrupt" in stderr
    assert partial.stat().st_size >= 1_500_000 - CHUNK
