"""Bad input to ``specpipe build --runtime cpu``: one clear line, non-zero exit, nothing written."""

import os

import pytest
from click.testing import CliRunner

from specpipe.cli import main


def run(args, tmp_path):
    engines = tmp_path / "engines"
    result = CliRunner().invoke(main, ["build", "--engines-dir", str(engines), *args])
    leftovers = list(engines.iterdir()) if engines.exists() else []
    return result, leftovers


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--target", "smollm2-13m", "--draft", "ngram"], 1, "did you mean 'smollm2-135m'"),
        (["--target", "smollm2-135m", "--draft", "ngrm"], 1, "did you mean 'ngram'"),
        (["--target", "smollm2-135m", "--draft", "ngram", "--max-draft-len", "0"], 2, "must be a positive integer"),
        (["--target", "smollm2-135m", "--draft", "ngram", "--max-draft-len", "-3"], 2, "must be a positive integer"),
        (["--target", "smollm2-135m", "--draft", "none", "--max-draft-len", "3"], 1, "no meaning with --draft none"),
        (
            ["--target", "smollm2-135m", "--draft", "ngram", "--max-draft-len", "100000"],
            2,
            "--max-draft-len 100000 is more than the CPU runtime verifies in a step (64 draft tokens): give at most 64",
        ),
        (
            ["--target", "smollm2-135m", "--draft", "eagle", "--max-draft-len", "65"],
            2,
            "--max-draft-len 65 is more than",
        ),
        (["--target", "smollm2-135m", "--draft", "smollm2-draft", "--max-draft-len", "4096"], 2, "give at most 64"),
        (["--target", "smollm2-135m", "--draft", "ngram", "--json"], 2, "--json goes with --dry-run"),
        (["--target", "smollm2-135m", "--draft", "ngram", "--name", "../escape"], 1, "no paths"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, code, message):
    result, leftovers = run(args, tmp_path)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert leftovers == []


def test_draft_made_for_another_target_is_refused(tmp_path):
    target = tmp_path / "other.toml"
    target.write_text(
        'name = "other"\n[source]\nkind = "local"\npath = "/nonexistent"\n'
        "[architecture]\nnum_layers = 2\nhidden_size = 8\nnum_attention_heads = 2\nnum_kv_heads = 1\n"
        "head_dim = 4\nintermediate_size = 16\nvocab_size = 32\nmax_position_embeddings = 64\n"
    )
    result, leftovers = run(["--target", str(target), "--draft", "smollm2-draft"], tmp_path)
    assert result.exit_code == 1
    assert "was made for smollm2-135m, not for target 'other'" in result.output
    assert leftovers == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_engines_root(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    result = CliRunner().invoke(
        main, ["build", "--target", "smollm2-135m", "--draft", "ngram", "--engines-dir", str(root / "sub")]
    )
    assert result.exit_code == 1
    assert "choose another with --engines-dir" in result.output


def test_engines_root_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(
        main, ["build", "--target", "smollm2-135m", "--draft", "ngram", "--engines-dir", str(blocker / "engines")]
    )
    assert result.exit_code == 1
    assert "cannot write to engines directory" in result.output and "--engines-dir" in result.output
