"""Subcommands of the moefleet CLI.

Each module here defines ``register(subparsers)``, which adds one subcommand whose parser sets
``func`` to a callable taking the parsed args and returning the exit code.
"""
