"""moefleet rollout: playbooks/rollout.yml through ansible-runner, with live progress per host and a report."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs
from ansible_collections.moefleet.serving.plugins.module_utils.rollout_report import one_line, render_markdown

from moefleet import runner
from moefleet.commands._common import add_target_arguments, vault

EXIT_OK, EXIT_NOT_DONE, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# What a host is doing comes from documented facts, never task names: sglang_service_phase (set to installing by
# playbooks/serve.yml, then loading, rolling back, restoring, done by the sglang_service role) with
# sglang_service_phase_reason, and sglang_service_outcome (roles/sglang_service/README.md, Outputs).
PHASE_STATES = {"installing": "installing", "loading": "loading", "rolling back": "rolled back",
                "restoring": "rolled back"}
CONTROLLER = "controller"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The tag every install step of the install roles carries (nvidia_driver, cuda_toolkit, sglang, sglang_model); their
# verify steps do not, so --serve-only still checks what is installed.
SERVE_ONLY_SKIP_TAGS = "install"


@dataclass(frozen=True)
class Kind:
    """What differs between `moefleet rollout` and `moefleet deploy`; the rest of this module serves both."""

    command: str  # the subcommand's name, in messages and the default report name
    playbook: str  # under playbooks/
    batches: bool  # rollout: canary, then batches (moefleet_serial, or one host at a time behind routers);
    # deploy: every host at once


ROLLOUT = Kind("rollout", "rollout.yml", batches=True)

# The exit statuses `moefleet rollout` and `moefleet deploy` return (execute, and exit_code for a finished run).
EXIT_HELP = (
    "Exit status: 0 when every host serves the asked profile (with --check: the plan was made, every host was "
    "reached and has a profile to serve); 1 when the run stopped, a host did not serve the asked profile, the "
    "restart was refused at confirmation or the run wrote no report; 2 on bad input (refused before any host "
    "changed: -e values, the inventory, a host with no profile; with --check, anything playbooks/validate.yml "
    "refuses, with the real run's sentence); 3 with --check when a host could not be reached or its facts read; "
    "130 on Ctrl-C."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="roll a profile out to a fleet: canary, then batches, with progress and a report",
        description=(
            "Run playbooks/rollout.yml through ansible-runner: canary host first, then batches; the first host "
            "that does not serve the asked profile stops the rollout. Prints one line per host state change, "
            "then the report. Ctrl-C stops after the running task (a host's started rollback or restore first "
            "runs to its end), a second Ctrl-C at once. Batch sizes (moefleet_serial, and behind routers "
            "moefleet_max_unavailable) are a number of hosts or a percentage of them, as Ansible's serial takes "
            "them; 0, a negative number, 0%, more than 100% or a word are refused before anything runs. "
            + EXIT_HELP
        ),
    )
    add_arguments(
        parser,
        ROLLOUT,
        check_help="run playbooks/validate.yml's checks as the real run does (the profile catalog and each host's "
        "profile, the roles' argument specs, extra flags, references, the outage rule; they contact no host) and "
        "exit 2 with the real run's sentence on a refusal; then print the batches (canary first) and what would "
        "change on each host, touching nothing: the batches come from moefleet_serial (playbooks/rollout.yml's, "
        "or -e), behind routers from moefleet_max_unavailable (default 1), and the inventory's order, as Ansible "
        "cuts them; what each host serves from its local facts (read-only fact gathering); exit 3 when a host "
        "cannot be reached",
    )
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser, kind: Kind, check_help: str) -> None:
    """The arguments `moefleet rollout` and `moefleet deploy` share."""
    add_target_arguments(parser, "only these hosts (Ansible's --limit pattern; the controller is added)")
    parser.add_argument("--check", action="store_true", help=check_help)
    parser.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="restart hosts that serve another profile without asking (the same as -e confirm=yes); on a "
        f"terminal the {kind.command} otherwise asks y/N, listing them, and elsewhere refuses",
    )
    parser.add_argument(
        "--serve-only",
        action="store_true",
        help="on hosts an earlier deploy installed, change only what serves: skip the install steps (Ansible's "
        "--skip-tags install: repositories, packages, the virtualenv, the model download); the checks of the "
        "GPUs, nvcc, SGLang and the model files still run. About half the time per host",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the report (or with --check the plan) as JSON on stdout"
    )
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="KEY=VALUE (several, space-separated), a JSON/YAML object, or @FILE; repeatable (-e profile=ep8)",
    )
    parser.add_argument(
        "--report", type=Path, metavar="PATH",
        help=f"report path without extension (default reports/{kind.command}-<UTC>)",
    )


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
            message = one_line(failed_item_message(result) or result.get("msg", "")) or f"task {task!r} failed"
            if self.checking_input:
                self.input_error = self.input_error or message
            self.change(host, "failed", message)
        elif kind == "runner_on_unreachable" and host:
            self.change(host, "unreachable", one_line(result.get("msg", "")))

    def finished(self, host: str, result: dict[str, Any]) -> None:
        facts = result.get("ansible_facts") or {}
        phase = facts.get("sglang_service_phase")
        if phase in PHASE_STATES:
            self.checking_input = False
            reason = one_line(facts.get("sglang_service_phase_reason") or "")
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


def failed_item_message(result: dict[str, Any]) -> str:
    """A failed loop's first failed item's message (validate.yml loops over the roles' specs and the renamed
    variables): the task's own is only "One or more items failed"."""
    items = result.get("results") if isinstance(result.get("results"), list) else []
    return next((str(item.get("msg")) for item in items
                 if isinstance(item, dict) and item.get("failed") and item.get("msg")), "")


def report_base(path: Path | None, name: str = "rollout") -> Path:
    if path is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return Path.cwd() / "reports" / f"{name}-{stamp}"
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
    return execute(args, ROLLOUT)


def input_problems(extravars: dict[str, Any]) -> None:
    """The run's own inputs among the -e values (batch sizes, confirm, ...): BadInput with every sentence, from
    the one check playbooks/validate.yml runs (module_utils/playbook_inputs.py)."""
    problems = playbook_inputs.problems(extravars)
    if problems:
        raise runner.BadInput(" ".join(problems))


def execute(args: argparse.Namespace, kind: Kind) -> int:
    """Run the kind's playbook as `moefleet rollout` does: validate.yml's checks and the plan (--check, or the
    confirmation), the confirmation, progress, report."""
    name = f"moefleet {kind.command}"
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    try:
        extravars = parse_extra_vars(args.extra_vars)
        input_problems(extravars)
        secrets = vault(args)
        confirmed = args.yes or playbook_inputs.confirmed(extravars.get("confirm", "no"))
        if args.check or not confirmed:
            # the plan, and the question built from it, only for inputs the real run's validate.yml accepts
            checked = validate_inputs(args.inventory, extravars, args.limit, kind, secrets)
            if checked.interrupted:
                print(f"{name}: stopped while checking the inputs; nothing changed.", file=sys.stderr)
                return EXIT_INTERRUPTED
            plan = plan_rollout(args.inventory, extravars, args.limit, kind, secrets)
        if args.check:
            print(json.dumps(plan, indent=2) if args.json else render_plan(plan))
            return check_code(plan, name)
        base = report_base(args.report, kind.command)
        if not confirmed and plan["restart"]:
            if not ask(plan):
                write_refusal_report(base, plan)
                print(
                    f"{name}: refused at confirmation; nothing changed. {restart_sentence(plan)} Rerun "
                    "with --yes (or -e confirm=yes) to restart them.",
                    file=sys.stderr,
                )
                say(f"Report: {base}.json and {base.name}.md")
                return EXIT_NOT_DONE
            extravars["confirm"] = "yes"
        elif confirmed:
            extravars["confirm"] = "yes"  # --yes, or a confirm the playbook's own question reads as yes
        extravars["moefleet_report_path"] = str(base)
        progress = Progress(out=sys.stderr if args.json else None)
        outcome = runner.run_playbook(
            kind.playbook, args.inventory, extravars, on_event=progress, notice=lambda m: print(m, file=sys.stderr),
            limit=f"{args.limit},localhost" if args.limit else None, vault=secrets,
            skip_tags=SERVE_ONLY_SKIP_TAGS if args.serve_only else None,
        )
    except runner.BadInput as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = read_report(base)
    reached = report is not None and any(row.get("outcome") != "untouched" for row in report.get("hosts", []))
    if progress.input_error and not reached and not outcome.interrupted:
        if progress.input_error.startswith(CONFIRMATION_REFUSAL) and report is not None:
            # the playbook's own confirmation (the hosts' facts changed since the plan): the report says so
            mark_refused(base, report, progress.input_error)
            print(f"{name}: refused at confirmation; {progress.input_error}", file=sys.stderr)
            return EXIT_NOT_DONE
        print(f"{name}: {progress.input_error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if report is None:
        print(
            f"{name}: the run ended ({outcome.status}, rc {outcome.rc}) without writing its report "
            f"{base}.json; is callbacks_enabled = moefleet.serving.moefleet_report in effect?"
            if not outcome.hard_stopped
            else f"{name}: stopped at once; no report was written.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if outcome.interrupted else EXIT_NOT_DONE
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        with contextlib.suppress(OSError):
            print("\n" + base.with_name(base.name + ".md").read_text(encoding="utf-8").rstrip())
    say(f"\nReport: {base}.json and {base.name}.md")
    return EXIT_INTERRUPTED if outcome.interrupted else exit_code(report)


# --- the plan: batches and what changes (--check, and the confirmation) ------------------------------------

VALIDATE_PLAYBOOK = "validate.yml"
# ansible-playbook colours its output under ansible-runner; a sentence is read without the colour codes
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def validate_inputs(
    inventory: str | None, extravars: dict[str, Any], limit: str | None, kind: Kind = ROLLOUT,
    secrets: runner.Vault | None = None,
) -> runner.RunResult:
    """Every controller-side check of the real run, before the plan: playbooks/validate.yml as the kind's playbook
    imports it first (with moefleet_serving_playbook naming that playbook, under -e as there), through the same
    runner with the same inventory, -e values, --limit (with the controller) and vault. Its plays contact no host
    (assert, validate_argument_spec and the resolve_profiles module run on the controller). Its first refusal is
    BadInput with the real run's sentence, read as the real run's progress reads it (Progress.input_error)."""
    progress = Progress(out=io.StringIO())  # quiet: the plan follows in a second or two, or the refusal
    errors: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        progress(event)
        # ansible-playbook's own error before any task (a vault password file it cannot read, ...)
        text = _ANSI.sub("", str(event.get("stdout") or ""))
        if event.get("event") == "verbose" and text.lstrip().startswith("[ERROR]: "):
            errors.append(one_line(text.lstrip()[len("[ERROR]: "):]))

    outcome = runner.run_playbook(
        VALIDATE_PLAYBOOK, inventory, {"moefleet_serving_playbook": kind.playbook, **extravars}, on_event=on_event,
        notice=lambda m: print(m, file=sys.stderr), limit=f"{limit},localhost" if limit else None, vault=secrets,
    )
    if outcome.interrupted:
        return outcome
    if progress.input_error:
        raise runner.BadInput(progress.input_error)
    if outcome.status != "successful":
        why = errors[-1] if errors else f"it ended {outcome.status}, rc {outcome.rc}, with no task's message"
        raise runner.BadInput(f"Cannot check the inputs with playbooks/{VALIDATE_PLAYBOOK}: {why}")
    return outcome


# playbooks/rollout.yml's assert message starts so (its confirmation when hosts serve another profile).
CONFIRMATION_REFUSAL = "These hosts serve another profile"
GROUP = "blackwell"


def serve_play_vars(playbook: str) -> dict[str, Any]:
    """The vars the playbook gives serve.yml's play (playbook_inputs.serve_play_vars, which validate.yml reads too)."""
    import yaml

    return playbook_inputs.serve_play_vars(yaml.safe_load(runner.playbook_path(playbook).read_text(encoding="utf-8")))


def plan_rollout(
    inventory: str | None, extravars: dict[str, Any], limit: str | None, kind: Kind = ROLLOUT,
    secrets: runner.Vault | None = None,
) -> dict[str, Any]:
    """Which hosts, in which batch, and what would change on each: two read-only ad-hoc runs through the
    same runner (the hosts' asked profile, play order and run-level inputs; their local facts). The batches are
    serve.yml's serial for the playbook's vars with -e over them (playbook_inputs.play_serial), cut as Ansible
    cuts them (playbook_inputs.batches, the report callback's too): deploy.yml every host in one batch, with no
    canary. Behind routers, a run that restarts workers undrained (deploy.yml) or drains every one at once is
    refused as playbooks/validate.yml refuses it (playbook_inputs.outage), unless -e moefleet_maintenance_window=true.
    A run-level input set in the inventory is refused as playbooks/validate.yml refuses it."""
    names = list(playbook_inputs.INPUTS)
    asked_expr = "profile" if "profile" in extravars else "sglang_profile | default(none)"
    looked = runner.run_adhoc(
        "ansible.builtin.debug",
        "msg={{ {'asked': " + asked_expr + ", 'order': ansible_play_hosts_all, "
        "'routers': groups['routers'] | default([]), 'workers': groups['blackwell'] | default([]), "
        f"'inputs': ([inventory_hostname] | moefleet.serving.host_inputs(hostvars, {names!r}))[inventory_hostname]"
        "} }}",
        inventory, GROUP, limit, extravars, vault=secrets,
    )
    if looked.failed:
        raise runner.BadInput(f"Cannot plan the {kind.command}: {next(iter(looked.failed.values()))}")
    inventory_text = ", ".join(str(p) for p in runner.inventory_sources(inventory))
    if not looked.ok:
        return {"playbook": kind.playbook, "inventory": inventory_text, "limit": limit, "serial": [],
                "behind_routers": False, "batches": 0, "hosts": [], "restart": [], "unreachable": [],
                "no_profile": [], "touched": False}
    views = {host: dict(result["msg"].get("inputs") or {}) for host, result in looked.ok.items()}
    problems = playbook_inputs.problems(extravars, views, playbook_inputs.outside_extra_vars(extravars, views))
    if problems:
        raise runner.BadInput(" ".join(problems))
    first = next(iter(looked.ok.values()))["msg"]
    order = list(first["order"])
    values = {**serve_play_vars(kind.playbook), **extravars}
    # behind routers, refused as playbooks/validate.yml refuses it (workers restarted undrained, or all at once),
    # before any host's facts are read
    refusal, _ = playbook_inputs.outage(values, first.get("workers") or order, order, first["routers"], kind.playbook)
    if refusal:
        raise runner.BadInput(refusal)
    facts = runner.run_adhoc(
        "ansible.builtin.setup", "filter=ansible_local gather_subset=!all,!min,local", inventory, GROUP, limit,
        vault=secrets,
    )
    serial = playbook_inputs.play_serial(values, bool(first["routers"]))
    through = values.get("moefleet_through_routers", False)
    behind_routers = bool(first["routers"]) and playbook_inputs.confirmed(through)
    rows, restart, unreachable, no_profile = [], [], [], []
    # cut as Ansible cuts them (and the report callback): playbook_inputs.batches
    for number, batch in enumerate(playbook_inputs.batches(order, serial), start=1):
        for host in batch:
            asked = looked.ok[host]["msg"]["asked"]
            local = ((facts.ok.get(host) or {}).get("ansible_facts") or {}).get("ansible_local") or {}
            state = local.get("moefleet") if isinstance(local.get("moefleet"), dict) else None
            serving = state.get("serving_profile") if state else None
            if asked is None:
                no_profile.append(host)
            if host in facts.unreachable:
                change = f"unreachable now ({facts.unreachable[host]})"
                unreachable.append(host)
            elif host in facts.failed or host not in facts.ok:
                why = facts.failed.get(host) or "no answer"
                change = f"its facts could not be read ({why})"
                unreachable.append(host)
            elif asked is None:
                change = "no profile asked: set sglang_profile for the host, or pass -e profile=NAME"
            elif state is None:
                change = f"install and start {asked} (no moefleet facts: a new host)"
            elif serving == asked:
                change = (
                    f"keeps {asked} (restarts only if its flags, NCCL set, environment or model path changed, "
                    "or with -e sglang_service_retry=true)"
                )
            elif serving is None:
                change = f"start {asked} (serves nothing now, outcome {state.get('outcome')})"
            else:
                change = f"restart: serves {serving}, asked {asked}"
                restart.append(host)
            rows.append({"host": host, "batch": number, "canary": kind.batches and number == 1 and len(batch) == 1,
                         "asked_profile": asked, "serving_profile": serving, "change": change})
    return {
        "playbook": kind.playbook,
        "inventory": inventory_text,
        "limit": limit,
        "serial": serial,
        "behind_routers": behind_routers,
        "batches": len({row["batch"] for row in rows}),
        "hosts": rows,
        "restart": restart,
        "unreachable": unreachable,
        "no_profile": no_profile,
        "touched": False,
    }


def check_code(plan: dict[str, Any], name: str) -> int:
    """--check's exit status, with a sentence on stderr for each reason it is not 0."""
    if plan.get("no_profile"):
        print(f"{name}: no profile asked for {', '.join(plan['no_profile'])}: pass -e profile=NAME or set "
              "sglang_profile for them; the run would be refused.", file=sys.stderr)
        return EXIT_BAD_INPUT
    if plan.get("unreachable"):
        print(f"{name}: {', '.join(plan['unreachable'])} could not be reached (or their facts read): the plan "
              "cannot say what would change there.", file=sys.stderr)
        return EXIT_UNREACHABLE
    return EXIT_OK


def render_plan(plan: dict[str, Any]) -> str:
    deploy = plan.get("playbook") == "deploy.yml"
    size = plan["serial"][0] if plan["serial"] else None
    at_a_time = f"{size} of the hosts" if str(size).endswith("%") else f"{size} host(s)"
    how = (
        f"behind routers, {at_a_time} at a time" if plan["behind_routers"]
        else "every host at once" if deploy and plan["serial"] in ([0], [])
        else f"serial {json.dumps(plan['serial'])}"
    )
    what = "Deploy" if deploy else "Rollout"
    lines = [f"{what} plan ({how}; nothing was changed):"]
    if not plan["hosts"]:
        where = f" with --limit {plan['limit']}" if plan["limit"] else ""
        lines.append(f"  no host of group {GROUP} in {plan['inventory']}{where}: nothing would change.")
    for number in range(1, plan["batches"] + 1):
        rows = [row for row in plan["hosts"] if row["batch"] == number]
        label = "canary" if rows and rows[0]["canary"] else "every host" if deploy else f"batch {number}"
        lines.append(f"{label}:")
        width = max(len(row["host"]) for row in rows)
        lines += [f"  {row['host']:<{width}}  {row['change']}" for row in rows]
    if plan["restart"]:
        lines.append(f"{restart_sentence(plan)} The {what.lower()} asks before restarting them (--yes: without "
                     "asking).")
    return "\n".join(lines)


def restart_sentence(plan: dict[str, Any]) -> str:
    hosts = ", ".join(
        f"{row['host']} ({row['serving_profile']} -> {row['asked_profile']})"
        for row in plan["hosts"] if row["host"] in plan["restart"]
    )
    return f"These hosts serve another profile and would restart: {hosts}."


def ask(plan: dict[str, Any], stdin: TextIO | None = None, stderr: TextIO | None = None) -> bool:
    """On a terminal, y/N listing the hosts that would restart; elsewhere no (a script passes --yes)."""
    stdin, stderr = stdin or sys.stdin, stderr or sys.stderr
    if not (stdin.isatty() and stderr.isatty()):
        return False
    print(restart_sentence(plan), file=stderr)
    print("Restart them? [y/N] ", end="", file=stderr, flush=True)
    try:
        answer = stdin.readline()
    except KeyboardInterrupt:
        return False
    return answer.strip().lower() in ("y", "yes")


def _write_report(base: Path, report: dict[str, Any]) -> None:
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_name(base.name + ".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    # the callback's Markdown (module_utils/rollout_report.py), so a refused run's report reads like any other
    base.with_name(base.name + ".md").write_text(render_markdown(report), encoding="utf-8")


def write_refusal_report(base: Path, plan: dict[str, Any]) -> None:
    """The report of a rollout refused at confirmation (schemas/rollout_report.schema.json): no host touched."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    asked = {row["asked_profile"] for row in plan["hosts"]}
    report = {
        "playbook": plan.get("playbook", "rollout.yml"),
        "asked_profile": asked.pop() if len(asked) == 1 else None,
        "started": now,
        "ended": now,
        "seconds": 0,
        "result": "stopped",
        "stopped_by": "refused at confirmation: " + ", ".join(plan["restart"]),
        "hosts": [
            {
                "host": row["host"], "asked_profile": row["asked_profile"], "serving_profile": row["serving_profile"],
                "outcome": "untouched", "ooms": 0, "seconds": None, "started": None, "ended": None,
                "message": "refused at confirmation (would restart)" if row["host"] in plan["restart"]
                else f"refused at confirmation (batch {row['batch']} not started)",
            }
            for row in plan["hosts"]
        ],
    }
    _write_report(base, report)


def mark_refused(base: Path, report: dict[str, Any], message: str) -> None:
    """The callback's report of a run the playbook's confirmation stopped, saying so instead of 'never reached'."""
    report["stopped_by"] = "refused at confirmation"
    for row in report.get("hosts", []):
        if row.get("outcome") == "untouched":
            row["message"] = "refused at confirmation: " + message
    _write_report(base, report)
