"""What the subcommands share: the inventory and --limit arguments as `moefleet rollout` takes them, and times
printed in UTC with the zone. A module whose name starts with "_" is not a subcommand (moefleet.cli skips it)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

# Printed after a time the host recorded without a zone (older moefleet versions): see utc_text.
LEGACY_MARK = "*"
LEGACY_NOTE = (
    "* recorded without a time zone by an older moefleet; every version of its role wrote UTC "
    "(Ansible's now(utc=true)), so it is shown as UTC."
)


def add_target_arguments(parser: argparse.ArgumentParser, limit_help: str = "only these hosts (Ansible's --limit "
                         "pattern)") -> None:
    """-i (default: the inventory ansible.cfg names, runner.inventory_path) and -l/--limit."""
    parser.add_argument(
        "-i", "--inventory", metavar="INVENTORY", help="inventory file or directory (default: ansible.cfg's)"
    )
    parser.add_argument("-l", "--limit", metavar="PATTERN", help=limit_help)


def parse_time(value: object) -> tuple[datetime, bool] | None:
    """An ISO 8601 time as an aware UTC datetime, and whether it carried its zone; None when it is not one."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC), False
    return when.astimezone(UTC), True


def utc_text(value: object) -> str:
    """``2026-12-01 07:03:12 UTC``; a time recorded without a zone gets LEGACY_MARK (``... UTC*``), anything that
    is not a time is printed as it is ("-" when empty)."""
    parsed = parse_time(value)
    if parsed is None:
        return str(value) if value not in (None, "") else "-"
    when, zoned = parsed
    return when.strftime("%Y-%m-%d %H:%M:%S UTC") + ("" if zoned else LEGACY_MARK)
