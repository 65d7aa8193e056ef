"""moefleet remediate: playbooks/remediate.yml on the hosts the fault watcher found unfit (docs/healing.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from moefleet import runner
from moefleet.commands._common import add_target_arguments, vault
from moefleet.commands.rollout import parse_extra_vars

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "remediate",
        help="reboot, check and put back the hosts the fault watcher took out (GPU faults, hangs)",
        description=(
            "Run playbooks/remediate.yml: each host the fault watcher (roles/fault_watch) found unfit, at most "
            "--max-unavailable at a time, stays out of every router, reboots, has its GPUs checked against what it "
            "had when it last deployed (count, PCI addresses, driver, the trained PCIe links), starts the last unit "
            "that served, checks it as a deploy does (readiness, the correctness gate, the links under load) and "
            "goes back into every router. A host whose fault came back within fault_watch_retry_window of its last "
            "remediation, whose GPUs differ after the reboot, or whose start fails those checks, is kept out and "
            "reported as needing hardware attention, with the evidence. Healthy hosts are left alone. Exit status: 0 "
            "when every unfit host serves again (or none was unfit); 1 when a host was kept out or the run failed; "
            "2 on bad input."
        ),
    )
    add_target_arguments(parser)
    parser.add_argument("--max-unavailable", metavar="N", default=None,
                        help="hosts rebooted at a time: a count or a percentage such as 25%% (default 1)")
    parser.add_argument("--check", action="store_true", help="say what would happen; change nothing")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="Ansible extra variables (KEY=VALUE, JSON or @FILE), e.g. -e fault_watch_retry_window=0 "
                        "to try a repaired host again at once")
    parser.set_defaults(func=run)


class Outcome:
    """Each host's result line, from the playbook's events."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}
        self.reports: dict[str, str] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = str(data.get("host") or "")
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            self.failed.setdefault(host, " ".join(str(res.get("msg", "failed")).split()))
        elif event.get("event") == "runner_on_ok" and str(data.get("task", "")) == "Report" and res.get("msg"):
            self.reports[host] = " ".join(str(res["msg"]).split())


def run(args: argparse.Namespace) -> int:
    try:
        extravars: dict[str, Any] = parse_extra_vars(args.extra_vars)
    except runner.BadInput as exc:
        print(f"moefleet remediate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.max_unavailable is not None:
        extravars["moefleet_max_unavailable"] = args.max_unavailable
    outcome = Outcome()
    try:
        result = runner.run_playbook("remediate.yml", args.inventory, extravars, on_event=outcome,
                                     notice=lambda m: print(m, file=sys.stderr), limit=args.limit,
                                     vault=vault(args), check=args.check)
    except runner.BadInput as exc:
        print(f"moefleet remediate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for _host, line in sorted(outcome.reports.items()):
        print(line)
    for host, why in sorted(outcome.failed.items()):
        print(f"{host}: {why}", file=sys.stderr)
    if outcome.failed or result.rc not in (0, None):
        if not outcome.failed:
            print(f"moefleet remediate: the playbook ended with {result.status}, rc {result.rc}", file=sys.stderr)
        return EXIT_FAILED
    if not outcome.reports:
        print("No host was unfit: nothing to remediate.")
    return EXIT_OK
