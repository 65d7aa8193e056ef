"""Subcommands of the moefleet CLI.

Each module here defines ``register(subparsers)``, which adds one subcommand whose parser sets
``func`` to a callable taking the parsed args and returning the exit code. The checks below are the
subcommands' one way to refuse a number they cannot use (argparse's ``float`` takes nan, inf and negatives).
"""

from __future__ import annotations

import math


def number_problem(flag: str, value: float | None, high: float, example: str) -> str | None:
    """A sentence when ``value`` (given with ``flag``) is not a finite number above 0 and at most ``high``."""
    if value is None or (math.isfinite(value) and 0 < value <= high):
        return None
    return f"{flag} {value:g} is not usable; give a finite number above 0, at most {high:g} (e.g. {flag} {example})."


def whole_number_problem(flag: str, value: int | None, low: int, high: int) -> str | None:
    """A sentence when ``value`` (given with ``flag``) is not a whole number from ``low`` to ``high``."""
    if value is None or low <= value <= high:
        return None
    return f"{flag} {value} is out of range; give a whole number from {low} to {high}."
