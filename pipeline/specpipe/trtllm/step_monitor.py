"""Run a long step with its output in its log file, and show that it is alive while it runs.

``convert_checkpoint.py``, ``quantize.py`` and ``trtllm-build`` run for minutes to hours. While the step
runs, its log is followed and a status is shown: the elapsed time, the tool's progress where it prints
one, and the log's last line. In a terminal that is one live status line (rich), rewritten about once a
second; anywhere else (a log file, CI, nohup) one line per interval (default a minute)::

    build-target: 12m00s, 37% (30/80 layers), last: <line>

What the tools print, and what is parsed from it (:func:`parse_progress`):

* tqdm bars, ``DESC:  37%|███▋      | 30/80 [00:12<00:20,  2.50it/s]``, rewritten in place with
  ``\\r``: transformers' ``Loading checkpoint shards`` when a converter or quantize.py loads the Hugging
  Face model (``src/transformers/modeling_utils.py`` @ 040ba146759afc625c77f49d04982bb54873995f),
  TensorRT-LLM's ``Rank [0] Loading weights`` over the shard files (``tensorrt_llm/models/convert_utils.py``
  ``iterate_shard_files`` @ 9b3c71241051d4e6d10523de4cf9015bf106ca7f) and per-layer bars such as
  ``loading weight in each layer...`` (``tensorrt_llm/models/qwen/convert.py``
  @ 65b31db1b401d3752b8ebe7c29093cbfb6af04b7);
* tqdm counters without a total, ``370it [00:28, 12.95it/s]``: the ``ModelWeightsLoader`` loop over a
  model's parameters (``tensorrt_llm/models/model_weights_loader.py`` ``generate_tllm_weights``
  @ 04a2cacbfd3b9ac76191bd8498ad871607b63a04): a count, no percentage;
* ``WORD a/b`` or ``a/b WORD`` for layers, shards, batches, steps or engines: a fraction.

``trtllm-build`` itself prints log lines only (``[TRT-LLM] [I] ...``, ``Total time of building all
engines: 00:00:41``: ``tensorrt_llm/commands/build.py`` @ 65f1d1536e18aea3380e6e270e00895a709333eb),
so its status is the elapsed time and its last line.

The log is split on ``\\r`` and ``\\n`` both, so each tqdm redraw is a line of its own; terminal escape
sequences (tqdm's cursor moves for bars of several ranks) are dropped.
"""

from __future__ import annotations

import codecs
import re
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from specpipe import progress

HEARTBEAT_S = 60.0
"""Seconds between two status lines when the output is not a terminal."""

REFRESH_S = 1.0
"""Seconds between two updates of the live status line in a terminal."""

TAIL_LINES = 20
"""Lines of the log a failed step's error quotes."""

_LINE_CHARS = 160
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
_NUMBER = r"\d+(?:\.\d+)?[kMGT]?"
_BAR = re.compile(rf"(?:(?P<desc>[^|]*?):\s*)?(?P<pct>\d{{1,3}})%\|[^|]*\|\s*(?P<n>{_NUMBER})/(?P<total>{_NUMBER})")
_COUNTER = re.compile(r"^(?:(?P<desc>.*?):\s*)?(?P<n>\d+)(?P<unit>[A-Za-z]+) \[\d+:\d\d")
_WORDS = r"layers?|shards?|batch(?:es)?|steps?|engines?|ranks?"
_WORD_FRACTION = re.compile(rf"\b(?P<word>{_WORDS})\b\D{{0,3}}?(?P<n>\d+)\s*/\s*(?P<total>\d+)", re.IGNORECASE)
_FRACTION_WORD = re.compile(rf"\b(?P<n>\d+)\s*/\s*(?P<total>\d+)\s+(?P<word>{_WORDS})\b", re.IGNORECASE)
_PLURAL = {
    "layer": "layers",
    "shard": "shards",
    "batch": "batches",
    "step": "steps",
    "engine": "engines",
    "rank": "ranks",
}


@dataclass(frozen=True)
class Progress:
    """A tool's progress read from one line: ``percent`` (0-100, ``None`` for a bare count), ``done`` and
    ``total`` as printed (tqdm may scale them: ``1.2k``), and ``unit`` (``layers``, ``shards``, ``it``, ...)."""

    percent: float | None
    done: str
    total: str | None
    unit: str

    def text(self) -> str:
        """``37% (30/80 layers)``, ``50% (2/4)``, or ``370 it`` for a count without a total."""
        unit = f" {self.unit}" if self.unit else ""
        if self.percent is None:
            return f"{self.done}{unit}"
        return f"{self.percent:.0f}% ({self.done}/{self.total}{unit})"


def _unit(description: str) -> str:
    words = description.lower()
    if "layer" in words:
        return "layers"
    if "shard" in words or "loading weights" in words:
        return "shards"
    if "calibrat" in words or "batch" in words:
        return "batches"
    return ""


def parse_progress(line: str) -> Progress | None:
    """The progress a log line reports (see the module docstring), or ``None``."""
    bar = _BAR.search(line)
    if bar:
        return Progress(float(bar["pct"]), bar["n"], bar["total"], _unit(bar["desc"] or ""))
    counter = _COUNTER.match(line)
    if counter:
        return Progress(None, counter["n"], None, _unit(counter["desc"] or "") or counter["unit"])
    fraction = _WORD_FRACTION.search(line) or _FRACTION_WORD.search(line)
    if fraction and 0 < int(fraction["total"]) and int(fraction["n"]) <= int(fraction["total"]):
        word = fraction["word"].lower()
        return Progress(
            100.0 * int(fraction["n"]) / int(fraction["total"]),
            fraction["n"],
            fraction["total"],
            _PLURAL.get(word, word),
        )
    return None


def clean(segment: str) -> str:
    """A log segment as shown: escape sequences dropped, surrounding blanks stripped."""
    return _ESCAPE.sub("", segment).strip()


class LogFollower:
    """Reads what a running step appended to its log since the last :meth:`poll`.

    ``last`` is the newest non-blank segment (the text after the last ``\\r``/``\\n`` counts: a tqdm bar
    being redrawn ends without a newline) and ``progress`` the newest progress any segment reported.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path, self.offset = Path(path), offset
        self.last: str = ""
        self.progress: Progress | None = None
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def poll(self) -> None:
        """Read the new bytes and update :attr:`last` and :attr:`progress` (a missing log reads as empty)."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return
        self.offset += len(data)
        segments = re.split(r"[\r\n]", self._pending + self._decoder.decode(data))
        self._pending = segments[-1]
        for segment in segments:
            text = clean(segment)
            if text:
                self.last = text
                self.progress = parse_progress(text) or self.progress


def elapsed_text(seconds: float) -> str:
    """``12m00s``; ``1h02m03s`` from an hour on."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def status_text(label: str, seconds: float, follower: LogFollower) -> str:
    """``LABEL: 12m00s, 37% (30/80 layers), last: LINE`` (without progress or line where there is none)."""
    parts = [elapsed_text(seconds)]
    if follower.progress is not None:
        parts.append(follower.progress.text())
    last = follower.last if len(follower.last) <= _LINE_CHARS else follower.last[: _LINE_CHARS - 3] + "..."
    parts.append(f"last: {last}" if last else "no output yet")
    return f"{label}: " + ", ".join(parts)


def log_tail(log_path: Path, lines: int = TAIL_LINES, *, skip: int = 1) -> list[str]:
    """The last ``lines`` non-blank lines of a log, after its first ``skip`` lines (the command).

    A line rewritten with ``\\r`` (a tqdm bar) counts once, as its final state, so a bar's redraws do not
    push the error out of the tail; escape sequences and trailing blanks are dropped, indentation kept.
    A log that cannot be read has no lines.
    """
    try:
        text = log_path.read_bytes().decode(errors="replace")  # bytes: read_text would turn each \r into a line
    except OSError:
        return []
    kept: deque[str] = deque(maxlen=lines)
    for line in text.split("\n")[skip:]:
        shown = next((_ESCAPE.sub("", s).rstrip() for s in reversed(line.split("\r")) if clean(s)), "")
        if shown:
            kept.append(shown)  # indentation kept: a traceback's lines stay readable
    return list(kept)


def run_monitored(
    command: list[str],
    log: IO[str],
    *,
    label: str,
    report: Callable[[str], None],
    interval_s: float = HEARTBEAT_S,
    terminal: bool | None = None,
    refresh_s: float = REFRESH_S,
) -> int:
    """Run ``command`` with stdout and stderr appended to ``log`` (an open file) and stdin closed, showing
    its status until it exits; returns its exit status.

    ``terminal`` (default: whether :data:`specpipe.progress.console` is one) chooses the live status line
    (updated every ``refresh_s`` seconds) or a status line passed to ``report`` every ``interval_s``
    seconds, prefixed by two spaces; a command that succeeds ends with ``  LABEL: finished after 12m03s``
    through ``report``. An exception while waiting (Ctrl-C, SIGTERM) stops the command
    (SIGINT, SIGTERM after 5 s, SIGKILL after 5 more: :func:`_stop`) and is raised again.

    Raises:
        FileNotFoundError: the program does not exist.
    """
    if terminal is None:
        terminal = progress.is_terminal()
    log.flush()
    follower = LogFollower(Path(log.name), offset=log.tell())
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        if terminal:
            with progress.live_line(status_text(label, 0.0, follower)) as show:
                _watch(
                    process, follower, refresh_s, lambda: show(status_text(label, time.monotonic() - start, follower))
                )
        else:
            _watch(
                process,
                follower,
                interval_s,
                lambda: report("  " + status_text(label, time.monotonic() - start, follower)),
            )
    except BaseException:
        _stop(process)
        raise
    if process.returncode == 0:
        report(f"  {label}: finished after {elapsed_text(time.monotonic() - start)}")
    return process.returncode


def _watch(process: subprocess.Popen, follower: LogFollower, every_s: float, beat: Callable[[], None]) -> None:
    """Call ``beat`` every ``every_s`` seconds (on a fixed schedule, so late wake-ups do not add up)
    until ``process`` exits."""
    due = time.monotonic() + every_s
    while True:
        try:
            process.wait(timeout=max(0.0, due - time.monotonic()))
            return
        except subprocess.TimeoutExpired:
            pass
        follower.poll()
        beat()
        now = time.monotonic()
        due += every_s
        if due <= now:
            due = now + every_s


STOP_WAIT_S = 5.0
"""Seconds a stopped step is given after SIGINT, and again after SIGTERM, before SIGKILL."""


def _stop(process: subprocess.Popen, wait_s: float = STOP_WAIT_S) -> None:
    """Stop a step as Ctrl-C would, whether the signal reached only specpipe or the whole process group:
    SIGINT (``docker run`` passes it on to the container's process: its default ``--sig-proxy=true``),
    then SIGTERM, then SIGKILL, ``wait_s`` seconds apart."""
    for send in (lambda: process.send_signal(signal.SIGINT), process.terminate, process.kill):
        if process.poll() is not None:
            return
        send()
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    process.wait()
