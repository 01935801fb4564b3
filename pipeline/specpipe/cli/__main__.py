"""``python -m specpipe.cli``: the same as the ``specpipe`` command."""

from specpipe.cli import main

main()
