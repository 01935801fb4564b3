"""The whole ``specpipe train-draft`` flow: target, corpus, training, and the files it writes."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import AutoModelForCausalLM, AutoTokenizer

from specpipe import heads_format
from specpipe.errors import SpecpipeError
from specpipe.heads_format import CONVERTER_LAYOUTS
from specpipe.models.fetch import ensure_target_checkpoint
from specpipe.models.heads import SHIPPED_FOLDERS
from specpipe.paths import cache_dir
from specpipe.presets import load_target
from specpipe.progress import console
from specpipe.runtime.cpu.drafters.eagle3_head import capture_layers
from specpipe.speculative import Method, entry_for, spec_of
from specpipe.training.config import CHECKPOINT_NAME, STYLED, TrainConfig
from specpipe.training.data import SAMPLE_TEMPERATURE, CorpusSpec, build_corpus
from specpipe.training.prompts import read_user_data
from specpipe.training.train import environment, train


@dataclass(frozen=True)
class TrainRequest:
    """Everything ``specpipe train-draft`` was asked to do.

    Attributes:
        target: target preset name or TOML path.
        method: ``eagle``, ``medusa`` or ``draft-model`` (a method the registry marks ``trainable``).
        data: extra data, a JSONL of prompts or a text file/folder, or ``None``.
        budget_minutes: training time budget (minutes, data preparation not counted).
        out_dir: output folder (``None``: ``heads/<target>/<method>``).
        seed: random seed (data order, initialisation).
        max_steps, schedule_steps: exact optimizer steps and learning-rate schedule steps (``None``: fitted
            to the budget).
        num_prompts, stdlib_tokens: built-in prompts and standard-library tokens (``None``: the defaults).
        self_instruct: requests for a user message sent to the target, whose usable replies become prompts
            (:mod:`specpipe.training.self_instruct`; ``None``: the default, 0).
        export_trtllm: also write the TensorRT-LLM converter layout.
        command: the command line recorded in ``recipe.json`` (``""``: rebuilt from the fields).
        style: EAGLE head style, ``eagle1`` or ``eagle3`` (EAGLE-3: fused low/mid/top features, training-time
            test; its corpus features include the captured layers).
        resume: require the interrupted run's checkpoint in the output folder.
        sampled_answers: extra answers per built-in prompt sampled from the target (``None``: 0).
        overrides: further :class:`TrainConfig` fields (``eval_every``, ``patience``, ``checkpoint_every``,
            ``unroll`` ...; ``None`` values are ignored).
    """

    target: str
    method: str
    data: Path | None = None
    budget_minutes: float = 12.0
    out_dir: Path | None = None
    seed: int = 0
    max_steps: int | None = None
    schedule_steps: int | None = None
    num_prompts: int | None = None
    stdlib_tokens: int | None = None
    self_instruct: int | None = None
    export_trtllm: bool = True
    command: str = ""
    style: str = "eagle1"
    resume: bool = False
    sampled_answers: int | None = None
    overrides: dict | None = None


def train_draft(request: TrainRequest) -> Path:
    """The whole ``specpipe train-draft`` flow: load the target, build (or reuse) the corpus, train,
    evaluate, and write the compact file, ``recipe.json`` and the TensorRT-LLM converter layout.

    Returns:
        the output folder.

    Raises:
        SpecpipeError: unknown target, bad budget/steps, empty data, unwritable output.
    """
    method, data, budget_minutes, seed = request.method, request.data, request.budget_minutes, request.seed
    num_prompts, stdlib_tokens, command = request.num_prompts, request.stdlib_tokens, request.command
    cfg = TrainConfig.defaults_for(
        method,
        budget_minutes=budget_minutes,
        max_steps=request.max_steps,
        seed=seed,
        schedule_steps=request.schedule_steps,
        style=request.style,
        **(request.overrides or {}),
    )
    preset = load_target(request.target)
    styled = Method(method) in STYLED
    folder = "eagle3" if cfg.style == "eagle3" else entry_for(SHIPPED_FOLDERS, method, "models.heads.SHIPPED_FOLDERS")
    out_dir = Path(request.out_dir) if request.out_dir else Path("heads") / preset.name / folder
    if data:
        read_user_data(Path(data))  # fail on missing, empty or malformed data before writing anything
    spec = CorpusSpec(seed=seed, user_data=str(Path(data).resolve()) if data else None)
    if num_prompts is not None:
        spec = CorpusSpec(**{**spec.__dict__, "num_prompts": num_prompts})
    if stdlib_tokens is not None:
        spec = CorpusSpec(**{**spec.__dict__, "stdlib_tokens": stdlib_tokens})
    if request.self_instruct is not None:
        spec = CorpusSpec(**{**spec.__dict__, "self_instruct": request.self_instruct})
    if request.sampled_answers is not None:
        spec = CorpusSpec(**{**spec.__dict__, "sampled_answers": request.sampled_answers})
    if not (spec.num_prompts or spec.stdlib_tokens or spec.self_instruct or data):
        raise SpecpipeError(
            "the training corpus would be empty (--num-prompts 0, --stdlib-tokens 0, no --self-instruct, "
            "no --data): keep the built-in prompts or text, or add --self-instruct N or --data"
        )
    if request.resume and not (out_dir / CHECKPOINT_NAME).is_file():
        raise SpecpipeError(
            f"--resume: {out_dir} holds no checkpoint of an interrupted run: check --out, or leave out "
            "--resume to start afresh"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecpipeError(
            f"cannot create output folder {out_dir} ({exc.strerror}): choose another with --out"
        ) from exc

    torch.set_num_threads(min(torch.get_num_threads(), 2) or 1)
    model_dir = ensure_target_checkpoint(preset)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    layers = capture_layers(target.config.num_hidden_layers) if cfg.style == "eagle3" else ()

    started = time.time()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bars:

        def factory(description: str, total: int):
            task_id = bars.add_task(description, total=total, info="")
            return lambda n: bars.advance(task_id, n)

        features = build_corpus(
            target, tokenizer, model_dir, spec, cache_dir() / "training" / preset.name, factory, capture_layers=layers
        )
        train_id = bars.add_task(
            f"Training {method} {cfg.style if styled else ''} ({cfg.budget_minutes:g} min budget)", total=None, info=""
        )

        def on_step(step: int, total: int, info: dict[str, float]) -> None:
            bars.update(train_id, completed=step, total=total, info=f"loss {info['loss']:.3f}")

        end_ids = tuple(i for i in (tokenizer.eos_token_id,) if i is not None)
        result = train(target, features, cfg, out_dir, end_ids=end_ids, progress=on_step, resume=request.resume)

    meta = {**result.meta, "target": preset.name}
    heads_format.save_compact(out_dir, method, result.tensors, meta)
    if request.export_trtllm:
        layout = out_dir / "trtllm"
        if cfg.style == "eagle3":
            heads_format.write_eagle3_layout(layout, result.tensors, result.meta, target)
        elif spec_of(method).weights == "heads":  # a draft model's layout is the checkpoint the build rebuilds
            entry_for(CONVERTER_LAYOUTS, method, "heads_format.CONVERTER_LAYOUTS")(
                layout, result.tensors, result.meta, target
            )
    recipe = {
        "command": command
        or (
            f"specpipe train-draft --target {preset.name} --method {method} --budget {budget_minutes:g} "
            f"--seed {seed}" + (f" --style {cfg.style}" if styled else "")
        ),
        "reproduce_exactly": f"add --max-steps {result.steps} --schedule-steps {result.meta['schedule_steps']} (same seed, same corpus)",
        "target": preset.name,
        "method": method,
        "style": cfg.style if styled else None,
        "seed": seed,
        "steps": result.steps,
        "train_seconds": result.train_seconds,
        "wall_seconds_total": round(time.time() - started, 1),
        "config": asdict(cfg),
        "data": {
            **spec.__dict__,
            "positions": len(features),
            "answer_positions": int(features.is_answer.sum()),
            "sources": [
                "CPython standard library .py files (Python Software Foundation License), "
                f"{spec.stdlib_tokens} tokens in {spec.chunk_len}-token chunks",
                f"{spec.num_prompts} built-in prompts (specpipe.training.data) in the target's chat template, "
                f"answered by the target (greedy, up to {spec.max_new_tokens} tokens)",
            ]
            + (
                [
                    f"{spec.sampled_answers} more answers per built-in prompt sampled from the target (temperature "
                    f"{SAMPLE_TEMPERATURE}, seed {spec.seed})"
                ]
                if spec.sampled_answers
                else []
            )
            + (
                [
                    f"{spec.self_instruct} requests for a user message answered by the target (sampled, seed "
                    f"{spec.seed}; specpipe.training.self_instruct), its usable replies as prompts, answered like the "
                    "built-in ones"
                ]
                if spec.self_instruct
                else []
            )
            + ([f"user data {spec.user_data}"] if spec.user_data else []),
        },
        "heldout_metrics": result.metrics,
        "loss_history": result.history,
        "environment": environment(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    (out_dir / heads_format.RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    (out_dir / CHECKPOINT_NAME).unlink(missing_ok=True)
    console.print(
        f"[green]✓[/green] {method} for {preset.name}: {result.steps} steps in {result.train_seconds:.0f} s; "
        f"held-out {json.dumps(result.metrics)}; wrote {out_dir}"
    )
    return out_dir
