"""The moefleet command line: one subcommand per module in moefleet.commands."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
from typing import Any, TextIO

from moefleet import __version__, commands

EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moefleet",
        description="Plan, deploy, diagnose and roll out SGLang parallelism profiles on Blackwell hosts. "
        "Each command's --help states its exit statuses; a usage error exits 2.",
    )
    parser.add_argument("--version", action="version", version=f"moefleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared code, not a subcommand
            continue
        importlib.import_module(f"moefleet.commands.{info.name}").register(sub)
    return parser


class PipeSafe:
    """A text stream whose reader may go away (``moefleet status | head -1``): once a write or flush meets a
    closed pipe, its file descriptor is pointed at /dev/null and the command carries on to its end and its exit
    status (a rollout keeps running and writes its report), printing nothing more there and no traceback."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def _gone(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PipeSafe(sys.stdout), PipeSafe(sys.stderr)
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C outside a run (a run handles its own): no traceback
        print("\nmoefleet: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for wrapped in (sys.stdout, sys.stderr):
            wrapped.flush()
        sys.stdout, sys.stderr = streams


if __name__ == "__main__":
    sys.exit(main())
