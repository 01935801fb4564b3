"""The ``specpipe`` command line: a click group that only registers the commands.

Each command lives in its own module of this package, owns its options, builds one settings object
and calls one library function. Bad input the library finds (:class:`~specpipe.errors.SpecpipeError`)
is printed here on one line, ``error: ...``: exit status 1, or 2 for a flag the chosen runtime or
method does not take (:class:`~specpipe.errors.FlagError`), like click's own usage errors.
"""

from __future__ import annotations

import signal
import sys

import click

from specpipe import __version__
from specpipe.cli import bench, build, client, demo, deploy, doctor, gateway, package, serve, train
from specpipe.errors import FlagError, SpecpipeError
from specpipe.progress import quiet_library_bars

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it)."""


class _Group(click.Group):
    """Turns :class:`SpecpipeError` into a one-line message and exit status 1 (2 for a :class:`FlagError`)."""

    def invoke(self, ctx: click.Context):
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            return super().invoke(ctx)
        except SpecpipeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2 if isinstance(exc, FlagError) else 1)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the shells' status for SIGINT, not click's "Aborted!" and 1
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED)


def _stop_on_sigterm(signum, frame) -> None:
    """``kill``, ``docker stop`` and ``timeout`` end a command as Ctrl-C does: the exception unwinds the
    command, so half-written outputs are removed (:func:`specpipe.fsutil.write_dir_atomically`)."""
    raise KeyboardInterrupt(f"terminated by signal {signum}")


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="specpipe")
def main() -> None:
    """specpipe: build, package, serve, validate and benchmark speculative-decoding deployments."""
    quiet_library_bars()


for command in (
    build.build,
    package.package,
    serve.serve,
    client.generate,
    client.validate,
    demo.demo,
    train.train_draft,
    deploy.deploy,
    bench.bench,
    bench.tune,
    doctor.doctor,
    gateway.gateway,
):
    main.add_command(command)


if __name__ == "__main__":
    main()
