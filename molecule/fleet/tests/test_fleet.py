"""Rollouts on a four-host lab fleet, through playbooks/rollout.yml; the tests run in file order, each starting
where the previous one left the fleet (converge rolled tp8 out to every host).

A clean rollout has no test of its own here: converge is one (4 hosts from the installed base, the default batches),
the rerun below is another (a switch of two hosts from two profiles, after two that are already done, to a complete
report), and tests/integration/test_rollout_status_lab.py checks a clean one's report and status in full. Until
2026-12-05 a clean rollout of ep8 from tp8 ran here too: 153 s and ~1.5 CPU-minutes of the suite for no check the
others lack.

Cost (a fresh-clone make test, beside two other jobs): 10.8 minutes for the scenario with that test, converge on the
installed base included; the refusal 20 s, the rollout stopped at host 3 129 s, the rerun 128 s. The rerun is `make
bench` part (b)'s smoke run too; its no-change rerun after it, which the bench also times, made the scenario 14.2
minutes long in make test (fresh-clone CI4, 2026-12-06: the rollout 141 s, the no-change rerun 190 s) and is left
out."""

import json
import os
import sys
from pathlib import Path

import testinfra

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import SERVE_ONLY, bench_module, run_playbook, ssh_config_path  # noqa: E402

INVENTORY = Path(os.environ["MOEFLEET_LAB_INVENTORY"])
HOSTS = [f"fleet-{i}" for i in range(1, 5)]
FAULTY = INVENTORY.parent / "host_vars" / "fleet-3.yml"


def rollout(report: Path, *extra_vars: str) -> tuple[int, str]:
    """rollout.yml on the converged fleet, as `moefleet rollout --serve-only` runs it (--skip-tags install)."""
    run = run_playbook(INVENTORY, "playbooks/rollout.yml", f"moefleet_report_path={report}", *extra_vars,
                       options=SERVE_ONLY)
    return run.returncode, run.stdout + run.stderr


def host(name: str):
    return testinfra.get_host(f"ssh://{name}", ssh_config=str(ssh_config_path(INVENTORY)))


def serving(name: str) -> tuple[str, int, str]:
    """(profile in the local facts, --ep-size the server reports, the unit's invocation)."""
    h = host(name)
    facts = json.loads(h.file("/etc/ansible/facts.d/moefleet.fact").content_string)
    info = json.loads(h.check_output("curl -sf http://127.0.0.1:30000/server_info"))
    return facts["serving_profile"], info["ep_size"], h.check_output("systemctl show -p InvocationID --value sglang")


def rows(report: Path) -> dict[str, dict]:
    data = json.loads(report.with_suffix(".json").read_text())
    return {row["host"]: row for row in data["hosts"]} | {"_result": data["result"]}


def test_changing_a_serving_fleet_needs_confirmation(tmp_path):
    before = {name: serving(name) for name in HOSTS}
    code, out = rollout(tmp_path / "unconfirmed", "profile=ep8")
    assert code != 0
    assert "-e confirm=yes" in out
    assert {name: serving(name) for name in HOSTS} == before


def test_oom_on_host3_stops_the_rollout_after_its_batch(tmp_path):
    FAULTY.parent.mkdir(exist_ok=True)
    FAULTY.write_text('---\nsim_faults: [{fault: oom_weight_load, profile: tp4ep2}]\n')
    untouched_before = serving("fleet-4")
    code, out = rollout(tmp_path / "faulty", "profile=tp4ep2", "confirm=yes",
                        json.dumps({"moefleet_serial": [1, 2, "100%"]}))
    assert code != 0
    report = rows(tmp_path / "faulty")
    assert report["_result"] == "stopped"
    for name in ("fleet-1", "fleet-2"):
        assert (report[name]["outcome"], report[name]["serving_profile"]) == ("ready", "tp4ep2")
    assert (report["fleet-3"]["outcome"], report["fleet-3"]["serving_profile"]) == ("degraded", "tp2ep4")
    assert report["fleet-3"]["ooms"] == 1
    assert (report["fleet-4"]["outcome"], report["fleet-4"]["serving_profile"]) == ("untouched", "tp8")
    assert serving("fleet-3")[:2] == ("tp2ep4", 4)
    assert serving("fleet-4") == untouched_before


def test_rerun_without_the_fault_completes(tmp_path, record_property):
    FAULTY.unlink()
    runs: list[tuple[int, str]] = []
    report_path = tmp_path / "rerun"
    # `make bench` part (b)'s row (tests/bench/run.py's rollout_row) for this rollout: the part's smoke run (the bench's
    # own runs start from bare hosts and time a no-change rerun too, which costs this scenario 3 minutes: left out)
    def run() -> int:
        runs.append(rollout(report_path, "profile=tp4ep2", "confirm=yes",
                            json.dumps({"moefleet_serial": [1, 2, "100%"]})))
        return runs[-1][0]

    row = bench_module().rollout_row(run, len(HOSTS), rerun=False)
    ((code, out),) = runs
    assert code == 0, out[-4000:]
    report = rows(report_path)
    assert report["_result"] == "complete"
    for name in HOSTS:
        assert report[name]["serving_profile"] == "tp4ep2"
        assert serving(name)[:2] == ("tp4ep2", 2)
    record_property("figure", f"bench (b) smoke, a serve-only rollout switching 2 of {len(HOSTS)} hosts (hosts, "
                              f"rollout s, s/host, x 1 host, rerun s, x, rc): {' '.join(row['row'].split())}")
