"""moefleet status: what every host serves, from playbooks/status.yml (local facts, health, /server_info)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from moefleet import runner

EXIT_OK, EXIT_NOT_SERVING, EXIT_BAD_INPUT = 0, 1, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="per host: the profile serving, the one asked for, health and the last rollback",
        description=(
            "Run playbooks/status.yml through ansible-runner (it changes nothing on the hosts) and print, per "
            "host, the profile serving, the one asked for, health (serving, starting, down, unreachable), "
            "with routers its state in them (ready, draining, out, unknown), and the last rollback. Exit 0 "
            "when every host serves, 1 otherwise, 2 on bad input."
        ),
    )
    parser.add_argument("-i", "--inventory", required=True, metavar="INVENTORY", help="inventory file or directory")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of a table")
    parser.set_defaults(func=run)


class Failures:
    """Keeps the first failure message of the run, to say why no document came back."""

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable") and self.first is None:
            data = event.get("event_data") or {}
            res = data.get("res") if isinstance(data.get("res"), dict) else {}
            self.first = f"{data.get('host')}: {' '.join(str(res.get('msg', 'failed')).split())}"


def collect(inventory: str) -> list[dict[str, Any]]:
    """The status document's hosts; runner.BadInput for bad input, RuntimeError when the run gave none."""
    with tempfile.TemporaryDirectory(prefix="moefleet-status-") as tmp:
        path = Path(tmp) / "status.json"
        failures = Failures()
        outcome = runner.run_playbook(
            "status.yml",
            inventory,
            {"moefleet_status_path": str(path)},
            on_event=failures,
            notice=lambda m: print(m, file=sys.stderr),
        )
        try:
            return json.loads(path.read_text(encoding="utf-8"))["hosts"]
        except (OSError, ValueError, KeyError):
            why = failures.first or f"{outcome.status}, rc {outcome.rc}"
            raise RuntimeError(f"the status playbook wrote no document ({why}).") from None


def run(args: argparse.Namespace) -> int:
    try:
        hosts = collect(args.inventory)
    except runner.BadInput as exc:
        print(f"moefleet status: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as exc:
        print(f"moefleet status: {exc}", file=sys.stderr)
        return EXIT_NOT_SERVING
    print(json.dumps({"hosts": hosts}, indent=2) if args.json else render_table(hosts))
    return EXIT_OK if hosts and all(h.get("health") == "serving" for h in hosts) else EXIT_NOT_SERVING


def _rollback(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "-"
    when = str(entry.get("time") or "")[:19].replace("T", " ")
    reason = f" ({entry['reason']})" if entry.get("reason") else ""
    return f"{when} {entry.get('from')} -> {entry.get('to')}{reason}".strip()


def _runtime(host: dict[str, Any]) -> str:
    """Failures while serving (the unit's exit hook): OOMs recorded, and the last failure."""
    last = host.get("last_runtime_failure")
    if not isinstance(last, dict):
        return "-"
    when = str(last.get("time") or "")[:19].replace("T", " ")
    what = f"{last.get('state')} ({last.get('phase') or last.get('cause')})"
    return f"{host.get('runtime_ooms') or 0} OOM(s), last {when} {what}"


def render_table(hosts: list[dict[str, Any]]) -> str:
    """One line per host; a fleet with routers gets a "router" column (ready, draining, out, unknown)."""
    routed = any("router" in h for h in hosts)
    header = ("host", "serving", "asked", "health", *(("router",) if routed else ()), "last rollback", "while serving")
    body = [
        (
            str(h.get("host")),
            h.get("serving_profile") or "-",
            h.get("asked_profile") or "-",
            h.get("health") or "-",
            *((h.get("router") or "-",) if routed else ()),
            _rollback(h.get("last_rollback")),
            _runtime(h),
        )
        for h in hosts
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()

    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(line) for line in body)])
