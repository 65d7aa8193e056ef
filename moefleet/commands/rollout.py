"""moefleet rollout: playbooks/rollout.yml through ansible-runner, with live progress per host and a report."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from moefleet import runner

EXIT_OK, EXIT_NOT_DONE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

# What a host is doing comes from documented facts, never task names: sglang_service_phase (set to installing by
# playbooks/serve.yml, then loading, rolling back, restoring, done by the sglang_service role) with
# sglang_service_phase_reason, and sglang_service_outcome (roles/sglang_service/README.md, Outputs).
PHASE_STATES = {"installing": "installing", "loading": "loading", "rolling back": "rolled back",
                "restoring": "rolled back"}
CONTROLLER = "controller"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="roll a profile out to a fleet: canary, then batches, with progress and a report",
        description=(
            "Run playbooks/rollout.yml through ansible-runner: canary host first, then batches; the first host "
            "that does not serve the asked profile stops the rollout. Prints one line per host state change, "
            "then the report. Ctrl-C stops after the running task (a host's started rollback or restore first "
            "runs to its end), a second Ctrl-C at once. Exit 0 when every "
            "host serves the asked profile, 1 when the rollout stopped or a host did not, 2 on bad input, "
            "130 on Ctrl-C."
        ),
    )
    parser.add_argument("-i", "--inventory", required=True, metavar="INVENTORY", help="inventory file or directory")
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="KEY=VALUE (several, space-separated), a JSON/YAML object, or @FILE; repeatable (-e profile=ep8)",
    )
    parser.add_argument(
        "--report", type=Path, metavar="PATH", help="report path without extension (default reports/rollout-<UTC>)"
    )
    parser.set_defaults(func=run)


def parse_extra_vars(values: list[str]) -> dict[str, Any]:
    """Merge -e values the way ansible-playbook reads them; BadInput with a sentence otherwise."""
    import yaml

    merged: dict[str, Any] = {}
    for value in values:
        text = value.strip()
        if text.startswith("@"):
            path = Path(text[1:]).expanduser()
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise runner.BadInput(f"-e {value}: cannot read {path} ({exc.strerror}).") from None
        if text.startswith("{") or value.strip().startswith("@"):
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                raise runner.BadInput(f"-e {value}: not a valid JSON or YAML object.") from None
            if not isinstance(data, dict):
                raise runner.BadInput(f"-e {value}: must be an object of variables, like '{{\"profile\": \"ep8\"}}'.")
            merged.update(data)
            continue
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise runner.BadInput(f"-e {value}: {exc}.") from None
        if not words:
            raise runner.BadInput("-e needs KEY=VALUE, a JSON object or @FILE.")
        for word in words:
            key, sep, item = word.partition("=")
            if not sep or not _KEY.match(key):
                raise runner.BadInput(
                    f"-e {value}: {word!r} is not KEY=VALUE; pass -e profile=ep8 or -e '{{\"profile\": \"ep8\"}}'."
                )
            merged[key] = item
    return merged


class Progress:
    """Turns ansible-runner events into one line per host state change."""

    def __init__(self, out: TextIO | None = None, clock=time.localtime) -> None:
        self.out = out
        self.clock = clock
        self.states: dict[str, str] = {}
        # Until a task of a role starts, the run only checks input: its failures are the operator's to fix.
        self.checking_input = True
        self.input_error: str | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host") or ""
        host = CONTROLLER if host == "localhost" else host
        task = (data.get("task") or "").strip()
        role = data.get("role") or ""
        result = data.get("res") if isinstance(data.get("res"), dict) else {}
        if role:
            self.checking_input = False
        if kind == "playbook_on_play_start" and data.get("play_pattern") in ("localhost", "127.0.0.1"):
            self.change(CONTROLLER, "validating")
        elif kind == "runner_on_start" and host and self.checking_input and host not in self.states:
            self.change(host, "validating")
        elif kind == "runner_on_ok" and host:
            self.finished(host, result)
        elif kind == "runner_on_failed" and host and not data.get("ignore_errors"):
            message = _one_line(result.get("msg", "")) or f"task {task!r} failed"
            if self.checking_input:
                self.input_error = self.input_error or message
            self.change(host, "failed", message)
        elif kind == "runner_on_unreachable" and host:
            self.change(host, "unreachable", _one_line(result.get("msg", "")))

    def finished(self, host: str, result: dict[str, Any]) -> None:
        facts = result.get("ansible_facts") or {}
        phase = facts.get("sglang_service_phase")
        if phase in PHASE_STATES:
            self.checking_input = False
            reason = _one_line(facts.get("sglang_service_phase_reason") or "")
            self.change(host, PHASE_STATES[phase], reason, force=bool(reason))
        outcome = facts.get("sglang_service_outcome")
        if isinstance(outcome, dict) and outcome.get("outcome") == "ready":
            self.change(host, "ready", f"serving {outcome.get('serving_profile')}")

    def change(self, host: str, state: str, detail: str = "", force: bool = False) -> None:
        if self.states.get(host) == state and not force:
            return
        self.states[host] = state
        stamp = time.strftime("%H:%M:%S", self.clock())
        line = f"{stamp}  {host:<16} {state}" + (f": {detail}" if detail else "")
        print(line, file=self.out or sys.stdout, flush=True)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def report_base(path: Path | None) -> Path:
    if path is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return Path.cwd() / "reports" / f"rollout-{stamp}"
    path = path.expanduser().resolve()
    return path.with_suffix("") if path.suffix in (".json", ".md") else path


def read_report(base: Path) -> dict[str, Any] | None:
    try:
        return json.loads(base.with_name(base.name + ".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def exit_code(report: dict[str, Any]) -> int:
    every_host_ready = all(row.get("outcome") == "ready" for row in report.get("hosts", []))
    return EXIT_OK if report.get("result") == "complete" and every_host_ready else EXIT_NOT_DONE


def run(args: argparse.Namespace) -> int:
    try:
        extravars = parse_extra_vars(args.extra_vars)
        base = report_base(args.report)
        extravars["moefleet_report_path"] = str(base)
        progress = Progress()
        outcome = runner.run_playbook(
            "rollout.yml", args.inventory, extravars, on_event=progress, notice=lambda m: print(m, file=sys.stderr)
        )
    except runner.BadInput as exc:
        print(f"moefleet rollout: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = read_report(base)
    reached = report is not None and any(row.get("outcome") != "untouched" for row in report.get("hosts", []))
    if progress.input_error and not reached and not outcome.interrupted:
        print(f"moefleet rollout: {progress.input_error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if report is None:
        print(
            f"moefleet rollout: the run ended ({outcome.status}, rc {outcome.rc}) without writing its report "
            f"{base}.json; is callbacks_enabled = moefleet.serving.moefleet_report in effect?"
            if not outcome.hard_stopped
            else "moefleet rollout: stopped at once; no report was written.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if outcome.interrupted else EXIT_NOT_DONE
    with contextlib.suppress(OSError):
        print("\n" + base.with_name(base.name + ".md").read_text(encoding="utf-8").rstrip())
    print(f"\nReport: {base}.json and {base.name}.md")
    return EXIT_INTERRUPTED if outcome.interrupted else exit_code(report)
