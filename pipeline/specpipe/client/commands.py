"""``specpipe generate``: one request to a deployment, printed as it streams."""

from __future__ import annotations

import sys

from specpipe.client.chat import apply_chat_template, is_local_dir, tokenizer_dir_from_config
from specpipe.client.llm import GenerationRequest, LLMClient, run_sync
from specpipe.errors import SpecpipeError


async def _generate(url: str, model: str, request: GenerationRequest, chat: bool):
    async with LLMClient(url, model) as client:
        if chat:
            tokenizer_dir = tokenizer_dir_from_config(await client.model_config("preprocessing"))
            if not is_local_dir(tokenizer_dir):
                raise SpecpipeError(
                    f"--chat needs the deployment's tokenizer; its tokenizer_dir {tokenizer_dir!r} is not a "
                    f"directory on this machine: drop --chat and send the formatted prompt"
                )
            request = GenerationRequest(**{**request.__dict__, "prompt": apply_chat_template(request.prompt, tokenizer_dir)})

        def echo(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        return await client.generate(request, on_text=echo if request.stream else None)


def generate_command(*, url, model, prompt, max_tokens, stream, temperature, top_k, top_p, seed, chat, stats) -> None:
    """Send ``prompt``, print the text (streamed as it arrives with ``stream``) and optional stats.

    Raises:
        SpecpipeError: bad arguments, unreachable server, or the server's error for the request.
    """
    if not prompt:
        raise SpecpipeError("the prompt is empty: give some text to continue")
    request = GenerationRequest(
        prompt=prompt, max_tokens=max_tokens, stream=stream, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed,
    )
    result = run_sync(_generate(url, model, request, chat))
    if result.error:
        raise SpecpipeError(f"the server rejected the request: {result.error}")
    if not stream:
        sys.stdout.write(result.text)
    sys.stdout.write("\n")
    if stats:
        perf = result.perf
        print(
            f"[{perf.get('num_output_tokens', '?')} tokens in {result.latency_s * 1000:.0f} ms, "
            f"TTFT {1000 * (result.ttft_s or 0):.0f} ms, acceptance rate {perf.get('acceptance_rate', 0):.2f}, "
            f"draft tokens accepted {perf.get('total_accepted_draft_tokens', 0)}/{perf.get('total_draft_tokens', 0)}]",
            file=sys.stderr,
        )
