"""The documents a host keeps and reports (plugins/module_utils/host_state.py), held to their JSON Schemas."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.host_state import (
    HISTORY_KEPT,
    local_facts,
    status_entry,
)
from ansible_collections.moefleet.serving.plugins.module_utils.rollback import first_attempt, summarize

from moefleet.commands.status import render_table

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
FACTS_SCHEMA = json.loads((SCHEMAS / "local_facts.schema.json").read_text())
STATUS_SCHEMA = json.loads((SCHEMAS / "status.schema.json").read_text())
FINGERPRINT = "0123456789abcdef0123456789abcdef01234567"
NOW = "2026-12-01T03:00:00.000000+00:00"


def attempt(profile: str, state: str, phase: str | None = None, **extra) -> dict:
    return {**first_attempt(profile, "pcie_p2p"), **extra, "time": NOW,
            "outcome": {"state": state, "phase": phase, "cause": None, "oom": None, "advice": None}}


def test_a_fallback_run_records_the_rollback_and_each_start():
    attempts = [attempt("tp2ep4", "oom", "weight_load"), attempt("ep8", "ready", remedy="fallback")]
    facts = local_facts({}, "tp2ep4", FINGERPRINT, summarize("tp2ep4", attempts), attempts[-1], attempts,
                        "tp2ep4 ran out of memory (weight_load); falling back to ep8.", NOW)
    jsonschema.validate(facts, FACTS_SCHEMA)
    assert (facts["serving_profile"], facts["outcome"], facts["ooms"]) == ("ep8", "degraded", 1)
    assert facts["last_rollback"] == {"time": NOW, "from": "tp2ep4", "to": "ep8",
                                      "reason": "tp2ep4 ran out of memory (weight_load); falling back to ep8."}
    assert [(h["profile"], h["outcome"], h["phase"]) for h in facts["history"]] == [
        ("tp2ep4", "oom", "weight_load"), ("ep8", "ready", None)]
    assert "remedy" not in facts["attempt"] and "outcome" not in facts["attempt"]


def test_a_plain_run_keeps_the_last_rollback_and_caps_the_history():
    old = {"last_rollback": {"time": NOW, "from": "tp8", "to": "ep8", "reason": "r"},
           "history": [{"time": NOW, "profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p", "outcome": "ready",
                        "phase": None, "cause": None}] * HISTORY_KEPT}
    attempts = [attempt("tp8", "ready")]
    facts = local_facts(old, "tp8", FINGERPRINT, summarize("tp8", attempts), attempts[0], attempts, "", NOW)
    jsonschema.validate(facts, FACTS_SCHEMA)
    assert facts["last_rollback"] == old["last_rollback"]
    assert len(facts["history"]) == HISTORY_KEPT and facts["history"][-1]["time"] == NOW


def test_a_restore_is_a_rollback_to_the_restored_profile():
    attempts = [attempt("tp8", "crashed")]
    facts = local_facts({}, "tp8", FINGERPRINT, summarize("tp8", attempts, restored="ep8"),
                        first_attempt("ep8", "pcie_p2p"), attempts, "restoring the last unit that served.", NOW)
    jsonschema.validate(facts, FACTS_SCHEMA)
    assert (facts["outcome"], facts["serving_profile"], facts["last_rollback"]["to"]) == ("restored", "ep8", "ep8")


@pytest.mark.parametrize("broken", [
    {"outcome": "fine"},
    {"asked_fingerprint": "not-a-sha1"},
    {"history": "none"},
    {"extra": 1},
])
def test_the_facts_schema_refuses_what_the_readers_could_not_use(broken):
    attempts = [attempt("tp8", "ready")]
    facts = local_facts({}, "tp8", FINGERPRINT, summarize("tp8", attempts), attempts[0], attempts, "", NOW)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**facts, **broken}, FACTS_SCHEMA)


@pytest.mark.parametrize(("reachable", "unit", "code", "health"), [
    (True, "active", 200, "serving"),
    (True, "active", 503, "starting"),
    (True, "activating", None, "starting"),
    (True, "failed", None, "down"),
    (True, "inactive", -1, "down"),
    (False, "active", 200, "unreachable"),
])
def test_status_health(reachable, unit, code, health):
    local = {"serving_profile": "ep8", "asked_profile": "tp8", "outcome": "degraded", "updated": NOW,
             "last_rollback": None}
    info = {"tp_size": 8, "ep_size": 8, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False, "port": 30000}
    entry = status_entry("lab-1", reachable, local, {"ooms": 2, "last": {"state": "oom"}}, unit, code, info)
    jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)
    assert entry["health"] == health
    if reachable:
        assert (entry["serving_profile"], entry["runtime_ooms"], entry["server_args"]["ep_size"]) == ("ep8", 2, 8)
        assert "port" not in entry["server_args"]
    else:  # what an unreachable host's old facts say is not reported as now
        assert (entry["serving_profile"], entry["runtime_ooms"]) == (None, 0)


def test_status_without_server_info_has_no_server_args():
    entry = status_entry("lab-1", True, {}, {}, None, None, {})
    jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)
    assert (entry["unit"], entry["health"], entry["server_args"], entry["release"]) == ("unknown", "down", None, None)


def test_status_names_the_release_the_server_reports_and_the_table_shows_it_when_the_fleet_mixes_them():
    """/server_info's version (SGLang's own __version__) is the host's release; the table's "sglang" column appears
    only while the fleet runs more than one (an upgrade under way, a host restored to the release it ran before)."""
    local = {"serving_profile": "tp8", "asked_profile": "tp8", "outcome": "ready", "updated": NOW}
    entries = [status_entry(f"lab-{n}", True, local, {}, "active", 200, {"tp_size": 8, "version": version})
               for n, version in ((1, "0.5.23"), (2, "0.5.10"))]
    jsonschema.validate({"hosts": entries}, STATUS_SCHEMA)
    assert [e["release"] for e in entries] == ["0.5.23", "0.5.10"]
    mixed = render_table(entries).splitlines()
    assert mixed[0].split()[:4] == ["host", "serving", "sglang", "asked"]
    assert mixed[2].split()[:3] == ["lab-1", "tp8", "0.5.23"] and mixed[3].split()[:3] == ["lab-2", "tp8", "0.5.10"]
    same = render_table([entries[0], {**entries[1], "release": "0.5.23"}]).splitlines()
    assert "sglang" not in same[0].split() and "0.5.23" not in same[2]
