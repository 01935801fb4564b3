"""``specpipe bench --out`` is checked before anything is measured (a fresh tester's ``--out README.md``
ran every level, then failed on ``mkdir`` and lost the results)."""

import os

import pytest
from click.testing import CliRunner
from loopback import free_port

from specpipe.bench.job import check_output_folder
from specpipe.cli import main
from specpipe.errors import SpecpipeError


def test_a_file_or_a_file_among_the_parents_is_refused(tmp_path):
    existing = tmp_path / "notes.md"
    existing.write_text("x")
    for out in (existing, existing / "results"):
        with pytest.raises(SpecpipeError, match=f"{existing} is a file; pass a folder"):
            check_output_folder(out)
    check_output_folder(tmp_path / "new" / "folder")  # to be created when the results are written
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(SpecpipeError, match="cannot write in"):
        check_output_folder(locked / "out")


def test_bench_refuses_a_file_as_out_before_contacting_any_deployment(tmp_path):
    existing = tmp_path / "README.md"
    existing.write_text("keep me")
    result = CliRunner().invoke(main, ["bench", "--url", f"x=localhost:{free_port()}", "--out", str(existing)])
    assert result.exit_code == 1 and "is a file; pass a folder for the results" in result.output, result.output
    assert existing.read_text() == "keep me"
