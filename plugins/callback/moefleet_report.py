"""Callback plugin moefleet_report: where every host of a rollout ended, as JSON and Markdown.

The rollout stops at the first failed host (any_errors_fatal), so no later play could write the report:
this callback collects it from the run's events and writes it when the run ends.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: moefleet_report
type: aggregate
short_description: Write a rollout report (host, asked and serving profile, outcome, OOMs, seconds)
description:
  - Follows the hosts of the play that serves SGLang (the play that runs the moefleet roles) and, when the
    run ends, writes C(rollout-<UTC time>.json) and C(.md) into C(moefleet_report_dir), or exactly
    C(<moefleet_report_path>.json) and C(.md), and prints the summary table.
  - Active only when a play has the variable C(moefleet_report_dir), when the extra variable
    C(moefleet_report_path) is set, or when the playbook file is C(rollout.yml) (directory C(reports)).
  - A host's outcome is the C(sglang_service_outcome) fact the role C(sglang_service) sets (ready, degraded,
    restored, failed), else failed or unreachable from its results, untouched when the run stopped before its
    batch, stopped when it was reached but the run ended before it finished.
  - When the file named by the environment variable C(MOEFLEET_STOP_FILE) exists at the start of a task, the
    report is written and the run ends before that task starts (how C(moefleet rollout) stops on Ctrl-C);
    except while a host's C(sglang_service_phase) fact says a start is under way (loading, rolling back,
    restoring; until done), so that a start, its rollback or restore and the record of its outcome run to
    their end first.
  - C(moefleet_report_dir) (a play variable) is relative to the working directory; C(moefleet_report_path)
    (an extra variable) is the report's path without extension.
  - The report also records the inventory source(s), the extra variables (C(-e)) with secrets redacted (a key
    naming a token, key, password, secret or vault, and any vault-encrypted value, at any depth; a redacted
    value is removed from every message too), the collection's version, each host's batch (the canary
    marked), and, when the fleet is left mixed, next steps (which hosts serve what, the commands to resume
    or to roll back). Messages are kept whole.
requirements:
  - enabled in ansible.cfg (callbacks_enabled = moefleet.serving.moefleet_report)
"""

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from ansible.plugins.callback import CallbackBase
from ansible_collections.moefleet.serving.plugins.module_utils.playbook_inputs import batches
from ansible_collections.moefleet.serving.plugins.module_utils.rollout_report import (
    collection_version,
    next_steps,
    one_line,
    redact,
    render_markdown,
    render_text,
    scrub,
)

# What a host does comes from the documented fact sglang_service_phase (roles/sglang_service/README.md, Outputs),
# never from task or role names: playbooks/serve.yml sets "installing" first, which marks the play that installs
# and serves; the role sets "loading", "rolling back" or "restoring" once a start is under way and "done" once the
# outcome is recorded. A stop request waits while any host is under way: none is left half-way through a start,
# a rollback or a restore.
_PHASE_INSTALLING = "installing"
_PHASES_UNDER_WAY = frozenset({"loading", "rolling back", "restoring"})
_DEFAULT_DIR_PLAYBOOKS = {"rollout.yml": "reports"}
_FINAL = ("ready", "degraded", "restored", "failed")


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else None


_HIDDEN = "(hidden: the task is no_log)"


def _handled_by_rescue(task) -> bool:
    """Whether the task sits in the block part of a block that has a rescue section."""
    child, parent = task, getattr(task, "_parent", None)
    while parent is not None:
        if getattr(parent, "rescue", None) and any(
            getattr(t, "_uuid", None) == child._uuid for t in getattr(parent, "block", None) or []
        ):
            return True
        child, parent = parent, getattr(parent, "_parent", None)
    return False


# What the report keeps of a host's P2P preflight (roles/sglang_service: sglang_service_p2p).
_P2P_KEYS = ("verdict", "reason", "fix", "bandwidths", "cached", "nccl_set", "contradiction")


class _Host:
    """What the run showed of one host."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reached = False
        self.start: float | None = None
        self.end: float | None = None
        self.outcome: dict | None = None
        self.failed = False
        self.unreachable = False
        self.message = ""
        self.serving_before: str | None = None
        self.asked: str | None = None
        self.p2p: dict | None = None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "moefleet.serving.moefleet_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clock = time.time
        self._stop_file = os.environ.get("MOEFLEET_STOP_FILE")
        self._reset()

    def _reset(self) -> None:
        self._playbook = ""
        # Each host's last sglang_service_phase: a stop request waits while one is under way.
        self._phases: dict[str, str] = {}
        self._started: float | None = None
        self._report_dir: str | None = None
        self._report_path: str | None = None
        self._asked_profile: str | None = None
        self._inventory = None
        self._play_pattern = ""
        self._play_is_serve = False
        self._play_first_task: dict[str, float] = {}
        self._run_failed = False
        self._serve_patterns: list[str] = []
        self._other_patterns: list[str] = []
        self._hosts: dict[str, _Host] = {}
        # -e values as the report shows them (secrets redacted) and the secret strings kept out of every message
        self._extra_vars: dict = {}
        self._secrets: set[str] = set()
        self._inventory_sources: list[str] = []
        # The serving play's batches (per host pattern), cut from its serial as ansible-core cuts them
        self._batches: dict[str, list[list[str]]] = {}
        self._play_batches: list[list[str]] = []
        self._written = False
        self.report_files: tuple[Path, Path] | None = None

    # -- collecting ---------------------------------------------------------------------------------------

    def _host(self, name: str) -> _Host:
        if name not in self._hosts:
            self._hosts[name] = _Host(name)
        return self._hosts[name]

    def v2_playbook_on_start(self, playbook) -> None:
        self._reset()
        self._playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")
        self._started = self._clock()
        self._report_dir = _DEFAULT_DIR_PLAYBOOKS.get(self._playbook)

    def v2_playbook_on_play_start(self, play) -> None:
        # Sent once per batch: the serve play starts again for every batch of hosts.
        manager = play.get_variable_manager()
        extra = dict(getattr(manager, "extra_vars", {}) or {})
        play_vars = dict(play.get_vars() or {})
        if extra.get("moefleet_report_path"):
            self._report_path = str(extra["moefleet_report_path"])
        if play_vars.get("moefleet_report_dir"):
            self._report_dir = str(play_vars["moefleet_report_dir"])
        if extra.get("profile") is not None:
            self._asked_profile = str(extra["profile"])
        self._extra_vars = redact(extra, self._secrets)
        self._inventory = getattr(manager, "_inventory", None)
        self._inventory_sources = self._sources()
        self._play_pattern = play.hosts if isinstance(play.hosts, str) else ",".join(map(str, play.hosts or []))
        self._play_batches = self._plan_batches(play)
        self._play_first_task = {}
        self._play_is_serve = False
        if self._play_pattern in self._serve_patterns:
            self._mark_serve_play()
        elif self._play_pattern not in self._other_patterns:
            self._other_patterns.append(self._play_pattern)

    def _sources(self) -> list[str]:
        """The inventory source(s) the run parsed (-i, or ansible.cfg's default)."""
        sources = getattr(self._inventory, "_sources", None)
        if not sources:
            try:
                from ansible import context

                sources = context.CLIARGS.get("inventory")
            except Exception:  # noqa: BLE001 - no CLI arguments (a callback driven by a test or an API)
                sources = None
        if isinstance(sources, str):
            sources = [sources]
        return [str(source) for source in sources or []]

    def _plan_batches(self, play) -> list[list[str]]:
        if self._inventory is None:
            return []
        try:
            hosts = self._inventory.get_hosts(self._play_pattern, ignore_restrictions=True, order=play.order)
        except (AttributeError, TypeError):
            hosts = self._inventory.get_hosts(self._play_pattern, ignore_restrictions=True)
        try:
            return batches([h.get_name() for h in hosts], getattr(play, "serial", None))
        except Exception:  # noqa: BLE001 - a serial value ansible-core itself would refuse: no batches known
            return []

    def _batch_of(self, name: str) -> int | None:
        for pattern in self._serve_patterns:
            for number, batch in enumerate(self._batches.get(pattern, []), start=1):
                if name in batch:
                    return number
        return None

    def _mark_serve_play(self) -> None:
        """This play installs and serves: its hosts count as reached from their first task in it."""
        self._play_is_serve = True
        if self._play_pattern not in self._serve_patterns:
            self._serve_patterns.append(self._play_pattern)
        self._batches.setdefault(self._play_pattern, self._play_batches)
        for name, started in self._play_first_task.items():
            entry = self._host(name)
            entry.reached = True
            entry.start = min(entry.start or started, started)

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        under_way = any(phase in _PHASES_UNDER_WAY for phase in self._phases.values())
        if self._stop_file and os.path.exists(self._stop_file) and not under_way:
            self._stop_before(task)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_runner_on_start(self, host, task) -> None:
        name = host.get_name()
        self._play_first_task.setdefault(name, self._clock())
        if self._play_is_serve:
            self._mark_serve_play()

    def _result(self, result, status: str) -> None:
        name = result.host.get_name()
        data = result._result
        facts = data.get("ansible_facts") or {}
        action = getattr(result.task, "action", "") or ""
        if action.endswith("resolve_profiles") and isinstance(data.get("hosts"), dict):
            for host, resolved in data["hosts"].items():
                if isinstance(resolved, dict) and resolved.get("name"):
                    self._host(host).asked = str(resolved["name"])
        if status == "unreachable":
            # Unreachable in any play: the host was tried and could not be managed.
            entry = self._host(name)
            entry.reached = entry.unreachable = True
            entry.start = entry.start or self._play_first_task.get(name, self._clock())
            entry.end = self._clock()
            entry.message = self._message(data)
            return
        phase = facts.get("sglang_service_phase")
        if isinstance(phase, str):
            self._phases[name] = phase
            if phase == _PHASE_INSTALLING and not self._play_is_serve:
                self._mark_serve_play()
        if not (self._play_is_serve or facts):
            return
        entry = self._host(name)
        local = (facts.get("ansible_local") or {}).get("moefleet") or {}
        if local.get("serving_profile") and not entry.reached:
            entry.serving_before = str(local["serving_profile"])
        if isinstance(facts.get("sglang_service_outcome"), dict):
            entry.outcome = facts["sglang_service_outcome"]
        if isinstance(facts.get("sglang_service_p2p"), dict):
            entry.p2p = facts["sglang_service_p2p"]
        if not self._play_is_serve:
            return
        entry.end = self._clock()
        if status == "failed":
            entry.message = self._message(data)
            if not _handled_by_rescue(result.task):
                entry.failed = True

    def _message(self, data: dict) -> str:
        if data.get("_ansible_no_log") or data.get("censored"):
            return _HIDDEN
        return scrub(one_line(data.get("msg", "")), self._secrets)

    def v2_runner_on_ok(self, result) -> None:
        self._result(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._result(result, "ok" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result) -> None:
        self._result(result, "unreachable")

    def v2_runner_on_skipped(self, result) -> None:
        self._result(result, "skipped")

    def v2_playbook_on_stats(self, stats) -> None:
        # The stats know which failures a rescue handled: only the others count.
        failures, dark = getattr(stats, "failures", {}) or {}, getattr(stats, "dark", {}) or {}
        for name, entry in self._hosts.items():
            entry.failed = bool(failures.get(name))
            entry.unreachable = entry.unreachable or bool(dark.get(name))
        self._run_failed = any(failures.values()) or any(dark.values())
        self._finish(stopped_by=None)

    # -- stopping on request ------------------------------------------------------------------------------

    def _stop_before(self, task) -> None:
        """Write the report and end the run before this task starts on any host."""
        self._finish(stopped_by=f"stopped on request before task {task.get_name()!r}")
        raise KeyboardInterrupt

    # -- reporting ----------------------------------------------------------------------------------------

    def _active(self) -> bool:
        return bool(self._report_path or self._report_dir)

    def _serve_hosts(self) -> list[str]:
        patterns = self._serve_patterns or [p for p in self._other_patterns if p not in ("localhost", "127.0.0.1")]
        names: list[str] = []
        for pattern in patterns:
            hosts = self._inventory.get_hosts(pattern, ignore_restrictions=True) if self._inventory else []
            names += [h.get_name() for h in hosts if h.get_name() not in names]
        names += [n for n, e in self._hosts.items() if e.reached and n not in names]
        return names

    def build_report(self, stopped_by: str | None) -> dict:
        rows = [self._row(self._host(name), stopped_by) for name in self._serve_hosts()]
        finished = all(row["outcome"] in ("ready", "degraded", "restored") for row in rows)
        complete = not stopped_by and not self._run_failed and finished
        asked = self._asked_profile or next((row["asked_profile"] for row in rows if row["asked_profile"]), None)
        ended = self._clock()
        report = {
            "playbook": self._playbook,
            "asked_profile": asked,
            "started": _iso(self._started),
            "ended": _iso(ended),
            "seconds": round(ended - self._started, 1) if self._started else None,
            "result": "complete" if complete else "stopped",
            "stopped_by": scrub(stopped_by, self._secrets) if stopped_by else stopped_by,
            "moefleet_version": collection_version(),
            "inventory": self._inventory_sources,
            "extra_vars": self._extra_vars,
            "hosts": rows,
        }
        previous = {name: entry.serving_before for name, entry in self._hosts.items() if entry.serving_before}
        report["next_steps"] = next_steps(report, previous)
        return report

    def _row(self, entry: _Host, stopped_by: str | None) -> dict:
        outcome = entry.outcome or {}
        if not entry.reached:
            state = "untouched"
        elif entry.unreachable:
            state = "unreachable"
        elif outcome.get("outcome") in _FINAL and (outcome["outcome"] != "ready" or not entry.failed):
            state = outcome["outcome"]
        elif entry.failed:
            state = "failed"
        else:
            state = "stopped"
        serving = outcome.get("serving_profile") or (entry.serving_before if not entry.reached else None)
        batch = self._batch_of(entry.name)
        return {
            "host": entry.name,
            "batch": batch,
            # deploy.yml starts every host at once: no canary there, whatever the host count
            "canary": self._playbook != "deploy.yml" and batch == 1 and len((self._serve_batches() or [[]])[0]) == 1,
            "asked_profile": outcome.get("asked_profile") or entry.asked or self._asked_profile,
            "serving_profile": serving,
            "outcome": state,
            "ooms": int(outcome.get("ooms") or 0),
            "seconds": round(entry.end - entry.start, 1) if entry.reached and entry.start and entry.end else None,
            "started": _iso(entry.start) if entry.reached else None,
            "ended": _iso(entry.end) if entry.reached else None,
            "message": entry.message or (scrub(stopped_by or "", self._secrets) if state == "stopped" else ""),
            # an upgrade's benchmark of the old and the new release (roles/sglang_service, release_compare.py)
            "release_compare": outcome.get("release_compare") if isinstance(outcome.get("release_compare"), dict)
            else None,
            # the P2P preflight's verdict before the model load (roles/sglang_service, p2p_preflight_step's record)
            "p2p": {key: entry.p2p.get(key) for key in _P2P_KEYS} if entry.p2p else None,
        }

    def _serve_batches(self) -> list[list[str]]:
        return [batch for pattern in self._serve_patterns for batch in self._batches.get(pattern, [])]

    def _finish(self, stopped_by: str | None) -> None:
        if self._written or not self._active():
            return
        self._written = True
        report = self.build_report(stopped_by)
        if self._report_path:
            base = Path(self._report_path)
        else:
            stamp = datetime.fromtimestamp(self._started or self._clock(), UTC).strftime("%Y%m%dT%H%M%SZ")
            base = Path(self._report_dir or "reports") / f"rollout-{stamp}"
        json_path, md_path = base.with_name(base.name + ".json"), base.with_name(base.name + ".md")
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            md_path.write_text(render_markdown(report), encoding="utf-8")
        except OSError as exc:
            self._display.warning(f"moefleet_report: cannot write the report under {base.parent}: {exc.strerror}.")
            return
        self.report_files = (json_path, md_path)
        self._display.display(render_text(report))
        self._display.display(f"Report: {json_path.resolve()} and {md_path.name}")
