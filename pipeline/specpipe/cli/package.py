"""``specpipe package``: an engine (or a dry-run plan) -> a Triton model repository."""

from __future__ import annotations

from pathlib import Path

import click

from specpipe.cli.options import engines_dir_option, repo_dir_option
from specpipe.progress import result
from specpipe.triton.models.common import DRAFT_LENGTHS


@click.command()
@click.argument("name", required=False)
@engines_dir_option()
@repo_dir_option()
@click.option(
    "--from-plan",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Package a plan (build --dry-run --json) instead of a built engine.",
)
@click.option("--name", "plan_name", default=None, help="Repository name with --from-plan.")
@click.option(
    "--dense-rows",
    default="auto",
    show_default=True,
    callback=lambda ctx, param, value: _dense_rows(value),
    help="CPU runtime: inputs of at most this many rows use dense weight copies instead of the packed "
    "kernels ('auto': packed only with MKL's packed GEMM, else measured at load; 'all': dense weights "
    "only; 0: packed only; 'all' and 0 keep one copy of the weights).",
)
@click.option(
    "--draft-lengths",
    type=click.Choice(DRAFT_LENGTHS),
    default=DRAFT_LENGTHS[0],
    show_default=True,
    help="CPU runtime: 'adaptive' chooses each request's draft length every step on the forward cost measured "
    "at load; 'max' drafts max_draft_len (the whole tree) every step, as TensorRT-LLM does, and measures nothing.",
)
@click.option(
    "--warm-up/--no-warm-up",
    default=True,
    show_default=True,
    help="CPU runtime: serve warm-up requests before the model reports ready (without: ready sooner, the first "
    "requests slower).",
)
def package(name, engines_dir, repo_dir, from_plan, plan_name, dense_rows, draft_lengths, warm_up) -> None:
    """Write the Triton model repository triton_repo/NAME/ for engine NAME (CPU, TensorRT-LLM engine or LLM API)."""
    from specpipe.build_common import is_engine_name
    from specpipe.triton.repository import package_engine, package_plan

    for given in (name, plan_name):
        if given is not None and not is_engine_name(given):
            raise click.BadParameter(
                f"{given!r} is not an engine name (letters, digits, '.', '_' or '-', no paths): the engine is read "
                f"from --engines-dir and the repository written to --repo-dir; give those for other folders",
                param_hint="NAME",
            )
    if from_plan is not None:
        out = package_plan(from_plan, plan_name or name, repo_dir)
    else:
        if not name:
            raise click.UsageError("give the engine NAME (or --from-plan PLAN.json --name NAME)")
        out = package_engine(
            engines_dir / name, repo_dir / name, dense_rows=dense_rows, draft_lengths=draft_lengths, warm_up=warm_up
        )
    result(f"wrote Triton model repository {out}")


def _dense_rows(value: str) -> str:
    from specpipe.runtime.cpu.dense_rows import MAX_ROW_COUNT, parse_dense_rows
    from specpipe.runtime.cpu.model.prepack import ALL_ROWS

    try:
        if not value.strip():
            raise ValueError("empty")
        rows = parse_dense_rows(value)
    except ValueError:
        raise click.BadParameter(
            f"expected 'auto', 'all' (dense weights only) or a row count 0-{MAX_ROW_COUNT} (0: "
            f"packed kernels only), got {value!r}"
        ) from None
    return "auto" if rows is None else "all" if rows >= ALL_ROWS else str(rows)
