"""The moefleet_report callback fed with synthetic events, in the order a rollout sends them; the report logic it
shares with the CLI (module_utils/rollout_report.py: rendering, next steps, redaction) through it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import rollout_report
from ansible_collections.moefleet.serving.plugins.module_utils.playbook_inputs import batches

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "callback" / "moefleet_report.py"


def load_plugin():
    spec = importlib.util.spec_from_file_location("moefleet_report_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plugin = load_plugin()


class Display:
    verbosity = 0

    def __init__(self) -> None:
        self.lines: list[str] = []

    def display(self, msg: str, *args, **kwargs) -> None:
        self.lines.append(msg)

    def warning(self, msg: str, *args, **kwargs) -> None:
        self.lines.append("WARNING " + msg)


class Clock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


class Host:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


class Inventory:
    def __init__(self, groups: dict[str, list[str]]) -> None:
        self.groups = groups
        self._sources = ["/srv/moefleet/inventory/sim"]

    def get_hosts(self, pattern, ignore_restrictions=False):
        return [Host(n) for n in self.groups.get(pattern, [pattern])]


class Play:
    def __init__(
        self, hosts: str, inventory: Inventory, extra: dict, play_vars: dict | None = None, serial=None
    ) -> None:
        self.hosts = hosts
        self.serial = serial or []
        self._manager = SimpleNamespace(extra_vars=extra, _inventory=inventory)
        self._vars = play_vars or {}

    def get_variable_manager(self):
        return self._manager

    def get_vars(self):
        return dict(self._vars)


class Role:
    """Like ansible-core's Role: get_name() is moefleet.serving.<role> when the role runs from the collection."""

    def __init__(self, name: str) -> None:
        self.collection, _, self.name = name.rpartition(".")

    def get_name(self, include_role_fqcn: bool = True) -> str:
        return f"{self.collection}.{self.name}" if include_role_fqcn and self.collection else self.name


_uuid = iter(range(1, 10_000))


class Task:
    def __init__(self, name: str, role: str | None = None, action: str = "debug", parent=None, path: str = "") -> None:
        self.name = name
        self.path = path
        self._role = Role(role) if role else None
        self.action = action
        self._parent = parent
        self._uuid = str(next(_uuid))

    def get_name(self) -> str:
        return self.name

    def get_path(self) -> str:
        return self.path


class Block:
    """A block with a rescue section around the given tasks."""

    def __init__(self, tasks: list[Task]) -> None:
        self.block = tasks
        self.rescue = [Task("rescue")]
        self._parent = None
        for task in tasks:
            task._parent = self


def result(host: str, task: Task, data: dict) -> SimpleNamespace:
    return SimpleNamespace(host=Host(host), task=task, _result=data)


HOSTS = ["lab-1", "lab-2", "lab-3"]
# Any task name: the callback reads the sglang_service_phase fact a task sets, not the task.
PHASE_TASK = Task("a set_fact", action="ansible.builtin.set_fact")


def phase(name: str) -> dict:
    return {"ansible_facts": {"sglang_service_phase": name, "sglang_service_phase_reason": ""}}
OUTCOME_TASK = Task("Summarize this run", role="sglang_service", action="ansible.builtin.set_fact")
FAIL_TASK = Task("Fail a host that does not serve the asked profile", role="sglang_service", action="fail")


class Run:
    """Drives a callback instance the way ansible-playbook does."""

    def __init__(self, extra: dict | None = None, playbook: str = "playbooks/rollout.yml", stop_file=None):
        self.cb = plugin.CallbackModule(display=Display())
        self.clock = Clock()
        self.cb._clock = self.clock
        self.cb._stop_file = str(stop_file) if stop_file else None
        self.inventory = Inventory({"blackwell": HOSTS})
        self.extra = {"profile": "ep8", **(extra or {})}
        self.cb.v2_playbook_on_start(SimpleNamespace(_file_name=playbook))

    def play(self, pattern: str, play_vars: dict | None = None, serial=None) -> None:
        self.cb.v2_playbook_on_play_start(Play(pattern, self.inventory, self.extra, play_vars, serial))

    def task(self, task: Task, hosts: list[str], data: dict | None = None, status: str = "ok") -> None:
        self.cb.v2_playbook_on_task_start(task, False)
        for host in hosts:
            self.cb.v2_runner_on_start(Host(host), task)
        self.clock.tick(5)
        for host in hosts:
            res = result(host, task, dict(data or {}))
            {
                "ok": self.cb.v2_runner_on_ok,
                "failed": self.cb.v2_runner_on_failed,
                "unreachable": self.cb.v2_runner_on_unreachable,
                "skipped": self.cb.v2_runner_on_skipped,
            }[status](res)

    def validate_and_confirm(self, serving: dict[str, str]) -> None:
        self.play("localhost")
        resolved = {h: {"name": "ep8"} for h in HOSTS}
        self.task(Task("Validate the catalog", action="resolve_profiles"), ["localhost"], {"hosts": resolved})
        self.play("blackwell")
        for host in HOSTS:
            facts = {"ansible_local": {"moefleet": {"serving_profile": serving[host]}}} if host in serving else {}
            self.task(Task("Read what each host serves", action="setup"), [host], {"ansible_facts": facts})

    def serve_batch(self, hosts: list[str], outcomes: dict[str, dict]) -> None:
        self.play("blackwell", serial=[1, "25%", "100%"])  # playbooks/rollout.yml's moefleet_serial
        self.task(Task("Gathering Facts", action="gather_facts"), hosts, {"ansible_facts": {}})
        self.task(PHASE_TASK, hosts, phase("installing"))  # playbooks/serve.yml's first task
        self.task(Task("Install the driver", role="nvidia_driver"), hosts)
        for host in hosts:
            if host in outcomes:
                self.task(OUTCOME_TASK, [host], {"ansible_facts": {"sglang_service_outcome": outcomes[host]}})

    def stats(self, failures: dict | None = None, dark: dict | None = None) -> None:
        self.cb.v2_playbook_on_stats(SimpleNamespace(failures=failures or {}, dark=dark or {}))


def ready(profile: str = "ep8") -> dict:
    return {"asked_profile": profile, "serving_profile": profile, "outcome": "ready", "ooms": 0, "attempts": 1}


REPORT_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "rollout_report.schema.json").read_text())


def read(base: Path) -> dict:
    """The report the callback wrote, which every test here also holds to its documented schema."""
    report = json.loads(base.with_name(base.name + ".json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    return report


def test_complete_rollout_writes_json_and_markdown_at_the_given_path(tmp_path):
    base = tmp_path / "out" / "r1"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({})
    run.serve_batch(["lab-1"], {"lab-1": ready()})
    run.serve_batch(["lab-2"], {"lab-2": ready()})
    run.serve_batch(["lab-3"], {"lab-3": ready()})
    run.stats()

    report = read(base)
    assert report["result"] == "complete"
    assert report["asked_profile"] == "ep8"
    assert [(h["host"], h["outcome"], h["serving_profile"], h["ooms"]) for h in report["hosts"]] == [
        ("lab-1", "ready", "ep8", 0),
        ("lab-2", "ready", "ep8", 0),
        ("lab-3", "ready", "ep8", 0),
    ]
    # Each host: gather facts, the phase, one install task, the outcome (5 s each); the confirmation play does
    # not count.
    assert [h["seconds"] for h in report["hosts"]] == [20.0, 20.0, 20.0]
    markdown = (tmp_path / "out" / "r1.md").read_text()
    assert "| lab-2 | ep8 | ep8 | ready | 0 | 20.0 |" in markdown
    assert "**complete**" in markdown
    shown = "\n".join(run.cb._display.lines)
    assert "complete, 3/3 host(s)" in shown and str(base) + ".json" in shown


def test_failed_canary_stops_and_later_hosts_are_untouched_on_their_old_profile(tmp_path):
    base = tmp_path / "r2"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({"lab-1": "tp8", "lab-2": "tp8", "lab-3": "tp8"})
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.serve_batch(["lab-1"], {"lab-1": restored})
    run.task(FAIL_TASK, ["lab-1"], {"msg": "lab-1 does not serve ep8:\n outcome restored"}, status="failed")
    run.stats(failures={"lab-1": 1})

    report = read(base)
    assert report["result"] == "stopped"
    rows = {h["host"]: h for h in report["hosts"]}
    assert rows["lab-1"]["outcome"] == "restored"
    assert rows["lab-1"]["serving_profile"] == "tp8"
    assert rows["lab-1"]["ooms"] == 1
    assert rows["lab-1"]["message"] == "lab-1 does not serve ep8: outcome restored"
    for host in ("lab-2", "lab-3"):
        assert rows[host]["outcome"] == "untouched"
        assert rows[host]["serving_profile"] == "tp8"
        assert rows[host]["asked_profile"] == "ep8"
        assert rows[host]["seconds"] is None
    assert "untouched (never reached: later batch)" in (tmp_path / "r2.md").read_text()


def test_a_rescued_failure_is_not_the_host_failing(tmp_path):
    base = tmp_path / "r3"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({})
    run.serve_batch(["lab-1"], {})
    wait = Task("Wait until SGLang serves the profile", role="sglang_service", action="sglang_readiness")
    Block([wait])
    run.task(wait, ["lab-1"], {"msg": "oom"}, status="failed")
    degraded = {"asked_profile": "ep8", "serving_profile": "tp2ep4", "outcome": "degraded", "ooms": 1}
    run.task(OUTCOME_TASK, ["lab-1"], {"ansible_facts": {"sglang_service_outcome": degraded}})
    assert not run.cb._hosts["lab-1"].failed
    run.serve_batch(["lab-2", "lab-3"], {"lab-2": ready(), "lab-3": ready()})
    run.stats()

    report = read(base)
    assert report["result"] == "complete"
    assert [h["outcome"] for h in report["hosts"]] == ["degraded", "ready", "ready"]


def test_ready_host_that_fails_the_health_gate_is_failed_and_bystanders_are_stopped(tmp_path):
    base = tmp_path / "r4"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({})
    run.serve_batch(["lab-1"], {"lab-1": ready()})
    run.serve_batch(["lab-2", "lab-3"], {"lab-2": ready()})
    gate = Task("Check that every host done so far still serves", action="uri")
    run.task(gate, ["lab-2"], {"msg": "Status code was -1"}, status="failed")
    run.stats(failures={"lab-2": 1})

    rows = {h["host"]: h["outcome"] for h in read(base)["hosts"]}
    assert rows == {"lab-1": "ready", "lab-2": "failed", "lab-3": "stopped"}


def test_unreachable_host(tmp_path):
    base = tmp_path / "r5"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({})
    run.play("blackwell")
    run.task(Task("Gathering Facts", action="gather_facts"), ["lab-1"], {"msg": "ssh: connect refused"}, "unreachable")
    run.stats(dark={"lab-1": 1})

    report = read(base)
    rows = {h["host"]: h for h in report["hosts"]}
    assert rows["lab-1"]["outcome"] == "unreachable"
    assert rows["lab-1"]["message"] == "ssh: connect refused"
    assert rows["lab-2"]["outcome"] == rows["lab-3"]["outcome"] == "untouched"
    assert report["result"] == "stopped"


def test_validation_failure_reports_a_stopped_run_with_untouched_hosts(tmp_path):
    base = tmp_path / "r6"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.play("localhost")
    run.task(Task("Validate", action="resolve_profiles"), ["localhost"], {"msg": "unknown profile"}, "failed")
    run.stats(failures={"localhost": 1})
    report = read(base)
    assert report["result"] == "stopped"
    assert report["hosts"] == []


def test_idle_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = Run(playbook="deploy.yml")
    run.validate_and_confirm({})
    run.serve_batch(HOSTS, {h: ready() for h in HOSTS})
    run.stats()
    assert list(tmp_path.iterdir()) == []
    assert run.cb._display.lines == []


def test_play_var_names_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = Run(playbook="deploy.yml")
    run.validate_and_confirm({})
    run.play("blackwell", {"moefleet_report_dir": "out/reports"})
    run.serve_batch(HOSTS, {h: ready() for h in HOSTS})
    run.stats()
    files = sorted(p.name for p in (tmp_path / "out" / "reports").iterdir())
    assert len(files) == 2
    assert files[0].startswith("rollout-20") and files[0].endswith("Z.json") and files[1].endswith("Z.md")


def test_rollout_playbook_writes_under_reports_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = Run(playbook="/repo/playbooks/rollout.yml")
    run.validate_and_confirm({})
    run.serve_batch(["lab-1"], {"lab-1": ready()})
    run.stats(failures={})
    [json_file] = (tmp_path / "reports").glob("rollout-*.json")
    assert json.loads(json_file.read_text())["result"] == "stopped"  # lab-2 and lab-3 never reached


def test_stop_request_writes_the_report_and_ends_before_the_next_task(tmp_path):
    base = tmp_path / "r7"
    stop = tmp_path / "stop"
    run = Run(extra={"moefleet_report_path": str(base)}, stop_file=stop)
    run.validate_and_confirm({"lab-2": "tp8"})
    run.serve_batch(["lab-1"], {"lab-1": ready()})
    stop.touch()
    with pytest.raises(KeyboardInterrupt):
        run.cb.v2_playbook_on_task_start(Task("Check that every host done so far still serves"), False)
    report = read(base)
    assert report["result"] == "stopped"
    assert "stopped on request" in report["stopped_by"]
    assert [h["outcome"] for h in report["hosts"]] == ["ready", "untouched", "untouched"]
    run.stats()  # ansible-playbook sends no stats after an interrupt; if it did, nothing is written twice
    assert read(base)["stopped_by"]


def test_stop_request_waits_for_a_started_hosts_rollback_and_restore(tmp_path):
    base = tmp_path / "r8"
    stop = tmp_path / "stop"
    run = Run(extra={"moefleet_report_path": str(base)}, stop_file=stop)
    run.validate_and_confirm({"lab-2": "tp8"})
    run.play("blackwell")
    run.task(PHASE_TASK, ["lab-1"], phase("installing"))
    run.task(PHASE_TASK, ["lab-1"], phase("loading"))  # the first start is under way
    stop.touch()  # the first Ctrl-C, while the start is checked
    for name, facts in (("a readiness wait", {"state": "oom"}), ("a set_fact", phase("rolling back")),
                        ("a readiness wait", {"state": "oom"}), ("a set_fact", phase("restoring")),
                        ("a readiness wait", {"state": "ready"}), ("a set_fact", phase("done"))):
        run.task(Task(name, "sglang_service"), ["lab-1"], facts)
    assert not base.with_suffix(".json").exists()
    with pytest.raises(KeyboardInterrupt):  # the host's start, rollback and restore are over: stop now
        run.cb.v2_playbook_on_task_start(Task("Check that every host done so far still serves"), False)
    assert "Check that every host done so far still serves" in read(base)["stopped_by"]


def test_stop_request_before_the_start_stops_at_the_next_task(tmp_path):
    stop = tmp_path / "stop"
    run = Run(extra={"moefleet_report_path": str(tmp_path / "r9")}, stop_file=stop)
    run.validate_and_confirm({"lab-2": "tp8"})
    stop.touch()
    with pytest.raises(KeyboardInterrupt):
        run.cb.v2_playbook_on_task_start(
            Task("Render and install the unit", "sglang_service", path="/repo/roles/sglang_service/tasks/unit.yml:9"),
            False)


def test_render_text_aligns_columns():
    report = {
        "asked_profile": "ep8",
        "result": "stopped",
        "seconds": 12.0,
        "stopped_by": None,
        "hosts": [
            {"host": "lab-1", "asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1,
             "seconds": 10.5, "message": "why"},
            {"host": "lab-22", "asked_profile": "ep8", "serving_profile": None, "outcome": "untouched", "ooms": 0,
             "seconds": None, "message": ""},
        ],
    }
    lines = rollout_report.render_text(report).splitlines()
    assert lines[0] == "Rollout of ep8: stopped, 0/2 host(s) serve the asked profile, 12.0 s."
    assert lines[1].split() == ["host", "asked", "serving", "outcome", "OOMs", "seconds"]
    assert lines[3].split() == ["lab-1", "ep8", "tp8", "restored", "1", "10.5"]
    assert lines[4].startswith("lab-22  ep8    -        untouched (never reached: later batch)")
    assert lines[-1] == "lab-1: why"


# --- what a ticket needs: inventory, -e values, version, batches, next steps (issue 15) -------------------------


def test_report_records_inventory_extra_vars_version_and_batches(tmp_path):
    base = tmp_path / "r20"
    run = Run(extra={"moefleet_report_path": str(base), "moefleet_serial": [1, "25%", "100%"]})
    run.validate_and_confirm({})
    for host in HOSTS:
        run.serve_batch([host], {host: ready()})
    run.stats()

    report = read(base)
    assert report["inventory"] == ["/srv/moefleet/inventory/sim"]
    assert report["extra_vars"] == {
        "profile": "ep8", "moefleet_report_path": str(base), "moefleet_serial": [1, "25%", "100%"]
    }
    galaxy = (ROOT / "galaxy.yml").read_text()
    assert f"\nversion: {report['moefleet_version']}\n" in galaxy
    assert [(h["host"], h["batch"], h["canary"]) for h in report["hosts"]] == [
        ("lab-1", 1, True), ("lab-2", 2, False), ("lab-3", 3, False)
    ]
    assert report["next_steps"] == []
    markdown = base.with_name("r20.md").read_text()
    assert "- Inventory: `/srv/moefleet/inventory/sim`" in markdown
    assert f"- moefleet.serving: {report['moefleet_version']}" in markdown
    assert "| lab-1 | ep8 | ep8 | ready | 0 | 20.0 | 1 (canary) |" in markdown
    assert "| lab-3 | ep8 | ep8 | ready | 0 | 20.0 | 3 |" in markdown
    assert "## Next steps" not in markdown


def test_batches_follow_the_serial_as_ansible_cuts_it():
    assert batches(["a", "b", "c", "d", "e"], [1, "25%", "100%"]) == [["a"], ["b"], ["c", "d", "e"]]
    assert batches(["a", "b", "c"], []) == [["a", "b", "c"]]
    assert batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    # the callback and moefleet rollout --check cut with this one function
    hosts = [f"h{i}" for i in range(10)]
    assert batches(hosts, [1, "25%", "100%"]) == [["h0"], ["h1", "h2"], hosts[3:]]
    assert batches(hosts[:5], [1, 2]) == [["h0"], ["h1", "h2"], ["h3", "h4"]]
    assert batches(hosts[:3], [0]) == [hosts[:3]]
    assert batches(hosts[:3], ["10%"]) == [["h0"], ["h1"], ["h2"]]  # at least one host a batch


SENTINELS = {
    "sglang_service_api_key": "sk-SENTINEL-apikey-0001",
    "sglang_model_hf_token": "hf_SENTINELtoken0002",
    "nested": {"db_password": "SENTINEL-pass-0003", "vault_anything": "SENTINEL-vault-0004", "keep": "visible"},
    "MY_SECRET": "SENTINEL-secret-0005",
}


def test_secrets_in_extra_vars_never_reach_json_markdown_or_stdout(tmp_path):
    from ansible.parsing.vault import EncryptedString

    base = tmp_path / "r21"
    vaulted = EncryptedString(ciphertext="$ANSIBLE_VAULT;1.1;AES256\n3133\n")
    run = Run(extra={"moefleet_report_path": str(base), **SENTINELS, "innocent_name": vaulted,
                     "pasted": "$ANSIBLE_VAULT;1.1;AES256\n6162SENTINEL0006\n"})
    run.validate_and_confirm({"lab-1": "tp8"})
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.serve_batch(["lab-1"], {"lab-1": restored})
    # a failing task that echoes a secret in its message, and a no_log one that Ansible did not censor
    run.task(FAIL_TASK, ["lab-1"], {"msg": "auth failed with sk-SENTINEL-apikey-0001 for hf_SENTINELtoken0002"},
             status="failed")
    run.task(FAIL_TASK, ["lab-2"], {"msg": "SENTINEL-nolog-0007", "_ansible_no_log": True}, status="failed")
    run.stats(failures={"lab-1": 1, "lab-2": 1})

    report = read(base)
    outputs = {
        "json": base.with_name("r21.json").read_text(),
        "markdown": base.with_name("r21.md").read_text(),
        "stdout": "\n".join(run.cb._display.lines),
    }
    for where, text in outputs.items():
        assert "SENTINEL" not in text, where
        assert "ANSIBLE_VAULT" not in text, where
    extra = report["extra_vars"]
    assert extra["sglang_service_api_key"] == extra["sglang_model_hf_token"] == extra["MY_SECRET"] == "<redacted>"
    assert extra["nested"] == {"db_password": "<redacted>", "vault_anything": "<redacted>", "keep": "visible"}
    assert extra["innocent_name"] == extra["pasted"] == "<redacted>"
    rows = {h["host"]: h for h in report["hosts"]}
    assert rows["lab-1"]["message"] == "auth failed with <redacted> for <redacted>"
    assert "no_log" in rows["lab-2"]["message"]


def test_advice_is_kept_whole_in_json_markdown_and_stdout(tmp_path):
    base = tmp_path / "r22"
    advice = (
        "lab-1 does not serve ep8: outcome restored. " + "The KV pool did not fit at the profile's fraction; " * 8
        + "so a higher --mem-fraction-static 0.848 or a smaller --context-length would leave room."
    )
    assert len(advice) > 500
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({})
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.serve_batch(["lab-1"], {"lab-1": restored})
    run.task(FAIL_TASK, ["lab-1"], {"msg": advice}, status="failed")
    run.stats(failures={"lab-1": 1})

    assert read(base)["hosts"][0]["message"] == advice
    assert f"- lab-1: {advice}" in base.with_name("r22.md").read_text()
    assert f"lab-1: {advice}" in "\n".join(run.cb._display.lines).splitlines()


def test_next_steps_when_the_canary_is_restored(tmp_path):
    base = tmp_path / "r23"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({"lab-1": "tp8", "lab-2": "tp8", "lab-3": "tp8"})
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.serve_batch(["lab-1"], {"lab-1": restored})
    run.task(FAIL_TASK, ["lab-1"], {"msg": "lab-1 does not serve ep8"}, status="failed")
    run.stats(failures={"lab-1": 1})

    steps = read(base)["next_steps"]
    assert steps[0] == "Serving now: tp8 on lab-1, lab-2, lab-3."
    assert steps[1].startswith("First find out why lab-1 did not end on the asked profile")
    assert steps[2] == (
        "To resume (lab-1, lab-2, lab-3 to ep8): "
        "moefleet rollout -i /srv/moefleet/inventory/sim -e profile=ep8 --limit lab-1,lab-2,lab-3"
    )
    assert len(steps) == 3  # nothing changed profile: nothing to roll back
    markdown = base.with_name("r23.md").read_text()
    assert "## Next steps" in markdown
    assert (
        "- To resume (lab-1, lab-2, lab-3 to ep8): "
        "`moefleet rollout -i /srv/moefleet/inventory/sim -e profile=ep8 --limit lab-1,lab-2,lab-3`"
    ) in markdown
    shown = "\n".join(run.cb._display.lines).splitlines()
    resume = shown[shown.index("Next steps:") + 3]
    assert resume.startswith("  To resume (lab-1, lab-2, lab-3 to ep8): moefleet rollout")


def test_next_steps_for_a_fleet_left_half_way(tmp_path):
    base = tmp_path / "r24"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({"lab-1": "tp8", "lab-2": "tp8", "lab-3": "tp8"})
    run.serve_batch(["lab-1"], {"lab-1": ready()})
    failed = {"asked_profile": "ep8", "serving_profile": None, "outcome": "failed", "ooms": 0, "attempts": 1}
    run.serve_batch(["lab-2"], {"lab-2": failed})
    run.task(FAIL_TASK, ["lab-2"], {"msg": "lab-2 serves nothing"}, status="failed")
    run.stats(failures={"lab-2": 1})

    steps = read(base)["next_steps"]
    assert steps[0] == "Serving now: ep8 on lab-1; tp8 on lab-3; nothing known to serve on lab-2."
    assert "moefleet rollout -i /srv/moefleet/inventory/sim -e profile=ep8 --limit lab-2,lab-3" in steps[2]
    assert steps[3] == (
        "To roll lab-1 back to tp8: moefleet rollout -i /srv/moefleet/inventory/sim -e profile=tp8 --limit lab-1"
    )


def test_counts_named_like_tokens_are_kept_and_not_scrubbed_from_messages(tmp_path):
    # max_total_tokens is a count, not a secret: redacting it would also scrub "50000" out of every message.
    base = tmp_path / "r30"
    run = Run(extra={"moefleet_report_path": str(base), "sglang_service_extra_flags": {"max_total_tokens": 50000},
                     "moefleet_router_admin_key": "SENTINEL-admin-0008", "apikey": "SENTINEL-apikey-0009"})
    run.validate_and_confirm({})
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.serve_batch(["lab-1"], {"lab-1": restored})
    run.task(FAIL_TASK, ["lab-1"], {"msg": "the KV pool holds 31000 of the 50000 tokens asked"}, status="failed")
    run.stats(failures={"lab-1": 1})

    report = read(base)
    assert report["extra_vars"]["sglang_service_extra_flags"] == {"max_total_tokens": 50000}
    assert report["extra_vars"]["moefleet_router_admin_key"] == report["extra_vars"]["apikey"] == "<redacted>"
    assert report["hosts"][0]["message"] == "the KV pool holds 31000 of the 50000 tokens asked"
    names = ("hf_token", "HF_TOKEN", "api_key", "apikey", "tokens", "keycloak_url", "max_prefill_tokens", "ssh_keys",
             "vault_password_file")
    assert [rollout_report.secret_name(n) for n in names] == [
        True, True, True, True, False, False, False, True, True]


def test_a_deploy_report_says_deploy_has_no_canary_and_resumes_with_moefleet_deploy(tmp_path):
    base = tmp_path / "r31"
    run = Run(extra={"moefleet_report_path": str(base)}, playbook="deploy.yml")
    run.validate_and_confirm({"lab-1": "tp8"})
    run.play("blackwell", serial=[0])  # serve.yml's default: every host in one batch
    run.task(PHASE_TASK, ["lab-1"], phase("installing"))
    restored = {"asked_profile": "ep8", "serving_profile": "tp8", "outcome": "restored", "ooms": 1, "attempts": 2}
    run.task(OUTCOME_TASK, ["lab-1"], {"ansible_facts": {"sglang_service_outcome": restored}})
    run.task(FAIL_TASK, ["lab-1"], {"msg": "lab-1 does not serve ep8"}, status="failed")
    run.stats(failures={"lab-1": 1})

    report = read(base)
    row = next(h for h in report["hosts"] if h["host"] == "lab-1")
    assert (row["batch"], row["canary"]) == (1, False)
    assert any(step.startswith("To resume") and ": moefleet deploy -i " in step for step in report["next_steps"])
    markdown = base.with_name("r31.md").read_text()
    assert markdown.startswith("# Deploy report: ep8") and "(canary)" not in markdown
    assert "\n".join(run.cb._display.lines).startswith("Deploy of ep8: ")


def test_an_upgrade_shows_old_against_new_per_host_and_why_the_canary_switched_back(tmp_path):
    """An upgrade whose canary measured the new release slower (roles/sglang_service: the outcome carries the
    comparison): the report's JSON keeps both releases' figures per host, the text and Markdown say old against new
    and which host switched back; a host whose run replaced no release has none."""
    from ansible_collections.moefleet.serving.plugins.module_utils import release_compare

    def measured(release, *runs):
        return {"release": release, "measured": True,
                "runs": [{"requests": 16, "failed": 0, "wall_s": 9.0, "output_tok_s": tput, "ttft_ms": ttft}
                         for tput, ttft in runs]}

    slower = release_compare.compare(measured("0.5.10", (800, 100), (798, 101)),
                                     measured("0.5.23", (660, 121), (658, 122)), 0.1, "lab-1")
    kept = release_compare.compare(measured("0.5.10", (800, 100), (798, 101)),
                                   measured("0.5.23", (812, 96), (805, 98)), 0.1, "lab-2")
    base = tmp_path / "up"
    run = Run(extra={"moefleet_report_path": str(base), "sglang_package_spec": "sglang[all]==0.5.23"})
    run.validate_and_confirm({"lab-1": "ep8", "lab-2": "ep8", "lab-3": "ep8"})
    run.serve_batch(["lab-1"], {"lab-1": {**ready(), "release_compare": kept}})
    run.serve_batch(["lab-2"], {"lab-2": {**ready(), "outcome": "restored", "release_compare": slower}})
    run.task(FAIL_TASK, ["lab-2"], {"msg": "lab-2 does not serve ep8: outcome restored. " + slower["reason"]},
             status="failed")
    run.stats(failures={"lab-2": 1})

    report = read(base)
    rows = {h["host"]: h for h in report["hosts"]}
    assert rows["lab-1"]["release_compare"]["verdict"] == "not_slower"
    tput = rows["lab-2"]["release_compare"]["metrics"]["output_tok_s"]
    assert (tput["before"], tput["after"], tput["change"]) == (800.0, 660.0, -0.175), tput
    assert rows["lab-3"]["release_compare"] is None and rows["lab-3"]["outcome"] == "untouched"
    markdown = (tmp_path / "up.md").read_text()
    assert "## SGLang releases, old against new" in markdown
    assert "- lab-2: 0.5.10 -> 0.5.23: output 800.0 -> 660.0 tok/s (-18%, noise 0%); TTFT 100.0 -> 121.0 ms (+21%, " \
           "noise 1%) [slower: switched back]" in markdown
    shown = "\n".join(run.cb._display.lines)
    assert "lab-1: 0.5.10 -> 0.5.23: output 800.0 -> 812.0 tok/s (+2%" in shown and "[not slower: kept]" in shown
    # The next steps resume the upgrade (a plain rollout would install the release the inventory pins) and name the
    # way back for the host that kept the new release.
    steps = report["next_steps"]
    inventory = "-i /srv/moefleet/inventory/sim"
    assert f"moefleet upgrade {inventory} --to 0.5.23 -e profile=ep8 --limit lab-2,lab-3" in steps[2], steps
    assert steps[2].startswith("To resume (lab-2, lab-3 to ep8 on SGLang 0.5.23): "), steps
    assert steps[3:] == [f"To move lab-1 back to SGLang 0.5.10: moefleet upgrade {inventory} --to 0.5.10 -e "
                         "profile=ep8 --limit lab-1"], steps


def test_the_p2p_preflight_verdict_reaches_the_report_with_its_reason_and_fix(tmp_path):
    """roles/sglang_service sets sglang_service_p2p before the model load: the report keeps it per host, and the text
    and Markdown name the hosts that did not keep P2P with the reason and the fix; a host without one has null."""
    from ansible_collections.moefleet.serving.plugins.module_utils import rollback

    found = {"verdict": "pcie_shm", "reason": "ACS request/completion redirect on 0000:00:01.1 while the IOMMU "
             "translates.", "fix": "Disable ACS in the BIOS, or boot with iommu=pt.", "cached": False,
             "bandwidths": {"p2p_busbw_gbps": None, "shm_busbw_gbps": 20.0}, "decided_at": "2026-12-05T17:00:00Z"}
    step = rollback.p2p_preflight_step(found, {"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p"}, False,
                                       {"tp_size": 8}, "lab-1")
    healthy = rollback.p2p_preflight_step(dict(found, verdict="pcie_p2p", reason="the all-reduce passed.",
                                               fix="", bandwidths={"p2p_busbw_gbps": 37.6, "shm_busbw_gbps": 20.0}),
                                          {"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p"}, False, {}, "lab-2")
    base = tmp_path / "p2p"
    run = Run(extra={"moefleet_report_path": str(base)})
    run.validate_and_confirm({"lab-1": "tp8", "lab-2": "tp8", "lab-3": "tp8"})
    p2p_task = Task("Decide the NCCL set by the verdict", role="sglang_service", action="ansible.builtin.set_fact")
    run.task(p2p_task, ["lab-1"], {"ansible_facts": {"sglang_service_p2p": step["record"]}})
    run.task(p2p_task, ["lab-2"], {"ansible_facts": {"sglang_service_p2p": healthy["record"]}})
    run.serve_batch(["lab-1", "lab-2"], {"lab-1": ready("tp8"), "lab-2": ready("tp8")})
    run.stats()

    report = read(base)
    rows = {h["host"]: h for h in report["hosts"]}
    assert (rows["lab-1"]["p2p"]["verdict"], rows["lab-1"]["p2p"]["nccl_set"]) == ("pcie_shm", "pcie_shm")
    assert rows["lab-2"]["p2p"]["bandwidths"]["p2p_busbw_gbps"] == 37.6 and rows["lab-3"]["p2p"] is None
    text = rollout_report.render_text(report)
    assert "PCIe peer-to-peer preflight:" in text
    assert ("  lab-1: pcie_shm, serving pcie_shm (20 GB/s without); ACS request/completion redirect on 0000:00:01.1 "
            "while the IOMMU translates. Fix: Disable ACS in the BIOS, or boot with iommu=pt.") in text
    assert "  lab-2: pcie_p2p, serving pcie_p2p (37.6 GB/s with P2P, 20 GB/s without)" in text
    assert "## PCIe peer-to-peer preflight" in (tmp_path / "p2p.md").read_text()
