"""moefleet status: what every host serves, from playbooks/status.yml (local facts, health, /server_info)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from moefleet import runner
from moefleet.commands._common import LEGACY_MARK, LEGACY_NOTE, add_target_arguments, utc_text, vault

EXIT_OK, EXIT_DRIFT, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_NOT_SERVING = EXIT_DRIFT  # the name before drift had its own words


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="per host: what it serves against what it was asked, its outcome, health and last rollback",
        description=(
            "Run playbooks/status.yml through ansible-runner (it changes nothing on the hosts) and print, per "
            "host, the profile serving, the one asked for, the outcome (ready: serves what it was asked; "
            "degraded: a fallback serves; restored: the last unit that served runs instead; failed: the last "
            "run left nothing serving; down: not serving now; unknown: unreachable or no moefleet facts), "
            "health (serving, starting, down, unreachable; with --probe wrong_output: it serves but fails the "
            "correctness gate), with routers its state in them (ready, draining, "
            "out, unroutable: listed under another model, unknown), "
            "the last rollback and failures while serving, then one line saying how many hosts "
            "serve what they were asked and what the others do. Times are UTC. --json prints the document "
            "(schemas/status.schema.json) instead. Exit status: 0 only when every host serves what it was "
            "asked and every router routes to it; 1 when a host drifted, does not serve or is unroutable, when "
            "the inventory has no host in group blackwell, or when the run wrote no status document; 2 on input "
            "errors (no such inventory, a --limit that matches no host, a vault password file that is not "
            "there); 3 when a host was unreachable (before 1)."
        ),
    )
    add_target_arguments(parser, "only these hosts (Ansible's --limit pattern)")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of a table")
    parser.add_argument("--probe", action="store_true",
                        help="also check what clients get from each serving host (the correctness gate: a thinking "
                             "and an instant chat, a tool call, a known answer, no garbage); a host that answers "
                             "wrongly has the health wrong_output and exits 1")
    parser.set_defaults(func=run)


class Failures:
    """Keeps the first failure message of the run, to say why no document came back, and who was unreachable."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.unreachable: dict[str, str] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
            return
        data = event.get("event_data") or {}
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        message = " ".join(str(res.get("msg", "failed")).split())
        if event.get("event") == "runner_on_unreachable" and data.get("host"):
            self.unreachable.setdefault(str(data["host"]), message)
        if self.first is None:
            self.first = f"{data.get('host')}: {message}"


class NoDocument(RuntimeError):
    """The status playbook wrote no document; ``unreachable`` names the hosts it could not reach."""

    def __init__(self, message: str, unreachable: dict[str, str]) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def collect(
    inventory: str | None, limit: str | None = None, secrets: runner.Vault | None = None, probe: bool = False
) -> dict[str, Any]:
    """The status document (its hosts, and with Prometheus where it is); runner.BadInput for bad input, NoDocument
    when the run gave none."""
    with tempfile.TemporaryDirectory(prefix="moefleet-status-") as tmp:
        path = Path(tmp) / "status.json"
        failures = Failures()
        outcome = runner.run_playbook(
            "status.yml",
            inventory,
            {"moefleet_status_path": str(path), **({"moefleet_status_probe": True} if probe else {})},
            on_event=failures,
            notice=lambda m: print(m, file=sys.stderr),
            limit=limit,
            vault=secrets,
        )
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(document.get("hosts"), list):
                raise ValueError("no hosts")
            return document
        except (OSError, ValueError, AttributeError):
            if failures.first is None and limit and outcome.rc not in (None, 0, 4):
                raise runner.BadInput(f"--limit {limit}: no host of the inventory matches it.") from None
            why = failures.first or f"{outcome.status}, rc {outcome.rc}"
            raise NoDocument(f"the status playbook wrote no document ({why}).", failures.unreachable) from None


def exit_code(hosts: list[dict[str, Any]]) -> int:
    """0 only when every host serves what it was asked; 3 when one was unreachable; 1 otherwise."""
    if any(h.get("health") == "unreachable" for h in hosts):
        return EXIT_UNREACHABLE
    routable = all(h.get("router") != "unroutable" for h in hosts)
    return EXIT_OK if hosts and routable and all(state_of(h) == "ready" for h in hosts) else EXIT_DRIFT


def run(args: argparse.Namespace) -> int:
    try:
        document = collect(args.inventory, getattr(args, "limit", None), vault(args), getattr(args, "probe", False))
    except runner.BadInput as exc:
        print(f"moefleet status: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NoDocument as exc:
        print(f"moefleet status: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.unreachable else EXIT_DRIFT
    hosts = document["hosts"]
    print(json.dumps(document, indent=2) if args.json
          else render_table(hosts) + "\n" + summary(hosts) + p2p_notes(hosts)
          + monitoring_note(document.get("monitoring")))
    return exit_code(hosts)


def monitoring_note(monitoring: dict[str, Any] | None) -> str:
    """Where Prometheus and the dashboards are, when the fleet has them (docs/monitoring.md)."""
    if not monitoring:
        return ""
    where = f"; dashboards to import into Grafana: {monitoring['dashboards']}" if monitoring.get("dashboards") else ""
    return f"\nLive figures from Prometheus at {monitoring['prometheus']}{where}."


def _p2p(entry: Any) -> str:
    """The p2p column: the P2P preflight's last verdict, with the P2P bus bandwidth it measured or the set served."""
    if not isinstance(entry, dict):
        return "-"
    verdict = str(entry.get("verdict"))
    busbw = (entry.get("bandwidths") or {}).get("p2p_busbw_gbps")
    if verdict == "pcie_p2p" and isinstance(busbw, (int, float)):
        return f"pcie_p2p {busbw:g} GB/s"
    if entry.get("contradiction"):
        return f"{verdict} (pinned {entry.get('nccl_set')} kept)"
    return verdict


def p2p_notes(hosts: list[dict[str, Any]]) -> str:
    """One line per host whose P2P preflight did not keep P2P, or whose pinned set contradicts it: why, and the fix."""
    lines = []
    for host in hosts:
        entry = host.get("p2p")
        if not isinstance(entry, dict) or (entry.get("verdict") == "pcie_p2p" and not entry.get("contradiction")):
            continue
        served = entry.get("nccl_set")
        what = entry.get("contradiction") or f"{entry.get('verdict')}: {entry.get('reason')}"
        lines.append(f"{host.get('host')}: P2P preflight {utc_text(entry.get('when'))}: {what}"
                     + (f" Serving {served}." if served else " Nothing was started.")
                     + (f" Fix: {entry['fix']}" if entry.get("fix") else ""))
    return "".join("\n" + line for line in lines)


def state_of(host: dict[str, Any]) -> str:
    """The entry's state (host_state.host_outcome); a document from before it was added: derived the same way."""
    if host.get("state"):
        return str(host["state"])
    from ansible_collections.moefleet.serving.plugins.module_utils.host_state import host_outcome  # noqa: PLC0415

    return host_outcome(str(host.get("health")), host.get("outcome"), host.get("serving_profile"),
                        host.get("asked_profile"))


def _drift(host: dict[str, Any]) -> str:
    name, state = host.get("host"), state_of(host)
    asked, serving = host.get("asked_profile"), host.get("serving_profile")
    if host.get("health") == "unreachable":
        return f"{name} unreachable"
    if state == "unknown":
        return f"{name} has no moefleet facts (never deployed by moefleet?)"
    if state == "unhealthy":
        fault = host.get("fault") or {}
        return (f"{name} is unhealthy since {utc_text(fault.get('since'))} ({fault.get('reason')}): "
                + ("it needs hardware attention" if fault.get("state") == "hardware" else "run moefleet remediate"))
    if state in ("restored", "degraded"):
        return f"{name} {state} to {serving or 'nothing'} (asked {asked})"
    if state == "failed":
        return f"{name} failed (asked {asked}, serves nothing)"
    answers = host.get("answers") or {}
    if host.get("health") == "wrong_output":
        return f"{name} answers wrongly (check {answers.get('failed_check')} failed: {answers.get('evidence')})"
    return f"{name} {host.get('health') or 'down'} (asked {asked}, unit {host.get('unit') or 'unknown'})"


def summary(hosts: list[dict[str, Any]]) -> str:
    """``2 of 3 hosts serve what they were asked; lab-2 restored to tp8 (asked ep8)``, and the note on times
    recorded without a zone when the table shows one."""
    if not hosts:
        return "No host matched: nothing to report."
    ready = sum(1 for h in hosts if state_of(h) == "ready")
    one = len(hosts) == 1
    line = f"{ready} of {len(hosts)} host{'' if one else 's'} {'serves' if one else 'serve'} what " + (
        "it was asked" if one else "they were asked")
    others = [_drift(h) for h in hosts if state_of(h) != "ready"] + [
        f"{h.get('host')} is unroutable: a router lists it under another model (set sglang_router_worker_api_key "
        "to the workers' key and run the rollout again)" for h in hosts if h.get("router") == "unroutable"]
    return line + ("; " + "; ".join(others) if others else ".")


def _rollback(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "-"
    reason = f" ({entry['reason']})" if entry.get("reason") else ""
    return f"{utc_text(entry.get('time'))} {entry.get('from')} -> {entry.get('to')}{reason}".strip()


def _runtime(host: dict[str, Any]) -> str:
    """Failures while serving (the unit's exit hook): OOMs recorded, and the last failure."""
    last = host.get("last_runtime_failure")
    if not isinstance(last, dict):
        return "-"
    what = f"{last.get('state')} ({last.get('phase') or last.get('cause')})"
    return f"{host.get('runtime_ooms') or 0} OOM(s), last {utc_text(last.get('time'))} {what}"


def _live(figures: dict[str, Any] | None) -> str:
    """Prometheus's running requests, KV-cache use and TTFT p99 of a host ("-" where it has none)."""
    if not figures:
        return "-"
    running, kv, ttft = (figures.get(k) for k in ("running_requests", "kv_usage", "ttft_p99_seconds"))
    return " / ".join(("-" if running is None else f"{running:g}", "-" if kv is None else f"{kv:.0%}",
                       "-" if ttft is None else f"{ttft:.2f} s"))


def _outcome(host: dict[str, Any]) -> str:
    """The outcome column: the state, and for an unhealthy host why ("unhealthy (gpu 3: Xid 79 ...)")."""
    fault = host.get("fault")
    if state_of(host) == "unhealthy" and isinstance(fault, dict):
        return f"unhealthy ({fault.get('reason') or fault.get('state')})"
    return state_of(host)


def render_table(hosts: list[dict[str, Any]]) -> str:
    """One line per host; a fleet with routers gets a "router" column (ready, draining, out, unroutable,
    unknown), a fleet where a deploy ran the P2P preflight a "p2p" column (its last verdict), and a fleet whose
    servers report more than one SGLang release (an upgrade under way, or a host
    restored to the release it ran before) a "sglang" column after the profile it serves."""
    routed = any("router" in h for h in hosts)
    live = any("live" in h for h in hosts)
    p2p = any("p2p" in h for h in hosts)
    mixed = len({h.get("release") for h in hosts if h.get("release")}) > 1
    header = ("host", "serving", *(("sglang",) if mixed else ()), "asked", "outcome", "health",
              *(("router",) if routed else ()),
              *(("running / KV / TTFT p99",) if live else ()), *(("p2p",) if p2p else ()), "last rollback",
              "while serving")
    body = [
        (
            str(h.get("host")),
            h.get("serving_profile") or "-",
            *((h.get("release") or "-",) if mixed else ()),
            h.get("asked_profile") or "-",
            _outcome(h),
            h.get("health") or "-",
            *((h.get("router") or "-",) if routed else ()),
            *((_live(h.get("live")),) if live else ()),
            *((_p2p(h.get("p2p")),) if p2p else ()),
            _rollback(h.get("last_rollback")),
            _runtime(h),
        )
        for h in hosts
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()

    lines = [fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(line) for line in body)]
    if any(f"UTC{LEGACY_MARK}" in cell for line in body for cell in line):
        lines.append(LEGACY_NOTE)
    return "\n".join(lines)
