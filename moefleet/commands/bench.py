"""moefleet bench: run the benchmark sweep, and read SGLang benchmark results.

`moefleet bench run [-i INVENTORY] [--profiles a,b] [--limit HOST] [-e VARS] [--report PATH]
[--vault-password-file FILE | --ask-vault-pass]` runs
playbooks/bench.yml through ansible-runner on one host (the first of group blackwell, or --limit): each profile
served through the sglang_service role, then measured with SGLang's own bench_serving at a concurrency ladder
(with a group routers, the host is out of them for the sweep).
It prints one line per step (profile k of n, each concurrency level's output tok/s and p99 ITL), then the
summary table and the recommendation; the report (JSON, CSV, Markdown, PNG plots) lands under reports/.
Exit codes: 0 the report was written and the host serves again; 1 the run failed or wrote no report; 2 bad
input (-e apply=maybe, an unknown profile, no inventory), refused before the host was touched; 130 Ctrl-C.

`moefleet bench parse FILE... [--json]` reads the results of `python -m sglang.bench_serving` as people
paste them: the printed result block of any SGLang release since 0.2 (rows missing in older releases,
older label spellings, CRLF, trimmed padding, a progress bar or the command above it, rows cut out) and
the JSON lines of its --output-file. It prints a table, or with --json a list of one object per block or
JSON line: output_throughput and the other throughputs in tok/s (request_throughput in req/s), latencies
in ms, max_concurrency null when not printed or "not set", rows it does not know under "extra".

Exit codes (parse): 0 every file held at least one result; 2 a file held none or could not be read (a
sentence on stderr names it; the results of the other files are still printed).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ansible_collections.moefleet.serving.plugins.module_utils.bench_results import parse_text

from moefleet.commands._common import INVENTORY_HELP, add_vault_arguments, read_pasted, vault

EXIT_OK, EXIT_NOT_DONE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXPECTED = ("expected the block `python -m sglang.bench_serving` prints (from its "
            "'============ Serving Benchmark Result ============' line) or the JSON lines of its --output-file")

# (heading, field, format) of the table without --json
COLUMNS = (
    ("backend", "backend", "{}"),
    ("conc", "max_concurrency", "{}"),
    ("reqs", "successful_requests", "{}"),
    ("out tok/s", "output_throughput", "{:.2f}"),
    ("total tok/s", "total_throughput", "{:.2f}"),
    ("med TTFT ms", "median_ttft_ms", "{:.2f}"),
    ("p99 TTFT ms", "p99_ttft_ms", "{:.2f}"),
    ("med ITL ms", "median_itl_ms", "{:.2f}"),
    ("p99 ITL ms", "p99_itl_ms", "{:.2f}"),
    ("med E2E ms", "median_e2e_latency_ms", "{:.2f}"),
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="SGLang benchmark results: parse saved or pasted bench_serving output",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="bench_command", metavar="ACTION")
    parse = actions.add_parser(
        "parse",
        help="read bench_serving result blocks and JSONL lines from files",
        description="Read `python -m sglang.bench_serving` result blocks and --output-file JSON lines.",
    )
    parse.add_argument("files", metavar="FILE", nargs="+", help="a saved or pasted output; '-' reads stdin")
    parse.add_argument("--json", action="store_true", help="print a JSON list, one object per result")
    parse.set_defaults(func=run_parse)

    sweep = actions.add_parser(
        "run",
        help="serve each profile on one host and measure it with bench_serving: report and recommendation",
        description=(
            "Run playbooks/bench.yml through ansible-runner on one host (the first of group blackwell, or "
            "--limit HOST): each profile served through the sglang_service role, measured with SGLang's own "
            "bench_serving at a concurrency ladder; then the host serves what it served before (or, with "
            "-e apply=yes, the winner). Prints progress, the summary table and the recommendation; the report "
            "(JSON, CSV, Markdown, PNG) lands under reports/. Exit 0 report written and the host serves again, "
            "1 otherwise, 2 bad input, 130 Ctrl-C."
        ),
    )
    sweep.add_argument("-i", "--inventory", metavar="INVENTORY", help=INVENTORY_HELP)
    sweep.add_argument("--profiles", metavar="A,B", help="profiles to measure, in order (default: every one that fits)")
    sweep.add_argument("--limit", "-l", metavar="HOST", help="the host to measure (default: the first of blackwell)")
    sweep.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                       help="KEY=VALUE, a JSON/YAML object or @FILE; repeatable "
                            "(-e '{\"bench_ladder\": [1, 64]}', -e apply=yes)")
    sweep.add_argument("--report", type=Path, metavar="PATH",
                       help="report path without extension (default reports/bench-<UTC>)")
    add_vault_arguments(sweep)
    sweep.set_defaults(func=run_sweep)

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT

    parser.set_defaults(func=usage)


def _cell(fmt: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return fmt.format(value)


def table(results: list[dict]) -> str:
    rows = [["source", *(heading for heading, _, _ in COLUMNS)]]
    for result in results:
        rows.append([f"{result['file']}:{result['line']}",
                     *(_cell(fmt, result[field]) for _, field, fmt in COLUMNS)])
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [cell.ljust(w) if k < 2 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_parse(args: argparse.Namespace) -> int:
    results: list[dict] = []
    code = EXIT_OK
    for path in args.files:
        name = "stdin" if path == "-" else path
        try:
            found = parse_text(read_pasted(path, "benchmark output"))
        except ValueError as err:
            print(f"moefleet bench parse: {err}", file=sys.stderr)
            code = EXIT_BAD_INPUT
            continue
        if not found:
            print(f"moefleet bench parse: {name}: no SGLang benchmark result in it; {EXPECTED}.", file=sys.stderr)
            code = EXIT_BAD_INPUT
            continue
        for result in found:
            result["file"] = name
        results.extend(found)
    if args.json:
        print(json.dumps(results, indent=2))
    elif results:
        print(table(results))
    return code


# What the sweep is doing comes from what its tasks return, never from task names: the facts playbooks/bench.yml sets
# (bench_profiles, the profiles in order; bench_done, one entry per profile measured or not; bench_final_profile,
# what the host serves afterwards), the sglang_service role's documented facts (sglang_service_phase and its reason,
# sglang_service_outcome; roles/sglang_service/README.md, Outputs), the modules that ran (setup reaches the host,
# bench_report writes the report, the role router_membership is included) and their registered values
# (each bench_serving level carries its loop variable bench_concurrency; the inventory change carries a diff).
SETUP_ACTIONS = frozenset({"setup", "ansible.builtin.setup", "ansible.legacy.setup", "gather_facts",
                           "ansible.builtin.gather_facts"})
REPORT_ACTION = "bench_report"  # moefleet.serving.bench_report, however the playbook spells it
ROUTER_ROLE = "router_membership"  # included by its name; its tasks file is the event's included_file
ROUTER_TASKS = f"roles/{ROUTER_ROLE}/tasks/main.yml"
LEVEL_VAR = "bench_concurrency"
PHASE_WORDS = {"rolling back": "rolling back", "restoring": "restoring the last good unit"}
_UNSET = object()


def _action(data: dict[str, Any]) -> str:
    return str(data.get("resolved_action") or data.get("task_action") or "")


class SweepProgress:
    """Turns ansible-runner events of playbooks/bench.yml into progress lines."""

    def __init__(self, out: TextIO | None = None, clock=time.localtime) -> None:
        self.out = out
        self.clock = clock
        self.host = ""
        self.profiles: list[str] | None = None  # bench_profiles, once the sweep settled them
        self.done = 0  # profiles measured or given up (bench_done's length)
        self.final: Any = _UNSET  # bench_final_profile, once the sweep decided what the host serves afterwards
        self.routed = False
        self.report: dict[str, Any] | None = None
        self.files: dict[str, Any] | None = None
        self.reached_host = False
        self.input_error: str | None = None
        self.failed: list[str] = []
        self.diffs: list[str] = []

    @property
    def in_sweep(self) -> bool:
        """Between the first profile and the last one's record (a failure there is the profile's, rescued)."""
        return self.profiles is not None and self.done < len(self.profiles) and self.final is _UNSET

    @property
    def position(self) -> str:
        if not self.in_sweep:
            return ""
        return f"profile {self.done + 1} of {len(self.profiles)}: {self.profiles[self.done]}"

    def say(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", self.clock())
        print(f"{stamp}  {text}", file=self.out or sys.stdout, flush=True)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        result = data.get("res") if isinstance(data.get("res"), dict) else {}
        host = data.get("host") or ""
        if kind == "runner_on_start" and host and host != "localhost" and _action(data) in SETUP_ACTIONS:
            if not self.reached_host:
                self.reached_host = True
                self.host = host
                self.say(f"{host}: reading what it serves, planning the sweep")
        elif kind == "playbook_on_include" and str(data.get("included_file") or "").endswith(ROUTER_TASKS):
            self.routers()
        elif kind == "runner_item_on_ok" and result.get("ansible_loop_var") == LEVEL_VAR:
            self.level(result)
        elif kind == "runner_on_ok":
            self.finished(host, _action(data), result)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            task = (data.get("task") or "").strip()
            message = " ".join(str(result.get("msg") or f"task {task!r} failed").split())
            if not self.reached_host:
                self.input_error = self.input_error or message
            elif not self.in_sweep:  # a profile's failure is rescued and said by its record (did not serve)
                self.failed.append(message)
                self.say(f"{host or 'controller'}: failed: {message}")

    def routers(self) -> None:
        """roles/router_membership: out before the first profile, back in once the host serves again."""
        if self.final is _UNSET:
            self.routed = True
            self.say(f"{self.host}: out of the routers for the sweep (its requests finish first)")
        else:
            self.say(f"{self.host}: back into the routers")

    def level(self, result: dict[str, Any]) -> None:
        concurrency = result.get(LEVEL_VAR)
        if result.get("rc") not in (0, None) or result.get("failed"):
            tail = (str(result.get("stderr") or result.get("stdout") or result.get("msg") or "").strip().splitlines()
                    or ["no output"])[-1]
            self.say(f"{self.position}: concurrency {concurrency}: bench_serving exited {result.get('rc')}: {tail}")
            return
        parsed = [r for r in parse_text(str(result.get("stdout") or "")) if r["kind"] == "block"]
        if not parsed:
            self.say(f"{self.position}: concurrency {concurrency}: done (no result block in its output)")
            return
        found = parsed[-1]
        self.say(f"{self.position}: concurrency {concurrency}: {_cell('{:.1f}', found['output_throughput'])} output "
                 f"tok/s, p99 ITL {_cell('{:.1f}', found['p99_itl_ms'])} ms, p99 TTFT "
                 f"{_cell('{:.0f}', found['p99_ttft_ms'])} ms")

    def finished(self, host: str, action: str, result: dict[str, Any]) -> None:
        facts = result.get("ansible_facts") or {}
        if isinstance(facts.get("bench_profiles"), list):
            self.profiles, self.done = [str(name) for name in facts["bench_profiles"]], 0
        if isinstance(facts.get("bench_done"), list) and self.profiles is not None:
            for entry in facts["bench_done"][self.done:]:
                if isinstance(entry, dict) and entry.get("status") != "ok":
                    reason = " ".join(str(entry.get("error") or "").split())
                    said = f"{self.position or entry.get('profile')}: did not serve"
                    self.say(said + (f": {reason}" if reason else ""))
                self.done += 1
        if "bench_final_profile" in facts:
            self.final = facts["bench_final_profile"]
            if self.final is None:
                self.say(f"{host}: stopping SGLang, which served nothing before the sweep"
                         + ("; it stays out of the routers" if self.routed else ""))
            else:
                self.say(f"{host}: serving {self.final} again (what it served before the sweep, or the winner)")
        phase = facts.get("sglang_service_phase")
        if phase == "loading" and self.in_sweep:
            self.say(f"{self.position}: starting")
        elif phase in PHASE_WORDS:
            reason = " ".join(str(facts.get("sglang_service_phase_reason") or "").split())
            where = self.position or host
            self.say(f"{where}: {PHASE_WORDS[phase]}" + (f": {reason}" if reason else ""))
        outcome = facts.get("sglang_service_outcome")
        if isinstance(outcome, dict) and outcome.get("outcome"):
            self.outcome(host, outcome)
        if action.endswith(REPORT_ACTION):
            self.report = result.get("report")
            self.files = result.get("files")
        if result.get("changed") and result.get("diff"):  # the winner written to the inventory (diff: true)
            diff = result["diff"]
            for one in diff if isinstance(diff, list) else [diff]:
                before, after = str(one.get("before") or ""), str(one.get("after") or "")
                if before == after:
                    continue
                self.diffs.append("".join(difflib.unified_diff(
                    before.splitlines(keepends=True), after.splitlines(keepends=True),
                    fromfile=str(one.get("before_header") or "before"),
                    tofile=str(one.get("after_header") or "after"))))

    def outcome(self, host: str, outcome: dict[str, Any]) -> None:
        """The role's recorded outcome: a profile that serves is measured next; after the sweep, where it ended."""
        serving = outcome.get("serving_profile")
        if self.in_sweep:
            if outcome.get("outcome") == "ready" and serving == self.profiles[self.done]:
                self.say(f"{self.position}: serving; measuring")
        elif self.final is not _UNSET and self.routed and (outcome.get("outcome") != "ready" or serving != self.final):
            self.say(f"{host}: stays out of the routers: it does not serve {self.final} as asked (outcome "
                     f"{outcome.get('outcome')}, serving {serving or 'nothing'}); put it back with "
                     "playbooks/rollout.yml once it serves")


def run_sweep(args: argparse.Namespace) -> int:
    from moefleet import runner
    from moefleet.commands.rollout import input_problems, parse_extra_vars

    progress = SweepProgress()
    try:
        extravars = parse_extra_vars(args.extra_vars)
        if args.profiles is not None:
            names = [name.strip() for name in args.profiles.split(",") if name.strip()]
            if not names:
                raise runner.BadInput("--profiles needs one or more profile names, comma-separated (tp8,ep8).")
            extravars["profiles"] = names
        if args.limit:
            extravars["bench_host"] = args.limit
        if args.report is not None:
            base = args.report.expanduser().resolve()
            base = base.with_suffix("") if base.suffix in (".json", ".md", ".csv") else base
        else:
            base = Path.cwd() / "reports" / datetime.now(UTC).strftime("bench-%Y%m%dT%H%M%SZ")
        extravars["bench_report_dir"] = str(base.parent)
        extravars["bench_report_stem"] = base.name
        # The sweep's inputs (-e, --profiles, ...) as playbooks/validate.yml checks them, before anything runs; the
        # profile names against the catalog (extra profiles included) there, before any host is read.
        input_problems(extravars)
        secrets = vault(args)
        outcome = runner.run_playbook("bench.yml", args.inventory, extravars, on_event=progress,
                                      notice=lambda m: print(m, file=sys.stderr), vault=secrets)
    except runner.BadInput as exc:
        print(f"moefleet bench run: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if progress.input_error and not progress.reached_host and not outcome.interrupted:
        print(f"moefleet bench run: {progress.input_error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    markdown = base.with_name(base.name + ".md")
    if progress.report is None or not markdown.is_file():
        print(f"moefleet bench run: the run ended ({outcome.status}, rc {outcome.rc}) without writing its report "
              f"{base}.json.", file=sys.stderr)
        return EXIT_INTERRUPTED if outcome.interrupted else EXIT_NOT_DONE
    with contextlib.suppress(OSError):
        print("\n" + markdown.read_text(encoding="utf-8").rstrip())
    for diff in progress.diffs:
        print("\nInventory changed:\n" + diff.rstrip())
    plots = (progress.files or {}).get("plots") or []
    print(f"\nReport: {base}.json, .csv, .md" + ("".join(f", {Path(p).name}" for p in plots)))
    if (progress.files or {}).get("plots_skipped"):
        print(f"No plots: {progress.files['plots_skipped']}.")
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if outcome.rc == 0 and outcome.status == "successful" else EXIT_NOT_DONE
