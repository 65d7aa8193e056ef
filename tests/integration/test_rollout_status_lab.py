"""moefleet rollout and moefleet status on a two-host lab: a clean rollout, then one whose canary runs out of
memory, which stops before the second host, then one whose canary answers garbage (the correctness gate), which is
restored and stops there too. The tests run in file order: each starts where the one before left the lab.

Cost (a fresh-clone make test, beside two other jobs): the clean rollout (--serve-only) on the installed base 169 s
(the lab's start 171 s, the installed-base image built in it), the canary OOM 83 s, the garbage canary 73 s
(measured beside a stress run: a serve-only start of pp8, the gate, the restore, two status runs).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 246 s wall, 76 + 59 CPU-s (the clean rollout 124 s, 35 + 27; the
garbage canary 65 s, 22 + 17; the canary OOM 57 s, 19 + 15).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from moefleet import cli

pytestmark = pytest.mark.lab

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
REPORT_SCHEMA = json.loads((SCHEMAS / "rollout_report.schema.json").read_text())
STATUS_SCHEMA = json.loads((SCHEMAS / "status.schema.json").read_text())
OOM_ON_EP8 = json.dumps({"sim_faults": [{"fault": "oom_weight_load", "profile": "ep8"}]})
GARBAGE_ON_PP8 = json.dumps({"sim_faults": [{"fault": "garbage", "profile": "pp8"}]})


def moefleet(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    print(captured.out, captured.err)  # shown when a test fails
    return code, captured.out + captured.err


def status_of(capsys, inventory, *options: str) -> dict[str, dict]:
    code, out = moefleet(capsys, "status", "-i", str(inventory), "--json", *options)
    # the document starts at a line of its own: output of the run before (a report's "-e" line) may hold braces
    document = json.loads(out[out.index("\n{") + 1 : out.rindex("}") + 1] if not out.startswith("{") else
                          out[: out.rindex("}") + 1])
    jsonschema.validate(document, STATUS_SCHEMA)
    hosts = document["hosts"]
    return {h["host"]: h | {"exit": code} for h in hosts}


def test_clean_rollout_serves_tp8_everywhere(lab_inventory, tmp_path, capsys):
    report = tmp_path / "clean"
    # the hosts are from the installed base: --serve-only (the traced deploy and the Hub download run the whole path)
    code, out = moefleet(capsys, "rollout", "-i", str(lab_inventory), "-e", "profile=tp8", "--serve-only",
                         "--report", str(report))
    assert code == 0, out
    for host in ("itest-1", "itest-2"):
        assert f"{host:<16} installing" in out and f"{host:<16} ready: serving tp8" in out

    data = json.loads(report.with_suffix(".json").read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["result"] == "complete"
    assert {h["host"]: (h["outcome"], h["serving_profile"]) for h in data["hosts"]} == {
        "itest-1": ("ready", "tp8"),
        "itest-2": ("ready", "tp8"),
    }
    assert report.with_suffix(".md").exists()

    hosts = status_of(capsys, lab_inventory, "--probe")  # the correctness gate's requests, through the real playbook
    assert {h: (s["serving_profile"], s["health"], s["server_args"]["tp_size"]) for h, s in hosts.items()} == {
        "itest-1": ("tp8", "serving", 8),
        "itest-2": ("tp8", "serving", 8),
    }
    assert all(s["answers"] == {"passed": True, "failed_check": None, "evidence": None} for s in hosts.values())
    assert hosts["itest-1"]["exit"] == 0


def test_canary_oom_stops_the_rollout_before_the_second_host(lab_inventory, tmp_path, capsys):
    report = tmp_path / "oom"
    code, out = moefleet(
        capsys, "rollout", "-i", str(lab_inventory), "-e", "profile=ep8", "-e", "confirm=yes",
        "-e", OOM_ON_EP8, "--serve-only", "--report", str(report),
    )  # fmt: skip
    assert code == 1, out
    assert "itest-1          rolled back" in out and "itest-1          failed" in out
    assert "itest-2          installing" not in out and "itest-2          loading" not in out

    data = json.loads(report.with_suffix(".json").read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["result"] == "stopped"
    rows = {h["host"]: h for h in data["hosts"]}
    assert rows["itest-1"]["outcome"] in ("degraded", "restored")
    assert rows["itest-1"]["serving_profile"] not in (None, "ep8")
    assert rows["itest-1"]["ooms"] >= 1
    assert rows["itest-2"]["outcome"] == "untouched"
    assert rows["itest-2"]["serving_profile"] == "tp8"

    hosts = status_of(capsys, lab_inventory)
    assert hosts["itest-1"]["asked_profile"] == "ep8"
    assert hosts["itest-1"]["serving_profile"] == rows["itest-1"]["serving_profile"]
    assert hosts["itest-1"]["last_rollback"]["from"] == "ep8"
    assert (hosts["itest-2"]["serving_profile"], hosts["itest-2"]["health"]) == ("tp8", "serving")


def test_a_canary_that_answers_garbage_is_restored_and_the_rollout_stops_there(lab_inventory, tmp_path, capsys):
    """pp8 starts and serves on the canary but answers runs of '!' (NaN logits): the correctness gate fails it, the
    canary goes back to the unit it served before, and the second host is never touched."""
    before = status_of(capsys, lab_inventory)["itest-1"]["serving_profile"]
    capsys.readouterr()  # status_of printed its document: the next one must be the only one read
    report = tmp_path / "garbage"
    code, out = moefleet(
        capsys, "rollout", "-i", str(lab_inventory), "-e", "profile=pp8", "-e", "confirm=yes",
        "-e", GARBAGE_ON_PP8, "--serve-only", "--report", str(report),
    )  # fmt: skip
    assert code == 1, out
    assert "itest-2          loading" not in out
    data = json.loads(report.with_suffix(".json").read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["result"] == "stopped"
    rows = {h["host"]: h for h in data["hosts"]}
    assert (rows["itest-1"]["outcome"], rows["itest-1"]["serving_profile"]) == ("restored", before)
    assert rows["itest-2"]["outcome"] == "untouched"
    # the report names the failed check and quotes the bad output
    markdown = " ".join(report.with_suffix(".md").read_text().split())
    assert "check thinking failed" in markdown and "'!!!!!!!!" in markdown, markdown[-3000:]
    hosts = status_of(capsys, lab_inventory)
    assert (hosts["itest-1"]["serving_profile"], hosts["itest-1"]["health"]) == (before, "serving")

