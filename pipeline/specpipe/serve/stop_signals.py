"""Ctrl-C and SIGTERM while ``specpipe serve`` runs: the first one starts the stop, later ones only
hurry it.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Raised again while the
server was being stopped, it escaped the stop before ``tritonserver`` had been signalled (measured by a
tester: 30 SIGTERMs 30 ms apart left the server and its stubs running, refusing every request, with
``serve`` gone). So the first signal raises, and from then on (or from :meth:`StopSignals.hold`, for a
stop that began otherwise) a signal calls ``hurry`` instead: the running requests end at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

#: Ctrl-C, ``kill`` / orchestrators, and a closed terminal or dropped ssh session.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Context manager installing the handlers for :data:`SIGNALS` (module doc), restoring the
    previous ones on exit. Off the main thread, where Python cannot install handlers, it does nothing.

    Args:
        hurry: called (in the main thread, between two Python operations) for each signal after the first.

    Attributes:
        repeats: signals received after the first.
    """

    def __init__(self, hurry: Callable[[], None]):
        self._hurry = hurry
        self._previous: dict[int, object] = {}
        self.repeats = 0

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
            self._install(self._first)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def hold(self) -> None:
        """The server is stopping: from now on a signal hurries the stop instead of raising."""
        if self._previous:
            self._install(self._again)

    def _install(self, handler) -> None:
        for signum in SIGNALS:
            signal.signal(signum, handler)

    def _first(self, signum, frame) -> None:
        self._install(self._again)  # before raising: a signal arriving meanwhile must not raise again
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    def _again(self, signum, frame) -> None:
        self.repeats += 1
        self._hurry()
