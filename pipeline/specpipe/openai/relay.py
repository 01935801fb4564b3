"""One running ensemble request as the gateway reads it: text after the stop strings, the HTTP
client watched for disconnection, cancellation of the Triton request (see :mod:`specpipe.openai.server`)."""

from __future__ import annotations

import asyncio

from specpipe.client.llm import GenerationResult
from specpipe.client.request import GenerationRequest
from specpipe.errors import SpecpipeError
from specpipe.openai.protocol import usage
from specpipe.openai.stops import StopStrings

#: How often a waiting handler checks that its HTTP client is still connected, seconds.
DISCONNECT_POLL_S = 0.2


class Generation:
    """One running ensemble request: its text after the stop strings, read while watching the client.

    The request runs as a task; :meth:`next` returns the next released text (``None`` at the end).
    A completed stop string ends the request, and a closed HTTP transport cancels the task: either way
    the client cancels the gRPC stream and stops the engine request (:meth:`~specpipe.client.llm.LLMClient.stop`).
    ``count_tokens`` (text -> its token count, the deployment's tokenizer) gives :meth:`usage` the tokens
    of the text sent when a stop string ended it.
    """

    def __init__(self, client, request: GenerationRequest, stops: tuple[str, ...], http_request, count_tokens=None):
        self.stops = StopStrings(stops)
        self.sent, self.count_tokens = "", count_tokens
        self.http = http_request
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(client.generate(request, on_text=self._on_text))
        self.task.add_done_callback(lambda _: self.queue.put_nowait(None))
        self._ended = False

    def _on_text(self, text: str) -> bool:
        released = self.stops.feed(text)
        self.sent += released
        if released:
            self.queue.put_nowait(released)
        return self.stops.stopped

    async def next(self) -> str | None:
        """The next non-empty released text, or ``None`` when the request ended.

        Raises:
            ConnectionResetError: the HTTP client disconnected (the request was cancelled).
        """
        if self._ended:
            return None
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                transport = self.http.transport
                if transport is None or transport.is_closing():
                    self.cancel()
                    raise ConnectionResetError("the HTTP client disconnected") from None
                continue
            if item is None:
                self._ended = True
                tail = self.stops.flush()
                self.sent += tail
                return tail or None
            return item

    def result(self) -> GenerationResult:
        """The finished request's result (an ``UNAVAILABLE`` error when Triton could not be asked)."""
        try:
            return self.task.result()
        except SpecpipeError as exc:
            return GenerationResult(error=f"UNAVAILABLE: {exc}")

    def usage(self, perf: dict[str, float]) -> dict[str, int]:
        """OpenAI ``usage`` of the finished request. After a stop string the engine has decoded past it
        (the rest of its speculative step, and steps until the stop reached it, which vary from run to
        run): ``completion_tokens`` is then the token count of the text sent, at most the engine's."""
        used = usage(perf)
        if self.stops.stopped and self.count_tokens is not None:
            completion = min(used["completion_tokens"], self.count_tokens(self.sent))
            used.update(completion_tokens=completion, total_tokens=used["prompt_tokens"] + completion)
        return used

    def cancel(self) -> None:
        """Cancel the request if it is still running (the client cancels its gRPC stream and engine request)."""
        if not self.task.done():
            self.task.cancel()
