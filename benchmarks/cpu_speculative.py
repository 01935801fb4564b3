"""At batch 1, how fast does each of specpipe's CPU speculative methods decode against plain decoding
and against transformers' assisted generation and prompt lookup (and, optionally, llama.cpp and EAGLE
served through Triton)?

Every method decodes the same chat-formatted prompts of the default model (SmolLM2-135M-Instruct)
greedily (128 new tokens, batch 1, 2 threads), timed per prompt and interleaved so that machine noise
hits all methods alike:

* in process (specpipe's CPU engine, each built from its preset as a deployment is): baseline, n-gram
  prompt lookup, distilled draft model, Medusa tree, EAGLE tree (static ``eagle_choices``), EAGLE-2
  dynamic tree;
* peers in the same run: transformers' ``generate`` (plain), assisted generation with the same
  distilled draft model, and prompt lookup decoding;
* ``llama-cpp`` (optional): plain greedy decoding through llama-cpp-python on an f32 GGUF of the same
  checkpoint (setup in ``plain_step.py``);
* ``--triton``: EAGLE built, packaged and served by specpipe, through gRPC.

For each method: tokens/s per prompt and overall (total tokens / total seconds), mean accepted length
(tokens per decoding target forward), and whether its output equals the baseline's token for token;
ratios against the baseline and the issue's targets are in ``summary``. The JSON is written after every
prompt. It takes tens of minutes on 2 cores; run it on an otherwise idle machine::

    PYTHONPATH=pipeline python benchmarks/cpu_speculative.py --out benchmarks/results/cpu_speculative.json [--prompts 24]
        [--methods baseline,ngram,draft,medusa,eagle,eagle-dynamic,hf,hf-assisted,hf-lookup,llama-cpp] [--triton]
        [--gguf smollm2-f32.gguf | --llama-convert path/to/llama.cpp]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

PROMPTS: list[tuple[str, str]] = [
    ("chat", "What should I consider when adopting a dog?"),
    ("chat", "How can I improve my handwriting?"),
    ("chat", "Why is the sky blue? Explain it to a ten-year-old."),
    ("chat", "What are good habits for a software developer?"),
    ("chat", "Tell me about the history of chess."),
    ("chat", "How do airplanes stay in the air?"),
    ("code", "Write a Python function that checks whether two strings are anagrams."),
    ("code", "Write a Python class for a simple bank account with deposit and withdraw methods."),
    ("code", "Write a Python function that returns the second largest number in a list."),
    ("code", "Add type hints and a docstring to this function:\n\ndef area(w, h):\n    return w * h"),
    (
        "code",
        "Explain what this code does:\n\nfor i in range(1, 16):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)",
    ),
    ("code", "Write a SQL query that selects the ten most recent orders from a table named orders."),
    (
        "summary",
        "Summarize in 3 sentences: The Great Barrier Reef is the world's largest coral reef system, "
        "composed of over 2,900 individual reefs and 900 islands stretching over 2,300 kilometres. "
        "It is located in the Coral Sea, off the coast of Queensland, Australia. The reef can be seen "
        "from outer space and is the world's biggest single structure made by living organisms. It "
        "supports a wide diversity of life and was selected as a World Heritage Site in 1981. Climate "
        "change, pollution and fishing threaten its health, and mass coral bleaching events have "
        "become more frequent.",
    ),
    (
        "summary",
        "Summarize this paragraph: Bicycles were introduced in the 19th century in Europe. By the early "
        "21st century there were more than one billion in use. They are the principal means of "
        "transport in many regions. Bicycles also provide a popular form of recreation and have been "
        "adapted for use as children's toys, fitness equipment, military uses and racing.",
    ),
    (
        "summary",
        "Give a one-paragraph summary: Tea is an aromatic beverage prepared by pouring hot water over "
        "cured leaves of the tea plant. After water, it is the most widely consumed drink in the world. "
        "Tea originated in southwest China, where it was used as a medicinal drink, and it spread to "
        "the rest of the world through trade.",
    ),
    (
        "summary",
        "Summarize the main idea: Regular physical activity improves mood, sleep and energy. It lowers "
        "the risk of heart disease and diabetes and helps to keep a healthy weight. Adults are advised "
        "to do at least 150 minutes of moderate activity each week.",
    ),
    ("list", "List 10 animals that live in the desert."),
    ("list", "Give me a list of 8 easy dinner recipes."),
    ("list", "Continue the list: 1. Mercury 2. Venus 3. Earth"),
    ("list", "List the days of the week and one activity for each day."),
    ("list", "Name 10 programming concepts every beginner should learn."),
    ("list", "List 7 tips for saving energy at home."),
    ("chat", "Explain the difference between weather and climate."),
    ("code", "Write a Python function that converts a Roman numeral to an integer."),
]


def load(target_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    return tok, model


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


#: Benchmark method -> (draft preset, ``[cpu]`` overrides). Every engine is built from its preset by
#: ``specpipe build --runtime cpu`` and loaded by the CPU loader, as a deployed engine is.
ENGINE_PRESETS: dict[str, tuple[str, dict]] = {
    "baseline": ("none", {}),
    "ngram": ("ngram", {}),
    "draft": ("smollm2-draft", {}),
    "medusa": ("medusa", {}),
    "eagle": ("eagle", {}),
    # EAGLE-2's dynamic tree: the eagle preset with a dynamic [cpu] table (12 nodes, top-3, depth 5).
    "eagle-dynamic": ("eagle", {"dynamic_tree": True, "dynamic_top_k": 3, "dynamic_depth": 5, "max_draft_len": 12}),
}
TARGET = "smollm2-135m"


def _draft_preset(name: str, cpu_overrides: dict, folder: Path) -> str:
    """The draft preset to build with: its name, or a TOML file of a CPU-only variant of it whose ``[cpu]``
    table has ``cpu_overrides`` applied (the build reads only ``kind`` and ``[cpu]`` for EAGLE/Medusa)."""
    if not cpu_overrides:
        return name
    from specpipe.presets import load_draft

    preset = load_draft(name)
    cpu = {**preset.extra.get("cpu", {}), **cpu_overrides}
    lines = [
        f'name = "{name}-bench"',
        f'kind = "{preset.kind}"',
        f'description = "{name}, benchmark variant"',
        "",
        "[cpu]",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in cpu.items()]  # ints, bools, lists: TOML = JSON
    path = folder / f"{name}-bench.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def build_engines(methods: list[str], prepack: bool = True):
    """In-process engines by method name: each built from its draft preset (:data:`ENGINE_PRESETS`) into a
    temporary engines folder and loaded by ``specpipe.runtime.cpu.loader``, exactly as a deployed engine.
    With ``prepack`` (the loader's default) linear layers are prepacked; the transformers peers then run
    on a prepacked target and draft too, so the comparison measures the methods, not the kernels.

    Returns:
        (engines by method, extras: ``draft_model`` for assisted generation when asked for).
    """
    import atexit
    import shutil
    import tempfile

    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest
    from specpipe.runtime.cpu.loader import load_engine

    folder = Path(tempfile.mkdtemp(prefix="specpipe-bench-engines-"))  # rebuilt from the presets each run
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    wanted = [m for m in ENGINE_PRESETS if m in methods or (m == "draft" and "hf-assisted" in methods)]
    engines, extra = {}, {}
    for method in wanted:
        preset, overrides = ENGINE_PRESETS[method]
        request = BuildRequest(
            target=TARGET, draft=_draft_preset(preset, overrides, folder), name=method, engines_dir=folder / "engines"
        )
        engine, _ = load_engine(build_cpu(request), prepack=prepack)
        if method in methods:
            engines[method] = engine
        if method == "draft":
            extra["draft_model"] = engine.drafter.lm.model
    return engines, extra


def run_engine(engine, ids: list[int], max_tokens: int):
    from specpipe.generation.api import SamplingParams
    from specpipe.runtime.cpu.scheduler.one_request import generate_all, solo_scheduler

    scheduler = solo_scheduler(engine)
    t0 = time.perf_counter()
    tokens, stats = generate_all(scheduler, ids, SamplingParams(max_tokens=max_tokens))
    seconds = time.perf_counter() - t0
    return tokens, seconds, stats.mean_accepted_length


def run_llama(llm, ids: list[int], max_tokens: int, eos: int):
    from plain_step import generate_greedy

    t0 = time.perf_counter()
    tokens = generate_greedy(llm, ids, max_tokens, eos)
    return tokens, time.perf_counter() - t0, 1.0


def run_hf(target, ids: list[int], max_tokens: int, eos: int, **kwargs):
    input_ids = torch.tensor([ids])
    forwards = [0]
    hook = target.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
                **kwargs,
            )
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    tokens = out[0, len(ids) :].tolist()
    if tokens and tokens[-1] == eos:
        tokens = tokens[:-1]
    decode_forwards = max(1, forwards[0] - 1)
    return tokens, seconds, len(tokens) / decode_forwards if forwards[0] > 1 else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu_speculative.json"))
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--methods", default="baseline,ngram,draft,medusa,eagle,eagle-dynamic,hf,hf-assisted,hf-lookup")
    parser.add_argument("--triton", action="store_true", help="also measure EAGLE through Triton + gRPC")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-prepack", action="store_true", help="plain nn.Linear everywhere (A/B of the prepacked kernels)"
    )
    parser.add_argument(
        "--gguf", type=Path, default=None, help="llama-cpp: the f32 GGUF of the target (made when missing)"
    )
    parser.add_argument(
        "--llama-convert",
        type=Path,
        default=None,
        help="llama-cpp: llama.cpp source folder with convert_hf_to_gguf.py and gguf-py/, to make --gguf",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from specpipe.models.fetch import ensure_target_checkpoint
    from specpipe.presets import load_target

    target_dir = ensure_target_checkpoint(load_target(TARGET))
    tok, target = load(target_dir)
    eos = tok.eos_token_id
    methods = [m for m in args.methods.split(",") if m]
    engines, extra = build_engines(methods, prepack=not args.no_prepack)
    if "llama-cpp" in methods:
        from plain_step import load_llama

        gguf = args.gguf or Path("/tmp/specpipe-bench/smollm2-135m-f32.gguf")
        extra["llama"] = load_llama(target_dir, gguf, args.llama_convert, threads=args.threads)
    if not args.no_prepack:  # the transformers peers run on prepacked layers too
        from specpipe.runtime.cpu.model.prepack import prepack_linear_layers

        prepack_linear_layers(target)
    prompts = PROMPTS[: args.prompts]

    triton = None
    if args.triton:
        triton = start_triton()

    results: dict[str, list[dict]] = {m: [] for m in [*methods, *(["eagle-triton"] if triton else [])]}
    warm = chat_ids(tok, "Hello!")
    for method in methods:  # warm-up: first calls allocate and pick kernels
        if method in engines:
            run_engine(engines[method], warm, 8)
        elif method == "llama-cpp":
            run_llama(extra["llama"], warm, 8, eos)
        else:
            run_hf(
                target,
                warm,
                8,
                eos,
                **(
                    {"assistant_model": extra["draft_model"]}
                    if method == "hf-assisted"
                    else {"prompt_lookup_num_tokens": 5}
                    if method == "hf-lookup"
                    else {}
                ),
            )
    for index, (category, text) in enumerate(prompts):
        ids = chat_ids(tok, text)
        for method in methods:
            if method in engines:
                tokens, seconds, mal = run_engine(engines[method], ids, args.max_tokens)
            elif method == "hf":
                tokens, seconds, mal = run_hf(target, ids, args.max_tokens, eos)
            elif method == "hf-assisted":
                tokens, seconds, mal = run_hf(target, ids, args.max_tokens, eos, assistant_model=extra["draft_model"])
            elif method == "hf-lookup":
                tokens, seconds, mal = run_hf(target, ids, args.max_tokens, eos, prompt_lookup_num_tokens=5)
            elif method == "llama-cpp":
                tokens, seconds, mal = run_llama(extra["llama"], ids, args.max_tokens, eos)
            else:
                raise SystemExit(f"unknown method {method}")
            results[method].append(
                {
                    "prompt": index,
                    "category": category,
                    "tokens": tokens,
                    "seconds": round(seconds, 4),
                    "tokens_per_s": round(len(tokens) / seconds, 3),
                    "mean_accepted_length": round(mal, 4),
                }
            )
        if triton:
            results["eagle-triton"].append(run_triton(triton, tok, text, args.max_tokens, index, category))
        line = "  ".join(f"{m} {results[m][-1]['tokens_per_s']:.1f}" for m in results)
        print(f"[{index + 1}/{len(prompts)}] {category:8s} {line}", flush=True)
        report = summarize(results, tok, args)  # written after every prompt: an interrupted run keeps its results
        report["setup"]["prompts_planned"] = len(prompts)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if triton:
        triton["stack"].close()
    print(json.dumps(report["summary"], indent=2))


def start_triton() -> dict:
    """Build, package and serve EAGLE for the CPU runtime (specpipe's own pipeline)."""
    from contextlib import ExitStack

    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest
    from specpipe.serve.local import LocalTritonServer
    from specpipe.triton.repository import package_engine

    engines_dir, repo_dir = Path("/tmp/specpipe-bench/engines"), Path("/tmp/specpipe-bench/triton_repo")
    engine = build_cpu(BuildRequest(target=TARGET, draft="eagle", engines_dir=engines_dir))
    repo = package_engine(engine, repo_dir / engine.name)
    stack = ExitStack()
    server = stack.enter_context(LocalTritonServer(repo, grpc_port=8731, http_port=8730, metrics_port=8732))
    server.wait_ready(timeout_s=600)
    return {"stack": stack, "url": server.grpc_url}


def run_triton(triton: dict, tok, text: str, max_tokens: int, index: int, category: str) -> dict:
    from specpipe.client.llm import LLMClient, run_sync
    from specpipe.client.request import GenerationRequest

    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)

    async def go():
        async with LLMClient(triton["url"]) as client:
            return await client.generate(GenerationRequest(prompt=prompt, max_tokens=max_tokens))

    result = run_sync(go())
    if result.error:
        raise SystemExit(f"Triton request failed: {result.error}")
    tokens = tok(result.text, add_special_tokens=False)["input_ids"]
    perf = result.perf
    accepted = perf.get("total_accepted_draft_tokens", 0)
    return {
        "prompt": index,
        "category": category,
        "text": result.text,
        "tokens": tokens,
        "seconds": round(result.latency_s, 4),
        "tokens_per_s": round(len(tokens) / result.latency_s, 3),
        "accepted_draft_tokens": accepted,
    }


def llama_cpp_targets(summary: dict, spec: list[str]) -> dict:
    """The issue's llama.cpp targets, where llama.cpp was measured: our plain decoding within 1.2x of
    llama.cpp's time per token, and the best speculative method faster than llama.cpp's plain decoding."""
    if "llama-cpp" not in summary:
        return {}
    llama = summary["llama-cpp"]["tokens_per_s"]
    targets = {}
    if "baseline" in summary:
        targets["plain decoding within 1.2x of llama.cpp (llama.cpp tok/s / baseline tok/s <= 1.2)"] = round(
            llama / summary["baseline"]["tokens_per_s"], 3
        )
    if spec:
        best = max(spec, key=lambda m: summary[m]["tokens_per_s"])
        targets[f"best speculative ({best}) faster than llama.cpp plain (ratio > 1)"] = round(
            summary[best]["tokens_per_s"] / llama, 3
        )
    return targets


def summarize(results: dict[str, list[dict]], tok, args) -> dict:
    baseline = results.get("baseline") or results.get("hf")
    base_text = [tok.decode(r["tokens"]) for r in baseline]
    summary = {}
    for method, rows in results.items():
        total_tokens = sum(len(r["tokens"]) for r in rows)
        total_seconds = sum(r["seconds"] for r in rows)
        if method == "eagle-triton":
            identical = [r["text"] == base_text[i] for i, r in enumerate(rows)]
        else:
            identical = [r["tokens"] == baseline[i]["tokens"] for i, r in enumerate(rows)]
        summary[method] = {
            "tokens_per_s": round(total_tokens / total_seconds, 3),
            "median_prompt_tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 3),
            "mean_accepted_length": round(statistics.mean(r.get("mean_accepted_length", 0) or 0 for r in rows), 3),
            "identical_to_baseline": f"{sum(identical)}/{len(identical)}",
        }
    base = summary["baseline"]["tokens_per_s"] if "baseline" in summary else summary["hf"]["tokens_per_s"]
    for method in summary:
        summary[method]["speedup_vs_baseline"] = round(summary[method]["tokens_per_s"] / base, 3)
    spec = [m for m in summary if m in ("ngram", "draft", "medusa", "eagle", "eagle-dynamic")]
    peers = [m for m in summary if m in ("hf-assisted", "hf-lookup")]
    targets = llama_cpp_targets(summary, spec)
    ratio = lambda m: summary[m]["speedup_vs_baseline"] if m in summary else None  # noqa: E731
    targets["eagle >= 1.6x baseline"] = ratio("eagle")
    targets["medusa >= 1.3x baseline"] = ratio("medusa")
    targets["draft model >= 1.2x baseline"] = ratio("draft")
    if spec and peers:
        best_spec = max(spec, key=lambda m: summary[m]["tokens_per_s"])
        best_peer = max(peers, key=lambda m: summary[m]["tokens_per_s"])
        targets[f"best speculative ({best_spec}) >= 1.3x best transformers ({best_peer})"] = round(
            summary[best_spec]["tokens_per_s"] / summary[best_peer]["tokens_per_s"], 3
        )
    if "eagle-triton" in summary and "eagle" in summary:
        targets["eagle via Triton within 10% of in-process"] = round(
            summary["eagle-triton"]["tokens_per_s"] / summary["eagle"]["tokens_per_s"], 3
        )
    import transformers

    return {
        "setup": {
            "model": "SmolLM2-135M-Instruct (fp32)",
            "prompts": len(baseline),
            "max_new_tokens": args.max_tokens,
            "greedy": True,
            "batch": 1,
            "threads": args.threads,
            "linear_layers": "nn.Linear"
            if args.no_prepack
            else "oneDNN prepacked fp32 (specpipe and transformers alike)",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        },
        "summary": summary,
        "targets": targets,
        "per_prompt": {
            m: [{k: v for k, v in r.items() if k not in ("tokens", "text")} for r in rows]
            for m, rows in results.items()
        },
    }


if __name__ == "__main__":
    main()
