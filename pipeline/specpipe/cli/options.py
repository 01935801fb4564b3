"""Options and parameter types shared by the commands: ``--engines-dir``, ``--repo-dir``, lists of
positive integers, ``auto``-or-size, ``W,N,G`` triples, and the registry's methods and quantizations as choices."""

from __future__ import annotations

from pathlib import Path

import click

from specpipe.build_request import AUTO
from specpipe.paths import default_engines_dir, default_repo_dir
from specpipe.speculative import ALL_QUANTIZATIONS, METHODS


class PositiveInt(click.IntRange):
    """An integer of at least 1 (requests, tokens, steps ...); refused as "must be a positive integer, got N",
    or above ``max_value`` as "must be at most M (why), got N"."""

    def __init__(self, max_value: int | None = None, why: str = "") -> None:
        super().__init__(min=1, max=max_value)
        self.why = why

    def convert(self, value, param, ctx) -> int:
        number = click.INT.convert(value, param, ctx)
        if number < 1:
            self.fail(f"must be a positive integer, got {number}", param, ctx)
        if self.max is not None and number > self.max:
            self.fail(f"must be at most {self.max}{f' ({self.why})' if self.why else ''}, got {number}", param, ctx)
        return number


class AutoOrPositiveInt(PositiveInt):
    """``auto`` (kept as the string) or an integer of at least 1, refused as "must be auto or a positive integer"."""

    name = "auto|N"

    def convert(self, value, param, ctx) -> int | str:
        if isinstance(value, str) and value.strip().lower() == AUTO:
            return AUTO
        try:
            number = int(value)
        except (TypeError, ValueError):
            self.fail(f"must be auto or a positive integer, got {value!r}", param, ctx)
        return super().convert(number, param, ctx)


#: A count of at least one (requests, tokens, steps ...).
POSITIVE = PositiveInt()
#: ``--tp`` / ``--pp``: a parallel size, or ``auto`` (chosen by the memory plan).
PARALLEL_SIZE = AutoOrPositiveInt()
#: A token count sent in an INT32 tensor (``max_tokens``).
TOKEN_COUNT = PositiveInt(2**31 - 1, "a 32-bit count")
#: A sampling seed (the ensemble's UINT64 ``seed``).
SEED = click.IntRange(0, 2**64 - 1)


class PositiveFloat(click.FloatRange):
    """A number above zero in ``unit`` (seconds, minutes); refused as "must be a positive number of UNIT"."""

    def __init__(self, unit: str) -> None:
        super().__init__(min=0, min_open=True)
        self.unit = unit

    def convert(self, value, param, ctx) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not number > 0:
            self.fail(f"must be a positive number of {self.unit}, got {number:g}", param, ctx)
        return number


SECONDS = PositiveFloat("seconds")
MINUTES = PositiveFloat("minutes")
PORT = click.IntRange(1, 65535)
#: ``-q``: ``auto`` or one of the quantizations some method allows.
QUANTIZATION = click.Choice(["auto", *ALL_QUANTIZATIONS])
#: ``train-draft --method``: the methods ``specpipe train-draft`` can train.
TRAINABLE = click.Choice([m.value for m, spec in METHODS.items() if spec.trainable])


class PositiveIntList(click.ParamType):
    """``1,2,4,8`` -> ``(1, 2, 4, 8)``: positive integers, duplicates dropped, order kept."""

    name = "N[,N...]"

    def __init__(self, example: str = "1,2,4,8") -> None:
        self.example = example

    def convert(self, value, param, ctx) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        values: list[int] = []
        for item in str(value).split(","):
            item = item.strip()
            try:
                number = int(item)
            except ValueError:
                number = 0
            if number <= 0:
                self.fail(f"must list positive integers, e.g. {self.example}; got {item!r}", param, ctx)
            if number not in values:
                values.append(number)
        return tuple(values)


class LookaheadType(click.ParamType):
    """``W,N,G`` -> ``(W, N, G)``: three positive integers (window, n-gram size, verification set)."""

    name = "W,N,G"

    def convert(self, value, param, ctx) -> tuple[int, int, int]:
        if isinstance(value, tuple):
            return value
        try:
            parts = tuple(int(v) for v in str(value).split(","))
        except ValueError:
            parts = ()
        if len(parts) != 3 or min(parts) <= 0:
            self.fail("expected W,N,G as three positive integers, e.g. 7,7,7", param, ctx)
        return parts  # type: ignore[return-value]


def engines_dir_option(help: str = "Root of the engine directories (engines/NAME).") -> click.Option:
    """``--engines-dir`` (default ``engines``)."""
    return click.option(
        "--engines-dir", type=click.Path(path_type=Path), default=default_engines_dir(), show_default=True, help=help
    )


def repo_dir_option(help: str = "Root of the Triton model repositories (triton_repo/NAME).") -> click.Option:
    """``--repo-dir`` (default ``triton_repo``)."""
    return click.option(
        "--repo-dir", type=click.Path(path_type=Path), default=default_repo_dir(), show_default=True, help=help
    )
