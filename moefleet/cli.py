"""The moefleet command line: one subcommand per module in moefleet.commands."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from moefleet import __version__, commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moefleet",
        description="Plan, deploy, diagnose and roll out SGLang parallelism profiles on Blackwell hosts.",
    )
    parser.add_argument("--version", action="version", version=f"moefleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared code, not a subcommand
            continue
        importlib.import_module(f"moefleet.commands.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
