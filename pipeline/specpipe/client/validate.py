"""``specpipe validate``: is a deployment healthy, complete and faithful to its baseline?

Checks, each reported pass/fail:

* the server is live and ready and the ensemble is loaded;
* the ensemble exposes TensorRT-LLM's interface (names and datatypes);
* for each prompt, streamed and non-streamed greedy text are identical (streaming must not drop or
  duplicate text when several tokens are accepted in one step);
* with a baseline deployment (``--draft none``), greedy outputs are identical to the baseline's
  (speculative decoding must not change greedy output);
* perf outputs are present and consistent (acceptance rate in [0, 1], accepted <= proposed);
* a stop word ends the output before the stop word (nothing after it leaks out);
* a seeded sampling request is reproducible;
* a bad request (``max_tokens`` 0) gets an error response and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field

from specpipe.client.llm import GenerationResult, LLMClient, run_sync
from specpipe.client.probe import not_grpc_hint
from specpipe.client.request import GenerationRequest
from specpipe.generation.spec_metrics import decoding_steps

DEFAULT_PROMPTS = (
    "The three most important inventions of the nineteenth century were",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Countries and their capitals:\n1. France - Paris\n2. Germany - Berlin\n3. Italy - Rome\n4.",
)


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class RequestFigures:
    """One greedy request's acceptance figures.

    Attributes:
        prompt: the prompt's first 40 characters.
        output_tokens: tokens sent (``num_output_tokens``).
        acceptance_rate: accepted / proposed draft tokens, in [0, 1].
        accepted_draft_tokens, draft_tokens: the request's counters.
        mean_accepted_length: tokens per target decoding forward after the first token: ``(F - 1 + A) / (F - 1)``
            with the deployment's ``target_forwards`` F, else ``(N - 1) / (N - 1 - A)`` from the N tokens sent;
            1.0 without speculation or decoding forwards.
        target_forwards: F, or ``None`` where the deployment returns none (TensorRT-LLM).
        length_source: ``"target forwards"`` (exact) or ``"output tokens"`` (estimated).
        latency_ms: end-to-end latency, milliseconds.
    """

    prompt: str
    output_tokens: int
    acceptance_rate: float
    accepted_draft_tokens: int
    draft_tokens: int
    mean_accepted_length: float
    latency_ms: float
    target_forwards: int | None = None
    length_source: str = "output tokens"


@dataclass
class ValidationReport:
    url: str
    baseline_url: str | None
    checks: list[Check] = field(default_factory=list)
    requests: list[RequestFigures] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(passed), detail))
        return bool(passed)


def _figures(prompt: str, result: GenerationResult) -> RequestFigures:
    perf = result.perf
    out = int(perf.get("num_output_tokens", 0))
    accepted = int(perf.get("total_accepted_draft_tokens", 0))
    forwards = int(perf["target_forwards"]) if "target_forwards" in perf else None
    produced, steps = decoding_steps(out, accepted, forwards)
    mean_len = produced / steps if steps > 0 else 1.0
    return RequestFigures(
        prompt=prompt[:40].replace("\n", " "),
        output_tokens=out,
        acceptance_rate=float(perf.get("acceptance_rate", 0.0)),
        accepted_draft_tokens=accepted,
        draft_tokens=int(perf.get("total_draft_tokens", 0)),
        mean_accepted_length=mean_len,
        latency_ms=result.latency_s * 1000,
        target_forwards=forwards,
        length_source="output tokens" if forwards is None else "target forwards",
    )


def _interface_problems(metadata: dict) -> list[str]:
    from specpipe.triton.interface import ENSEMBLE

    problems = []
    for kind, expected in (("inputs", ENSEMBLE.inputs), ("outputs", ENSEMBLE.outputs)):
        served = {t["name"]: t["datatype"] for t in metadata.get(kind, [])}
        for tensor in expected:
            wire_type = "BYTES" if tensor.dtype == "STRING" else tensor.dtype
            if tensor.name not in served:
                problems.append(f"missing {kind[:-1]} {tensor.name}")
            elif served[tensor.name] != wire_type:
                problems.append(f"{tensor.name} is {served[tensor.name]}, expected {wire_type}")
    return problems


def _stop_word_for(text: str) -> tuple[str, int] | None:
    """A whole word of ``text`` (with its leading space) whose first occurrence is well inside it.

    Returns the stop word and the character index where the output must end, or ``None``.
    """
    for word in text.split(" ")[3:]:
        if not (word.isalpha() and len(word) >= 3):
            continue
        stop = " " + word
        index = text.find(stop)
        end = index + len(stop)
        if index >= 8 and (end == len(text) or not text[end].isalnum()):
            return stop, index
    return None


async def _run(url: str, baseline_url: str | None, model: str, max_tokens: int, prompts) -> ValidationReport:
    report = ValidationReport(url=url, baseline_url=baseline_url)
    async with LLMClient(url, model) as client:
        raw = client.raw
        try:
            live = await raw.is_server_live()
        except Exception as exc:
            report.add(
                "server live", False, await asyncio.to_thread(not_grpc_hint, url) or f"cannot reach {url}: {exc}"
            )
            return report
        report.add("server live", live)
        report.add("server ready", await raw.is_server_ready())
        if not report.add("model ready", await raw.is_model_ready(model), model):
            return report
        problems = _interface_problems(await raw.get_model_metadata(model, as_json=True))
        report.add("ensemble interface (TensorRT-LLM names, types)", not problems, "; ".join(problems) or "all present")

        greedy: dict[str, str] = {}
        for prompt in prompts:
            plain = await client.generate(GenerationRequest(prompt, max_tokens=max_tokens))
            streamed = await client.generate(GenerationRequest(prompt, max_tokens=max_tokens, stream=True))
            short = prompt[:30].replace("\n", " ")
            if plain.error or streamed.error:
                report.add(f"generate: {short!r}", False, plain.error or streamed.error)
                continue
            greedy[prompt] = plain.text
            report.add(
                f"streamed == non-streamed: {short!r}",
                streamed.text == plain.text,
                f"{len(streamed.chunks)} chunks"
                if streamed.text == plain.text
                else f"{streamed.text!r} != {plain.text!r}",
            )
            perf = plain.perf
            consistent = (
                {"acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens"} <= perf.keys()
                and 0.0 <= perf["acceptance_rate"] <= 1.0
                and perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]
                and 0 < perf.get("num_output_tokens", 1) <= max_tokens
            )
            report.add(f"perf outputs: {short!r}", consistent, json.dumps(perf))
            report.requests.append(_figures(prompt, plain))

        if baseline_url:
            async with LLMClient(baseline_url, model) as baseline:
                for prompt, text in greedy.items():
                    base = await baseline.generate(GenerationRequest(prompt, max_tokens=max_tokens))
                    short = prompt[:30].replace("\n", " ")
                    same = base.error is None and base.text == text
                    report.add(
                        f"greedy == baseline: {short!r}",
                        same,
                        base.error or ("identical" if same else f"{text!r} != {base.text!r}"),
                    )

        if greedy:
            prompt, text = next(iter(greedy.items()))
            found = _stop_word_for(text)
            if found:
                stop, end = found
                stopped = await client.generate(GenerationRequest(prompt, max_tokens=max_tokens, stop_words=(stop,)))
                ok = stopped.error is None and stopped.text == text[:end]
                report.add(
                    "stop word ends the output before it",
                    ok,
                    f"stop {stop!r}: {stopped.error or repr(stopped.text[-40:])}",
                )

        sampled = [
            await client.generate(GenerationRequest(prompts[0], max_tokens=16, temperature=0.8, top_p=0.9, seed=1234))
            for _ in range(2)
        ]
        report.add(
            "seeded sampling reproducible",
            all(s.error is None for s in sampled) and sampled[0].text == sampled[1].text,
            sampled[0].error or repr(sampled[0].text[:40]),
        )

        bad = await client.generate(GenerationRequest(prompts[0], max_tokens=4, top_p=1.5))
        after = await client.generate(GenerationRequest(prompts[0], max_tokens=4))
        report.add(
            "bad request rejected, server keeps serving",
            bad.error is not None and after.error is None,
            f"top_p=1.5 -> {bad.error!r}; next request {'ok' if after.error is None else after.error}",
        )
    return report


def validate(
    url: str, baseline_url: str | None = None, model: str = "ensemble", max_tokens: int = 48, prompts=DEFAULT_PROMPTS
) -> ValidationReport:
    """Run every check against the deployment at ``url`` (gRPC HOST:PORT); never raises for a failed check."""
    return run_sync(_run(url, baseline_url, model, max_tokens, tuple(prompts)))


def report_tables(report: ValidationReport) -> list:
    """The report as rich renderables: the checks, the per-request figures (if any), the verdict."""
    from rich.table import Table
    from rich.text import Text

    checks = Table(
        title=f"validation of {report.url}"
        + (f" against baseline {report.baseline_url}" if report.baseline_url else "")
    )
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail", overflow="fold", max_width=70)
    for check in report.checks:
        checks.add_row(check.name, "[green]pass[/green]" if check.passed else "[red]FAIL[/red]", check.detail)
    tables: list = [checks]
    if report.requests:
        figures = Table(title="per-request acceptance (greedy)")
        figures.add_column("prompt", no_wrap=True, max_width=24)
        for column in ("tokens", "accept", "acc/draft", "acc.len", "ms"):
            figures.add_column(column, justify="right", no_wrap=True)
        for r in report.requests:
            figures.add_row(
                r.prompt,
                str(r.output_tokens),
                f"{r.acceptance_rate:.2f}",
                f"{r.accepted_draft_tokens}/{r.draft_tokens}",
                f"{r.mean_accepted_length:.2f}",
                f"{r.latency_ms:.0f}",
            )
        tables.append(figures)
    tables.append(Text.from_markup("[green]PASSED[/green]" if report.passed else "[red]FAILED[/red]"))
    return tables


def report_json(report: ValidationReport) -> dict:
    """The report as one JSON-ready document, with the overall ``passed``."""
    return {**asdict(report), "passed": report.passed}
