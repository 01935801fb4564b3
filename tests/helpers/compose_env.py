"""Docker Compose's variable substitution, for tests that read docker/*.yaml as compose would."""

from __future__ import annotations

import re


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` substitution (an empty value counts as
    unset, as in compose).

    Raises:
        KeyError: a ``${VAR:?error}`` variable is unset."""

    def replace(match):
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg or ""

    return re.sub(r"\$\{([A-Z_]+)(?:(:-|:\?)([^}]*))?\}", replace, text)
