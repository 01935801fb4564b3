"""Cited upstream commits stay checkable: every ``@ <sha>`` in the TensorRT-LLM stage's sources and flag
tables is a commit id (7 to 40 hex digits), and every commit release.py cites (the pin's whole basis)
is one of the commits it lists as verified, with the repository it was read in."""

import json
import re
from pathlib import Path

import pytest

from specpipe.trtllm import release
from specpipe.trtllm.flagcheck import FLAGS_DIR

TRTLLM = Path(release.__file__).parent
CITATION = re.compile(r"@ ?`{0,2}([0-9A-Za-z]+)(?![0-9A-Za-z:])")  # not an image digest, @sha256:HEX
SHA = re.compile(r"^[0-9a-f]{7,40}$")


def citations(text):
    return [m.group(1) for m in CITATION.finditer(text) if any(c.isdigit() for c in m.group(1))]


@pytest.mark.parametrize("path", sorted(TRTLLM.glob("*.py")), ids=lambda p: p.name)
def test_every_cited_commit_is_a_commit_id(path):
    bad = [sha for sha in citations(path.read_text()) if not SHA.match(sha)]
    assert bad == [], f"{path.name} cites commits that are no commit ids (7-40 lowercase hex): {bad}"


def test_flag_tables_cite_full_commits_or_say_what_they_read():
    for table in sorted(FLAGS_DIR.glob("*.json")):
        for source in json.loads(table.read_text())["sources"]:
            commit = source["commit"]
            assert re.fullmatch(r"[0-9a-f]{40}", commit) or commit.startswith("index copy id "), (table.name, commit)


def test_release_cites_only_verified_commits_of_the_repository_it_names():
    verified = {sha: repo for repo, shas in release.VERIFIED_COMMITS.items() for sha in shas}
    assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in verified)
    text = Path(release.__file__).read_text()
    cited = citations(text) + re.findall(r"\b[0-9a-f]{40}\b", text)
    assert cited, "release.py cites no commit"
    unverified = [sha for sha in cited if not any(full.startswith(sha) for full in verified)]
    assert unverified == [], f"release.py cites commits missing from VERIFIED_COMMITS: {unverified}"
    for repo, shas in release.VERIFIED_COMMITS.items():
        for sha in shas:
            assert sha in text, f"VERIFIED_COMMITS lists {repo} @ {sha[:7]}, which release.py no longer cites"


def test_the_pin_is_a_row_of_the_cited_compatibility_table():
    assert release.CONTAINER_RELEASES[release.TRITON_RELEASE] == release.TRTLLM_VERSION
    first = min(t for t, r in release.CONTAINER_RELEASES.items() if r == release.TRTLLM_VERSION)
    assert first == release.TRITON_RELEASE  # the docstring's "first release that ships" the pin
