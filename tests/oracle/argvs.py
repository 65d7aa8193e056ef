"""One helper both sides of the oracle use (driver.py in the oracle venv, oracle.py in the project's)."""

from __future__ import annotations


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced, or the flag added in front: the product renders paths and
    ports of a real host, the oracle and the simulator run with their own."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [flag, value, *argv]
