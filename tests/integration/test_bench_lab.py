"""playbooks/bench.yml on one lab host (itest-1 of the lab_inventory fixture): tp8, ep8 and tp2ep4 served through
the sglang_service role one after the other and measured with the simulated `python -m sglang.bench_serving` at
concurrency 1 and 64. The report lands as JSON, CSV, Markdown and two PNGs; the recommendation is the field
report's (ep8 the fastest single stream, tp2ep4 the best aggregate); the host serves afterwards what it served
before (its local facts and its unit's command line).

On a fresh lab the host serves nothing yet: the test deploys tp8 on it first (as the rollout tests of this
directory do next, so they find it installed and serving tp8). About 2.5 minutes on a fresh lab on 2 cores
(the deploy ~1.3 of them), 1.3 on a host that already serves. The sweep runs from the repository root with a
relative bench_report_dir, which must land under the repository root (the working directory), not playbooks/.

The second test sweeps a worker behind the model gateway, on a lab of its own (one worker and the router,
lab.py up --router; about 6 minutes): the worker binds its lab address only, so the client must measure it
there (127.0.0.1 is refused), and no router lists it or sends it a request while the sweep's profile runs.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from playbook import ROOT, on_host, run_playbook  # noqa: E402  (tests/playbook.py)

pytestmark = pytest.mark.lab

HOST = "itest-1"
PROFILES = ["tp8", "ep8", "tp2ep4"]
LADDER = [1, 64]


def serving(inventory: Path) -> dict:
    """What the host serves: its local facts, whether the unit is active, and the unit's command line."""
    facts = on_host(inventory, HOST, "cat /etc/ansible/facts.d/moefleet.fact 2>/dev/null")
    return {
        "facts": json.loads(facts) if facts.strip() else {},
        "active": on_host(inventory, HOST, "systemctl is-active sglang.service").strip(),
        "exec": on_host(
            inventory, HOST, "systemctl show -p ExecStart --value sglang.service | sed 's/ ; start_time=.*//'"
        ),
    }


def test_sweep_reports_recommends_and_puts_back_what_served(lab_inventory):
    before = serving(lab_inventory)
    if before["active"] != "active" or not before["facts"].get("serving_profile"):
        deployed = run_playbook(lab_inventory, "deploy.yml", "profile=tp8", options=("--limit", f"{HOST},localhost"))
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        before = serving(lab_inventory)
    assert before["active"] == "active" and before["exec"].strip()

    # Relative, as an operator passes it: under the working directory of ansible-playbook (run_playbook runs it
    # from the repository root), not under playbooks/ where the playbook is.
    relative = f"reports/test-bench-lab-{uuid.uuid4().hex[:8]}"
    reports = ROOT / relative
    try:
        started = time.monotonic()
        result = run_playbook(
            lab_inventory, "playbooks/bench.yml",
            json.dumps({"profiles": PROFILES, "bench_ladder": LADDER, "bench_report_dir": relative}),
            options=("--limit", f"{HOST},localhost"), timeout=900,
        )
        wall = time.monotonic() - started
        print(f"sweep wall time: {wall:.0f} s")
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        assert not (ROOT / "playbooks" / relative).exists()
        check_report(reports, before)
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        shutil.rmtree(ROOT / "playbooks" / relative, ignore_errors=True)

    after = serving(lab_inventory)
    assert after["active"] == "active"
    assert after["facts"]["serving_profile"] == before["facts"]["serving_profile"]
    assert after["facts"]["outcome"] == "ready"
    assert after["exec"] == before["exec"]
    # Nothing of the sweep is left on the host.
    assert on_host(lab_inventory, HOST, "ls -d /tmp/moefleet-bench.* 2>/dev/null").strip() == ""


def check_report(reports: Path, before: dict) -> None:
    """The JSON, CSV, Markdown and PNGs of the sweep above."""
    (report_file,) = reports.glob("bench-*.json")
    stem = report_file.name.removesuffix(".json")
    report = json.loads(report_file.read_text())
    assert (report["host"], report["model"]) == (HOST, "kimi-k2.6")
    assert [(p["profile"], p["status"]) for p in report["profiles"]] == [(p, "ok") for p in PROFILES]
    for profile in report["profiles"]:
        assert [r["max_concurrency"] for r in profile["results"]] == LADDER
        assert all(r["output_throughput"] > 0 and r["p99_itl_ms"] > 0 for r in profile["results"])
        assert profile["outcome"]["outcome"] == "ready" and profile["timing_s"]["total"] > 0
    assert report["recommendation"]["single_stream"] == "ep8"
    assert report["recommendation"]["throughput"] == "tp2ep4"
    assert report["served_before"] == before["facts"]["serving_profile"]
    # Random token ids sent as token ids (nothing downloaded), at the address the server binds (the lab's
    # default: loopback).
    assert {k: report["workload"][k] for k in ("dataset_name", "tokenize_prompt", "dataset_path", "server_url")} == {
        "dataset_name": "random-ids", "tokenize_prompt": True, "dataset_path": None,
        "server_url": "http://127.0.0.1:30000"}

    rows = list(csv.DictReader((reports / f"{stem}.csv").open()))
    assert [(r["profile"], r["max_concurrency"]) for r in rows] == [(p, str(c)) for p in PROFILES for c in LADDER]
    summary = (reports / f"{stem}.md").read_text()
    assert all(f"| {p} | ok |" in summary for p in PROFILES) and "Fastest single stream: **ep8**" in summary
    for name in (f"{stem}-throughput.png", f"{stem}-latency.png"):
        assert (reports / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- behind the model gateway --------------------------------------------------------------------------------
ROUTED_LAB = "itbr"
WORKER = f"{ROUTED_LAB}-1"
LAB_PY = ROOT / "sim" / "lab" / "lab.py"
VENV_BIN = Path(sys.executable).parent
ADMIN_KEY = "lab-router-admin-key-not-a-secret"  # inventory/sim/group_vars/routers.yml
# A router lab's workers require a key and the gateway has it (lab.py up --router): its clients send it, and
# the sweep hands it to bench_serving (sglang_service_api_key).
WORKER_KEY = "lab-worker-api-key-not-a-secret"  # inventory/sim/group_vars/all.yml (lab_worker_api_key)
# Starts on a fast clock (nothing here depends on how long a start takes); the same on every run, so the
# restored unit is the deployed one.
FAST = {"sglang_service_extra_env": {"SGLANG_SIM_FAULTS": "{{ _lab_sim_faults }}", "SGLANG_SIM_TIME_SCALE": "0.2"}}


def _run(*cmd) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, text=True, capture_output=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                    f"{result.stderr[-3000:]}")
    return result


def _router_workers(router_url: str) -> list[dict]:
    req = urllib.request.Request(f"{router_url}/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["workers"]


class RouterWatch(threading.Thread):
    """Every half second: whether the router lists the worker, and one short request through the router (a
    client of the gateway; answered or not)."""

    def __init__(self, router_url: str, worker_url: str) -> None:
        super().__init__(daemon=True)
        self.router_url, self.worker_url = router_url, worker_url
        self.samples: list[tuple[float, bool | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        body = json.dumps({"model": "kimi-k2.6", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        while not self.done.is_set():
            now = time.time()
            try:
                listed = any(w["url"] == self.worker_url for w in _router_workers(self.router_url))
            except (OSError, ValueError):
                listed = None
            self.samples.append((now, listed))
            req = urllib.request.Request(f"{self.router_url}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json",
                                                  "Authorization": f"Bearer {WORKER_KEY}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()
            except (OSError, ValueError):
                pass
            self.done.wait(0.5)


@pytest.fixture(scope="module")
def routed_worker(tmp_path_factory):
    """One worker serving tp8 on its lab address behind the gateway: (inventory, worker IP, router IP)."""
    inventory = tmp_path_factory.mktemp("bench-routed") / "hosts.yml"
    _run(sys.executable, LAB_PY, "down", "--name", ROUTED_LAB, "--inventory", inventory)  # a killed run's leftovers
    _run(sys.executable, LAB_PY, "image")
    _run(sys.executable, ROOT / "sim" / "mirrors" / "build.py")
    _run(sys.executable, LAB_PY, "up", "--name", ROUTED_LAB, "--hosts", "1", "--router", "--inventory", inventory)
    try:
        _run(VENV_BIN / "ansible-playbook", "-i", inventory, ROOT / "sim" / "playbooks" / "prepare.yml")
        deployed = run_playbook(inventory, "deploy.yml", "profile=tp8", json.dumps(FAST))
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        _run(VENV_BIN / "ansible", "-i", inventory, "routers", "-m", "ansible.builtin.include_role",
             "-a", "name=moefleet.serving.sglang_router")
        text = inventory.read_text().splitlines()
        worker_ip = next(line.split(":", 1)[1].strip() for line in text if "sglang_service_host:" in line)
        router_ip = [line.split()[-1] for line in text if "ansible_host" in line][-1]
        deadline = time.monotonic() + 60
        while not any(w["status"] == "ready" and w["is_healthy"] for w in _router_workers(f"http://{router_ip}:30000")):
            assert time.monotonic() < deadline, _router_workers(f"http://{router_ip}:30000")
            time.sleep(1)
        yield inventory, worker_ip, router_ip
    finally:
        _run(sys.executable, LAB_PY, "down", "--name", ROUTED_LAB, "--inventory", inventory)


def test_sweep_behind_a_router_measures_the_bind_address_out_of_the_router(routed_worker, tmp_path):
    inventory, worker_ip, router_ip = routed_worker
    router_url, worker_url = f"http://{router_ip}:30000", f"http://{worker_ip}:30000"
    # The worker binds its lab address only: a client at 127.0.0.1 (the sweep's address before) is refused.
    probe = "python3 -c \"import urllib.request as u; u.urlopen('http://{}:30000/health', timeout=5)\" && echo served"
    assert on_host(inventory, WORKER, probe.format(worker_ip)).strip().endswith("served")
    assert "Connection refused" in on_host(inventory, WORKER, probe.format("127.0.0.1"))
    since = time.time()  # the lab's hosts share this machine's clock
    watch = RouterWatch(router_url, worker_url)
    watch.start()
    try:
        result = run_playbook(inventory, "playbooks/bench.yml", json.dumps(FAST), json.dumps({
            "profiles": ["ep8"], "bench_ladder": [1], "bench_input_len": 64, "bench_output_len": 32,
            "bench_prompts_min": 2, "bench_report_dir": str(tmp_path)}), timeout=900)
    finally:
        watch.done.set()
        watch.join(30)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    (report_file,) = tmp_path.glob("bench-*.json")
    report = json.loads(report_file.read_text())
    assert [(p["profile"], p["status"]) for p in report["profiles"]] == [("ep8", "ok")]
    assert report["workload"]["server_url"] == worker_url

    # The worker's runs (systemd invocations), each with its journal lines: the one that served before the sweep,
    # then the starts since: ep8's, then the restored tp8's (the last).
    journal = [json.loads(line) for line in on_host(
        inventory, WORKER, "journalctl -u sglang.service -o json --no-pager").splitlines() if line.startswith("{")]
    invocations: dict[str, list[tuple[float, str]]] = {}
    for entry in journal:
        if entry.get("_SYSTEMD_INVOCATION_ID"):
            invocations.setdefault(entry["_SYSTEMD_INVOCATION_ID"], []).append(
                (int(entry["__REALTIME_TIMESTAMP"]) / 1e6, str(entry.get("MESSAGE"))))
    runs = sorted(invocations.values(), key=lambda lines: lines[0][0])
    before = [lines for lines in runs if lines[0][0] <= since][-1]
    started = [lines for lines in runs if lines[0][0] > since]
    assert len(started) >= 2, [lines[0] for lines in started]
    measured = [message for lines in started[:-1] for _, message in lines]

    def routed(lines):
        return [m for _, m in lines if f"INFO:     {router_ip}:" in m and '"POST ' in m]

    # bench_serving reached the server at its lab address (from the worker itself), ...
    assert any(f"INFO:     {worker_ip}:" in m and '"POST /generate HTTP/1.1" 200' in m for m in measured)
    # ... and the router, which sent its clients' requests to the worker before the sweep and again after it,
    # sent the sweep's starts none: it did not list the worker from before the first restart to after the last.
    assert routed(before) and routed(started[-1])
    assert not [m for lines in started[:-1] for m in routed(lines)]
    first, last = started[0][0][0], started[-2][-1][0]
    assert any(listed for t, listed in watch.samples if t < first), "the router listed the worker before"
    assert not [t for t, listed in watch.samples if first <= t <= last and listed], "a router listed the worker"
    # Back in the router, ready, serving tp8 again.
    assert [(w["status"], w["is_healthy"]) for w in _router_workers(router_url) if w["url"] == worker_url] == [
        ("ready", True)]
    facts = json.loads(on_host(inventory, WORKER, "cat /etc/ansible/facts.d/moefleet.fact"))
    assert (facts["serving_profile"], facts["outcome"]) == ("tp8", "ready")
