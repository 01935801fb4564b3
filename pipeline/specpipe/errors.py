"""User-facing errors.

Every error a user can cause is a :class:`SpecpipeError`: the CLI prints its message on one line
(``error: ...``) and exits with status 1, without a traceback. Messages name the problem and the fix.
"""


class SpecpipeError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""


class PresetError(SpecpipeError):
    """Unknown or invalid preset (target or draft)."""


class CompatibilityError(SpecpipeError):
    """Draft and target (or settings given in two places) disagree."""


class ManifestError(SpecpipeError):
    """An engine directory is missing its manifest, or the manifest does not fit this specpipe."""


class FlagError(SpecpipeError):
    """A flag the chosen runtime or method does not take; the CLI reports it as a usage error (exit 2)."""


class MethodTableError(SpecpipeError):
    """A speculative method has no entry in a per-method table: specpipe was extended without it (a defect)."""
