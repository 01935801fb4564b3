"""``specpipe generate`` as a library call: one request to a deployment, text streamed to a callback."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from specpipe.client.chat import apply_chat_template, is_local_dir, tokenizer_dir_from_config
from specpipe.client.llm import GenerationResult, LLMClient, run_sync
from specpipe.client.request import GenerationRequest
from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class GenerateJob:
    """One prompt for one deployment.

    Attributes:
        url: Triton gRPC endpoint ``HOST:PORT``.
        model: the Triton model to call (the ``ensemble``).
        request: the prompt and its sampling settings (``max_tokens`` in tokens, ``stream``, ...).
        chat: wrap the prompt in the deployment's chat template (its tokenizer must be on this machine).
    """

    url: str
    request: GenerationRequest
    model: str = "ensemble"
    chat: bool = False


async def _generate(job: GenerateJob, on_text: Callable[[str], None] | None) -> GenerationResult:
    request = job.request
    async with LLMClient(job.url, job.model) as client:
        if job.chat:
            tokenizer_dir = tokenizer_dir_from_config(await client.model_config("preprocessing"))
            if not is_local_dir(tokenizer_dir):
                raise SpecpipeError(
                    f"--chat needs the deployment's tokenizer; its tokenizer_dir {tokenizer_dir!r} is not a "
                    f"directory on this machine: drop --chat and send the formatted prompt"
                )
            request = dataclasses.replace(request, prompt=apply_chat_template(request.prompt, tokenizer_dir))
        return await client.generate(request, on_text=on_text if request.stream else None)


def generate(job: GenerateJob, on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Send ``job``'s prompt; with ``request.stream`` each piece of text goes to ``on_text`` as it arrives.

    Raises:
        SpecpipeError: an empty prompt, an unreachable server, a connection lost mid-request, or the
            server's error for the request.
    """
    if not job.request.prompt:
        raise SpecpipeError("the prompt is empty: give some text to continue")
    result = run_sync(_generate(job, on_text))
    if result.connection_lost:
        count = len(result.chunks)
        received = f" after {count} chunk{'s' if count != 1 else ''} of text" if count else ""
        raise SpecpipeError(
            f"lost the connection to {job.url}{received} ({result.error}): the server stopped or "
            f"cannot be reached; check that it is running (`specpipe serve` prints its log's path)"
        )
    if result.error:
        raise SpecpipeError(f"the server rejected the request: {result.error}")
    return result
