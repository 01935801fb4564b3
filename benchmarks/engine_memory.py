"""How much resident memory does a CPU engine's model process hold once it has served requests, against
its weight files?

Each engine runs in a fresh process, which loads it, builds the serving scheduler (8 cache slots, the
argmax screen, the measured cost curve), then serves ``--prompts`` chat prompts (``specpipe bench
--chat``'s) at ``--concurrency`` with greedy ``--tokens``-token answers, as the Triton model does. It
reports ``/proc/self/status`` (``VmRSS``, ``RssAnon``, ``RssFile``) after ``import`` (torch,
transformers, specpipe), when ready and after serving; ``kv_cache_mib`` is the KV cache's size after
serving (8 slots, grown by doubling to the longest request); ``weight_files_mib`` is the size of the
engine's ``*.safetensors`` files and ``ratio`` the served ``VmRSS`` over it. Resident memory does not
depend on the machine's load, so the processes run one after another::

    PYTHONPATH=pipeline:benchmarks python benchmarks/engine_memory.py engines/smollm2-135m-none \\
        [--prompts 8] [--concurrency 4] [--tokens 128] [--out benchmarks/results/engine_memory.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path

MiB = 2**20


def status_mib() -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``RssFile`` of this process, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) // 1024
    return fields


def child(engine_dir: Path, prompts: int, concurrency: int, tokens: int) -> dict:
    import torch

    torch.set_num_threads(2)
    from adaptive_interleaved import Lane, chat_prompt_ids, run_level
    from transformers import AutoTokenizer

    from specpipe.generation.api import SamplingParams
    from specpipe.runtime.cpu.loader import load_engine
    from specpipe.runtime.cpu.scheduler.scheduler import BatchScheduler

    record = {"imported": status_mib()}
    engine, manifest = load_engine(engine_dir)
    scheduler = BatchScheduler(engine, max_batch_size=8)
    embedding = engine.target.model.get_input_embeddings().weight
    record["ready"] = status_mib()
    prompt_ids = chat_prompt_ids(AutoTokenizer.from_pretrained(engine_dir / manifest.target.path), "chat")
    run_level([Lane(manifest.name, scheduler)], prompt_ids, concurrency, prompts, SamplingParams(max_tokens=tokens))
    record["served"] = status_mib()
    record["kv_cache_mib"] = round(2 * scheduler.lm.keys.numel() * 4 / MiB, 1)
    record["embedding_mib"] = round(embedding.numel() * embedding.element_size() / MiB, 1)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        record = child(args.engines[0], args.prompts, args.concurrency, args.tokens)
        print("RESULT " + json.dumps(record), flush=True)
        return
    results = []
    for engine_dir in args.engines:
        weight_files = sum(p.stat().st_size for p in engine_dir.rglob("*.safetensors")) / MiB
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                str(engine_dir),
                "--child",
                "--prompts",
                str(args.prompts),
                "--concurrency",
                str(args.concurrency),
                "--tokens",
                str(args.tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        record = {"engine": engine_dir.name, "weight_files_mib": round(weight_files, 1), **json.loads(line[7:])}
        record["ratio"] = round(record["served"]["VmRSS"] / weight_files, 2)
        print(json.dumps(record), flush=True)
        results.append(record)
    report = {
        "command": shlex.join(["python", *sys.argv]),
        "date": date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "prompts": args.prompts,
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
