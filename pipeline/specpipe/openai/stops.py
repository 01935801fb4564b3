"""String-exact stop strings on decoded text, as OpenAI, vLLM, TGI and llama.cpp's server apply ``stop``.

The output ends right before the first occurrence of any stop string in the generated *text*,
wherever the token boundaries fall (a stop string may start or end inside a token, or span several
tokens of one speculative step or of several steps). While streaming, the only text held back is the
longest suffix that is still a prefix of some stop string, so a client never sees the beginning of a
stop string that then completes, and sees everything else at once.

This is the gateway's ``stop``. The ensemble's ``stop_words`` input keeps TensorRT-LLM's token-level
meaning (each word tokenized on its own; generation stops when the output token ids end with it).
"""

from __future__ import annotations

from collections.abc import Iterable


class StopStrings:
    """Feeds generated text through the stop strings of one request.

    Args:
        stops: the stop strings (empty ones are ignored).

    Attributes:
        stopped: a stop string was found; everything from it on was dropped.
    """

    def __init__(self, stops: Iterable[str]):
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> str:
        """Text that can be released after ``text`` arrived (possibly empty). After a stop string was
        found, returns what precedes it, then only empty strings."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        found = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped, self._held = True, ""
            return buffer[: min(found)]
        keep = self._partial(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back text, when generation ended without completing a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop string."""
        longest = min(len(buffer), max(len(s) for s in self.stops) - 1)
        for length in range(longest, 0, -1):
            tail = buffer[-length:]
            if any(len(s) > length and s.startswith(tail) for s in self.stops):
                return length
        return 0
