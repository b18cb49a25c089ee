"""Numbers read from the environment, checked when they are used (never at import):
a bad value is one line naming the variable, not a traceback."""

from __future__ import annotations

import math
import os

from vstack.errors import VstackError


def parse_seconds(name: str, raw: str, default: float) -> float:
    """raw (the text of environment variable name) as a positive, finite number of
    seconds; default when raw is empty."""
    raw = raw.strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise VstackError(
            f"{name}={raw!r} is not a number of seconds (a positive number such as "
            f"{default:g}); set it so or unset it"
        )
    return value


def env_seconds(name: str, default: float) -> float:
    return parse_seconds(name, os.environ.get(name, ""), default)
