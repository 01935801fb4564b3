"""A stand-in for the Triton model's response sender, shared by the CPU model's worker tests."""

import threading


class RecordingSender:
    """A response sender that records responses; ``cancel_after`` responses, it reports a cancellation."""

    def __init__(self, cancel_after=None):
        self.responses, self.errors, self.finished = [], [], threading.Event()
        self.cancel_after, self.threads = cancel_after, set()

    def data(self, outputs, final):
        self.threads.add(threading.current_thread().name)
        self.responses.append((outputs, final))
        if final:
            self.finished.set()

    def error(self, message, code="INVALID_ARG"):
        self.errors.append((message, code))
        self.finished.set()

    def finish(self):
        self.finished.set()

    def cancelled(self):
        return self.cancel_after is not None and len(self.responses) >= self.cancel_after

    def tokens(self):
        return [t for outputs, _ in self.responses for t in outputs["output_ids"].reshape(-1).tolist()]
