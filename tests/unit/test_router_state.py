"""A worker's router state in the status document (host_state.router_state, status_entry's router key)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.host_state import router_state, status_entry

ROOT = Path(__file__).resolve().parents[2]
STATUS_SCHEMA = json.loads((ROOT / "schemas" / "status.schema.json").read_text())
URL = "http://10.0.0.11:30000"


def worker(status: str = "ready", healthy: bool = True, url: str = URL, model: str = "kimi-k2.6") -> dict:
    """An entry of smg 1.13's GET /workers list, with the keys the state is read from."""
    return {"id": "01a2", "url": url, "status": status, "is_healthy": healthy, "load": 0, "model_id": model}


@pytest.mark.parametrize(("listings", "state"), [
    ([], None),  # no routers
    ([[worker()]], "ready"),
    ([[worker(), worker(url="http://10.0.0.12:30000")]], "ready"),
    ([[worker("draining", healthy=False)]], "draining"),
    ([[worker(url="http://10.0.0.12:30000")]], "out"),  # not listed: removed, or never added back
    ([[worker(healthy=False)]], "out"),  # listed but failing its health checks: no traffic
    ([[worker("pending", healthy=False)]], "out"),
    ([None], "unknown"),  # the router did not answer
    ([[worker()], [worker("draining")]], "draining"),  # any router draining it
    ([[worker()], []], "out"),  # one router routes to it, the other does not
    ([[worker()], None], "unknown"),
])
def test_router_state(listings, state):
    assert router_state(URL, listings) == state


@pytest.mark.parametrize(("listings", "state"), [
    ([[worker()]], "ready"),
    # smg 1.13 with a key of its own, given a worker without the worker's key: its backend detection gets 401,
    # it lists the worker ready and healthy under model "unknown", and answers 404 for kimi-k2.6
    ([[worker(model="unknown")]], "unroutable"),
    ([[worker()], [worker(model="unknown")]], "unroutable"),
    ([[worker(model="unknown")], []], "unroutable"),
    ([[worker(model="unknown")], [worker("draining")]], "draining"),
])
def test_a_worker_listed_under_another_model_is_unroutable(listings, state):
    assert router_state(URL, listings, "kimi-k2.6") == state


def test_status_exits_1_for_an_unroutable_host_and_says_what_to_set():
    from moefleet.commands.status import exit_code, summary  # noqa: PLC0415

    base = {"host": "lab-1", "state": "ready", "health": "serving", "serving_profile": "tp8", "asked_profile": "tp8"}
    assert exit_code([base | {"router": "ready"}]) == 0
    assert exit_code([base | {"router": "unroutable"}]) == 1
    assert "sglang_router_worker_api_key" in summary([base | {"router": "unroutable"}])


@pytest.mark.parametrize("state", ["ready", "draining", "out", "unroutable", "unknown"])
def test_status_entry_carries_the_router_state(state):
    entry = status_entry("lab-1", True, {}, {}, "active", 200, {}, router=state)
    jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)
    assert entry["router"] == state


def test_without_routers_the_entry_has_no_router_key():
    entry = status_entry("lab-1", True, {}, {}, "active", 200, {})
    jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)
    assert "router" not in entry


def test_the_schema_refuses_another_router_state():
    entry = status_entry("lab-1", True, {}, {}, "active", 200, {}, router="half")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)


def test_the_status_table_shows_a_router_column_only_with_routers():
    from moefleet.commands.status import render_table  # noqa: PLC0415

    base = {"host": "lab-1", "serving_profile": "ep8", "asked_profile": "ep8", "health": "serving",
            "last_rollback": None, "last_runtime_failure": None}
    plain = render_table([base])
    assert "router" not in plain.splitlines()[0]
    routed = render_table([base | {"router": "draining"}, base | {"host": "lab-2", "router": "ready"}]).splitlines()
    assert routed[0].split()[:6] == ["host", "serving", "asked", "outcome", "health", "router"]
    assert routed[2].split()[5] == "draining" and routed[3].split()[5] == "ready"


def answer(*workers: dict, status: int = 200) -> dict:
    """One router's item of playbooks/status.yml's uri loop (GET /workers)."""
    return {"status": status, "json": {"workers": list(workers)}} if status == 200 else {"status": status}


@pytest.mark.parametrize(("answers", "state"), [
    ([answer(worker())], "ready"),
    ([answer(worker("draining", healthy=False))], "draining"),
    ([answer(worker(url="http://10.0.0.12:30000"))], "out"),
    ([answer(worker()), answer(status=-1)], "unknown"),  # a router that did not answer
    ([answer(worker()), {"status": 200, "json": {"error": "x"}}], "unknown"),  # nor one with no list
])
def test_the_status_entry_filter_takes_the_router_answers(answers, state):
    """playbooks/status.yml hands the filter each router's answer: the one router_state decides (no Jinja copy)."""
    from ansible_collections.moefleet.serving.plugins.filter.moefleet import status_entry as entry_filter  # noqa: PLC0415

    entry = entry_filter("lab-1", True, {}, {}, "active", "200", {}, {"url": URL, "answers": answers})
    jsonschema.validate({"hosts": [entry]}, STATUS_SCHEMA)
    assert entry["router"] == state
    assert "router" not in entry_filter("lab-1", True, {}, {}, "active", 200, {}, None)
    assert "router" not in entry_filter("lab-1", True, {}, {}, "active", 200, {}, {"url": URL, "answers": []})


def test_status_yml_keeps_no_copy_of_the_router_rules():
    text = (ROOT / "playbooks" / "status.yml").read_text()
    assert "draining" not in text and "is_healthy" not in text
