"""Stop conditions of one request: end id, stop words and the token budget, applied to the tokens each
engine step commits (possibly several at once)."""

from __future__ import annotations

from collections.abc import Iterable


class StopConditions:
    """Turns committed tokens into returned tokens and a finish reason.

    * The end id finishes the request (``"stop"``) and is not returned.
    * A stop word finishes the request (``"stop"``) as soon as the committed output ends with it, even in
      the middle of a step's tokens; the stop word is not returned. To keep a stop word that spans
      steps from leaking, a trailing run of tokens that could still grow into a stop word is held
      back until it no longer can (or the request finishes otherwise).
    * After ``max_tokens`` committed tokens the request finishes (``"length"``); tokens beyond the
      budget are dropped.

    Args:
        end_ids: token ids that end generation (may be empty).
        stop_words: token-id sequences (empty ones are ignored).
        max_tokens: most tokens to commit (>= 1).
    """

    def __init__(self, end_ids: Iterable[int], stop_words: Iterable[Iterable[int]], max_tokens: int):
        self.end_ids = frozenset(end_ids)
        self.stop_words = [list(words) for words in stop_words if len(tuple(words)) > 0]
        self.max_tokens = max_tokens
        self.committed = 0
        self.returned = 0
        self._held: list[int] = []

    @property
    def remaining(self) -> int:
        """Tokens that may still be committed."""
        return self.max_tokens - self.committed

    def push(self, tokens: list[int]) -> tuple[list[int], str | None]:
        """Apply the stop conditions to newly committed ``tokens``, in order.

        Returns:
            the tokens to return now, and ``"stop"``/``"length"`` when the request is finished (tokens
            after the stopping point are discarded) or ``None``.
        """
        ready: list[int] = []
        for token in tokens:
            if self.committed == self.max_tokens:
                return self._finish(ready, "length")
            self.committed += 1
            if token in self.end_ids:
                return self._finish(ready, "stop")
            self._held.append(token)
            stop_word = self._completed_stop_word()
            if stop_word:
                del self._held[-len(stop_word) :]
                return self._finish(ready, "stop")
            release = len(self._held) - self._longest_stop_word_prefix()
            ready += self._held[:release]
            del self._held[:release]
        if self.committed == self.max_tokens:
            return self._finish(ready, "length")
        self.returned += len(ready)
        return ready, None

    def finish(self) -> list[int]:
        """End the request for another reason (context full): return the held-back tokens."""
        ready, _ = self._finish([], "length")
        return ready

    def _finish(self, ready: list[int], reason: str) -> tuple[list[int], str]:
        ready = ready + self._held
        self._held = []
        self.returned += len(ready)
        return ready, reason

    def _completed_stop_word(self) -> list[int] | None:
        """The longest stop word the held tokens end with, if any."""
        completed = [w for w in self.stop_words if len(w) <= len(self._held) and self._held[-len(w) :] == w]
        return max(completed, key=len) if completed else None

    def _longest_stop_word_prefix(self) -> int:
        """Length of the longest suffix of the held tokens that is a proper prefix of a stop word."""
        held = self._held
        for length in range(min(len(held), max((len(w) for w in self.stop_words), default=1) - 1), 0, -1):
            suffix = held[-length:]
            if any(len(w) > length and w[:length] == suffix for w in self.stop_words):
                return length
        return 0
