"""Third-party progress bars (huggingface_hub's and transformers' tqdm) stay out of logs: each redraw of a
bar is a carriage return, so in a file they join into one line of thousands of characters."""

from __future__ import annotations

import os

from click.testing import CliRunner

from specpipe import progress
from specpipe.cli import main
from specpipe.progress import LIBRARY_BARS_OFF, quiet_library_bars


def test_a_command_whose_stderr_is_no_terminal_turns_library_bars_off(monkeypatch):
    monkeypatch.delenv(LIBRARY_BARS_OFF, raising=False)
    result = CliRunner().invoke(main, ["build"])  # fails on the missing --target, after the group ran
    assert result.exit_code != 0
    assert os.environ.get(LIBRARY_BARS_OFF) == "1"


def test_a_terminal_keeps_the_bars_and_a_users_own_setting_wins(monkeypatch):
    monkeypatch.delenv(LIBRARY_BARS_OFF, raising=False)
    monkeypatch.setattr(progress, "is_terminal", lambda: True)
    quiet_library_bars()
    assert LIBRARY_BARS_OFF not in os.environ
    monkeypatch.setattr(progress, "is_terminal", lambda: False)
    monkeypatch.setenv(LIBRARY_BARS_OFF, "0")
    quiet_library_bars()
    assert os.environ[LIBRARY_BARS_OFF] == "0"


def test_the_local_triton_server_writes_its_log_without_bars(tmp_path, monkeypatch):
    from specpipe.serve import local

    started = {}

    class Popen:
        def __init__(self, cmd, **kwargs):
            started.update(kwargs)
            self.pid = 1

    (tmp_path / "repo").mkdir()
    monkeypatch.delenv(LIBRARY_BARS_OFF, raising=False)
    monkeypatch.setattr(local.subprocess, "Popen", Popen)
    monkeypatch.setattr(local, "check_ports", lambda ports: None)
    server = local.LocalTritonServer(tmp_path / "repo", log_path=tmp_path / "triton.log")
    monkeypatch.setattr(server, "command", lambda: (["tritonserver"], {}))
    server.start()
    assert started["env"][LIBRARY_BARS_OFF] == "1"
