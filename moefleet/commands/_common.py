"""What the subcommands share: the inventory and --limit arguments as `moefleet rollout` takes them, the vault
options of every command that runs Ansible, and times printed in UTC with the zone. A module whose name starts
with "_" is not a subcommand (moefleet.cli skips it)."""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime
from pathlib import Path

from moefleet import runner

# Printed after a time the host recorded without a zone (older moefleet versions): see utc_text.
LEGACY_MARK = "*"
LEGACY_NOTE = (
    "* recorded without a time zone by an older moefleet; every version of its role wrote UTC "
    "(Ansible's now(utc=true)), so it is shown as UTC."
)


INVENTORY_HELP = (
    "inventory file or directory (default: the inventory of the Ansible configuration ansible-playbook would read "
    "here: ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg; in a clone without any, "
    "the clone's)"
)


def add_target_arguments(parser: argparse.ArgumentParser, limit_help: str = "only these hosts (Ansible's --limit "
                         "pattern)") -> None:
    """-i (default: the inventory ansible.cfg names, runner.inventory_path), -l/--limit and the vault options."""
    parser.add_argument("-i", "--inventory", metavar="INVENTORY", help=INVENTORY_HELP)
    parser.add_argument("-l", "--limit", metavar="PATTERN", help=limit_help)
    add_vault_arguments(parser)


def add_vault_arguments(parser: argparse.ArgumentParser) -> None:
    """--vault-password-file (repeatable) and --ask-vault-pass, passed to ansible-playbook as they are."""
    parser.add_argument(
        "--vault-password-file", "--vault-pass-file", dest="vault_password_files", action="append", default=[],
        metavar="FILE", help="vault password file (or script), as ansible-playbook takes it; repeatable",
    )
    parser.add_argument(
        "-J", "--ask-vault-pass", "--ask-vault-password", dest="ask_vault_pass", action="store_true",
        help="ask for the vault password (once, before the run; ansible-playbook's prompt is answered with it)",
    )


def vault(args: argparse.Namespace, ask=None) -> runner.Vault:
    """The run's vault options: each password file made absolute (ansible-runner starts Ansible elsewhere) and
    checked, and with --ask-vault-pass the password asked here; runner.BadInput for a file that is not there."""
    files = []
    for name in getattr(args, "vault_password_files", None) or []:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise runner.BadInput(f"--vault-password-file {name}: no such file; give the file (or script) that "
                                  "holds the vault password.")
        files.append(str(path))
    password = None
    if getattr(args, "ask_vault_pass", False):
        try:
            password = (ask or getpass.getpass)("Vault password: ")
        except EOFError:
            raise runner.BadInput("--ask-vault-pass: no password was given (end of input).") from None
    return runner.Vault(tuple(files), bool(getattr(args, "ask_vault_pass", False)), password)


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


def read_pasted_bytes(path: str, what: str) -> bytes:
    """A pasted file's bytes from PATH or stdin ("-"); a sentence naming the path as ValueError when it cannot be read
    (``what``: what the file should hold, for the directory case)."""
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file.") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a file with {what}.") from None
    except PermissionError:
        raise ValueError(f"{path}: permission denied; run as a user who can read it.") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err}).") from None


def read_pasted(path: str, what: str) -> str:
    """A pasted output's text from PATH or stdin ("-"), undecodable bytes replaced (read_pasted_bytes)."""
    return read_pasted_bytes(path, what).decode("utf-8", errors="replace")
