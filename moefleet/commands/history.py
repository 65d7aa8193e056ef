"""moefleet history HOST: the host's starts as a timeline, from its local facts (read-only fact gathering)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from moefleet import runner
from moefleet.commands._common import (
    INVENTORY_HELP,
    LEGACY_MARK,
    LEGACY_NOTE,
    add_vault_arguments,
    parse_time,
    utc_text,
    vault,
)

EXIT_OK, EXIT_NO_FACTS, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
# The setup module's arguments that read only the local facts (as `moefleet rollout --check` reads them).
LOCAL_FACTS_ONLY = "filter=ansible_local gather_subset=!all,!min,local"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "history",
        help="a host's starts as a timeline: time (UTC), profile, tuning, NCCL set, outcome, phase, cause",
        description=(
            "Read HOST's moefleet local facts (Ansible's setup module, local facts only: nothing changes) and print "
            "its starts oldest first: each start the sglang_service role made (the first start of a deploy and "
            "each rollback remedy; the host keeps the last 50), the restore of the last unit that served when "
            "the last run ended restored, and each failure while serving that the unit's exit hook recorded "
            "(systemd restarted the unit after it). Times are UTC. --json prints the document "
            "(schemas/history.schema.json). Exit status: 0 when the host has moefleet facts, 1 when it has "
            "none (never deployed), 2 on input errors (HOST not in the inventory, no such inventory, a vault "
            "password file that is not there), 3 when HOST is unreachable or its facts cannot be read."
        ),
    )
    parser.add_argument("host", metavar="HOST", help="the host's inventory name")
    parser.add_argument("-i", "--inventory", metavar="INVENTORY", help=INVENTORY_HELP)
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of a table")
    add_vault_arguments(parser)
    parser.set_defaults(func=run)


def _sort_key(row: dict[str, Any]) -> datetime:
    parsed = parse_time(row.get("time"))
    return parsed[0] if parsed else datetime.min.replace(tzinfo=UTC)


def timeline(host: str, local: dict[str, Any]) -> dict[str, Any]:
    """The history document (schemas/history.schema.json) from the host's ansible_local."""
    facts = local.get("moefleet") if isinstance(local.get("moefleet"), dict) else {}
    runtime = local.get("moefleet_runtime") if isinstance(local.get("moefleet_runtime"), dict) else {}
    rows: list[dict[str, Any]] = []
    for entry in facts.get("history") or []:
        rows.append({"kind": "start", "time": entry.get("time"), "profile": entry.get("profile"),
                     "tuning": entry.get("tuning") or {}, "nccl_set": entry.get("nccl_set"),
                     "outcome": entry.get("outcome"), "phase": entry.get("phase"), "cause": entry.get("cause")})
    rollback = facts.get("last_rollback")
    if facts.get("outcome") == "restored" and isinstance(rollback, dict):
        attempt = facts.get("attempt") or {}
        rows.append({"kind": "restore", "time": rollback.get("time"), "profile": rollback.get("to"),
                     "tuning": attempt.get("tuning") or {}, "nccl_set": attempt.get("nccl_set"),
                     "outcome": "ready" if rollback.get("to") else None, "phase": None,
                     "cause": rollback.get("reason") or None})
    for failure in runtime.get("failures") or ([runtime["last"]] if isinstance(runtime.get("last"), dict) else []):
        attempt = failure.get("attempt") or {}
        rows.append({"kind": "while serving", "time": failure.get("time"), "profile": attempt.get("profile"),
                     "tuning": attempt.get("tuning") or {}, "nccl_set": attempt.get("nccl_set"),
                     "outcome": failure.get("state"), "phase": failure.get("phase"), "cause": failure.get("cause")})
    rows.sort(key=_sort_key)
    return {
        "host": host,
        "asked_profile": facts.get("asked_profile"),
        "serving_profile": facts.get("serving_profile"),
        "outcome": facts.get("outcome"),
        "updated": facts.get("updated"),
        "starts": rows,
    }


def _tuning(tuning: Any) -> str:
    if not isinstance(tuning, dict) or not tuning:
        return "-"
    return ",".join(f"{k}={v}" for k, v in sorted(tuning.items()))


def render(doc: dict[str, Any]) -> str:
    header = ("time", "kind", "profile", "tuning", "nccl", "outcome", "phase", "cause")
    body = [
        (utc_text(r.get("time")), r["kind"], r.get("profile") or "-", _tuning(r.get("tuning")),
         r.get("nccl_set") or "-", r.get("outcome") or "-", r.get("phase") or "-",
         " ".join(str(r.get("cause") or "-").split()))
        for r in doc["starts"]
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()

    lines = [
        f"{doc['host']}: asked {doc.get('asked_profile') or '-'}, serving {doc.get('serving_profile') or 'nothing'}, "
        f"outcome {doc.get('outcome') or '-'} (recorded {utc_text(doc.get('updated'))})",
        fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(line) for line in body),
    ]
    if any(f"UTC{LEGACY_MARK}" in line for line in lines):
        lines.append(LEGACY_NOTE)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        result = runner.run_adhoc("ansible.builtin.setup", LOCAL_FACTS_ONLY, args.inventory, args.host,
                                  vault=vault(args))
    except runner.BadInput as exc:
        print(f"moefleet history: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.host in result.unreachable:
        print(f"moefleet history: {args.host} is unreachable ({result.unreachable[args.host]}).", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.host in result.failed:
        print(f"moefleet history: reading {args.host}'s local facts failed ({result.failed[args.host]}).",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.host not in result.ok:
        print(f"moefleet history: {args.host} is not a host of the inventory; give its inventory name "
              "(one host, not a pattern).", file=sys.stderr)
        return EXIT_BAD_INPUT
    local = (result.ok[args.host].get("ansible_facts") or {}).get("ansible_local") or {}
    doc = timeline(args.host, local)
    if args.json:
        print(json.dumps(doc, indent=2))
    if not isinstance(local.get("moefleet"), dict):
        print(f"moefleet history: {args.host} has no moefleet local facts: moefleet never deployed it.",
              file=sys.stderr)
        return EXIT_NO_FACTS
    if not args.json:
        print(render(doc))
    return EXIT_OK
