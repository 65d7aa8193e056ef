"""Zero-downtime rollouts through the model gateway on a lab of 3 workers and a router (lab.py up --router).

One lab, in file order. The fixture deploys tp8 to the 3 workers as a fleet without a gateway (each on its loopback
address, no key). Then (1) the operator gives it the inventory's gateway, addresses and key and rolls ep8 out: the
rollout installs the gateway, drains each worker where its server runs now, and under streaming load through the new
gateway (from its first worker on) no request fails and every host ends on ep8, ready in the router; the README's
`deploy.yml` command on that fleet is refused before any worker restarts; (2) a rollout of tp2ep4 whose canary runs
out of memory loading it (and falls back) under the same load: no request fails, the rollout stops, and the canary
never receives a request from the moment it was taken out of the router.
The workers decode on a slow clock (SGLANG_SIM_SERVE_TIME_SCALE=10: a 200-token answer streams for about a
second), so requests are in flight whenever a host is drained; they start on a fast one. Then (3) the
rollout's confirmation fails on the hosts that would restart only, (4) a plain systemctl stop of a
serving worker finishes the requests in flight (KillMode=mixed) where KillMode=control-group cuts them, (5) a
bench sweep of a worker measures the address it binds, out of the router, and puts it back, and (6) uninstall
takes a host out of the router first. The workers require an API key and the gateway has it, as in the example
inventory. Between (1) and (2), a fleet that heals (roles/fault_watch, docs/healing.md): a GPU that falls off the bus
under load takes its host out of the router within a second, moefleet remediate reboots it back into service, the
same fault right after keeps it out (and a deploy to it is refused) until a repair is declared, and a hang while
serving is taken out and remediated the same way; every worker serves again after them.

Then, with monitoring on, a rollout rotates the workers' and the gateway's key, and healthy-but-unusual hosts are left
alone through a rollout under load (a prefill that fails /health for twice the hang window on the worker rolled
first while the gate between batches asks it, other devices' PCIe lines, an old fault before the deploy, starts
whose correctness gate sees realistic thoughts). With MOEFLEET_ROUTED_UPGRADE=1 (make test-upgrade) that rollout is
the upgrade of the fleet from SGLang 0.5.10 to 0.5.23 (`moefleet upgrade`'s rollout, old against new measured on a
busy machine): no request fails, every worker ends on 0.5.23, and the report shows both releases' numbers per worker.
Before it in that mode, two upgrades under load stop at the canary: a 0.5.23 that serves 1.5 times slower is measured
and switched back without pip, and one that answers garbage is stopped by the correctness gate; no request fails and
the other workers are untouched. No worker holds the gateway's admin key.

Cost in make test (fresh-clone run CI18, 2026-12-05, beside two other jobs; wall, then CPU on the controller + in the
lab hosts, the `cost:` lines tests/conftest.py prints): 28.4 minutes, 6.3 + 8.5 CPU-minutes. The fixture with (1) 529 s,
129 + 145 CPU-s; the healthy-but-unusual rollout 225 s, 54 + 102; the key rotation 223 s, 45 + 88; monitoring 116 s,
17 + 67 (its packages' installs); (2) 98 s, 29 + 37; (5) 96 s, 27 + 30; the rest under 75 s and 30 CPU-s each.
With the upgrade (make test-upgrade; alone from a fresh clone, 2026-12-05): 23.2 minutes without the two upgrades
stopped at the canary, which cost 131 s (the slower release: its pip install of 0.5.23 and the comparison) and 101 s
(the garbage one); the healthy upgrade 289-318 s. Inside make test the upgrade took 582 s and made the job 36.7
minutes long, which is why make test runs that rollout without it.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ansible_collections.moefleet.serving.plugins.modules import gateway_route  # noqa: E402
from key_search import key_hits  # noqa: E402
from playbook import ROOT, SERVE_ONLY, bench_module, journal_times, on_host, run_playbook, ssh_config_path  # noqa: E402
from router_load import Load, under_load  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "callbacks"))
from task_files import summarize  # noqa: E402  (tests/callbacks/task_files.py)

pytestmark = pytest.mark.lab

LAB = "rtrt"
LAB_PY = ROOT / "sim" / "lab" / "lab.py"
VENV_BIN = Path(sys.executable).parent
STATUS_SCHEMA = json.loads((ROOT / "schemas" / "status.schema.json").read_text())
# The same extra environment on every run, so the unit (and its fingerprint) only changes with the profile.
# Starts run on a fast clock (about 2 s instead of 10: nothing here depends on how long a start takes),
# requests on a slow one.
# Healthy-but-unusual hosts (test_healthy_but_unusual_hosts_are_left_alone): SGLang's /health waits 2 s instead of 20
# for the scheduler's answer (SGLANG_HEALTH_CHECK_TIMEOUT, as the lab's hang window is 20 s instead of 60), and
# prefill runs at 104 prompt tokens per simulated second: an 8192-token chunk takes about 13 s here (longer than
# /health's wait, shorter than the hang window), the short prompts of every other test well under a second.
EXTRA = json.dumps({"sglang_service_extra_env": {"SGLANG_SIM_FAULTS": "{{ _lab_sim_faults }}",
                                                 "SGLANG_SIM_TIME_SCALE": "0.2",
                                                 "SGLANG_SIM_SERVE_TIME_SCALE": "10",
                                                 "SGLANG_HEALTH_CHECK_TIMEOUT": "2",
                                                 "SGLANG_SIM_PREFILL_TOKENS_PER_S": "104"}})
WORKERS = [f"{LAB}-{i}" for i in (1, 2, 3)]
ADMIN_KEY = "lab-router-admin-key-not-a-secret"  # inventory/sim/group_vars/routers.yml
# The workers require a key and the gateway has it (lab.py up --router, as the example inventory from vault):
# clients send it to the gateway, which forwards it.
WORKER_KEY = "lab-worker-api-key-not-a-secret"  # inventory/sim/group_vars/all.yml (lab_worker_api_key)
# The fleet before it had a gateway (the fixture's deploy): each worker on the role's default address, no key.
UNROUTED = {"sglang_service_host": "127.0.0.1", "sglang_service_api_key": "", "sglang_router_worker_api_key": ""}
# The key the workers and the gateway rotate to (test_a_rollout_that_rotates_the_key_completes); the tests
# after it send this one (KEYS).
NEW_KEY = "lab-worker-api-key-rotated-not-a-secret"
# The upgrade test_healthy_but_unusual_hosts_are_left_alone's rollout is: SGLang OLD to NEW, as `moefleet upgrade --to
# NEW` passes it, with a short comparison (8 requests a run, 64-token prompts: the workers prefill slowly here, EXTRA)
# and a tolerance for the suite's noise.
OLD, NEW = "0.5.10", "0.5.23"
# make test-upgrade's lab-router-upgrade job sets it (tests/suite.py): the rollout of the healthy-but-unusual hosts
# (tp8, whose KV pool holds the long prompt) is then that upgrade, and the key rotation before it rolls tp8 too (old and
# new are compared at the profile that serves). make test leaves it out: under the suite's load the upgrade took 582 s
# of the job (3 installs of 0.5.23 and 6 measurements; 289 s alone), which made the router lab 36.7 minutes long.
# Without it the key rotation rolls ep8, so that the tp8 rollout after it restarts every worker.
ROUTED_UPGRADE = os.environ.get("MOEFLEET_ROUTED_UPGRADE") == "1"
ROTATION_PROFILE = "tp8" if ROUTED_UPGRADE else "ep8"
UPGRADE = json.dumps({"sglang_package_spec": f"sglang[all]=={NEW}", "sglang_service_compare_tolerance": 0.2,
                      "sglang_service_compare_prompts": 8, "sglang_service_compare_input_tokens": 64})
REPORT_SCHEMA = json.loads((ROOT / "schemas" / "rollout_report.schema.json").read_text())
KEYS = {"worker": WORKER_KEY}
OLD_FAULT_GPU = 5  # its Xid 79 lines are in every worker's boot log from before the first deploy (the fixture)
OLD_FAULT_PCI = "0000:a1:00"  # GPU 5's PCI bus in the simulated nvidia-smi, as the Xid line names it
CHUNK = 20  # requests per bounded load chunk; chunks follow each other until the rollout ends
RATE = 3.0  # requests started per second
MAX_TOKENS = 200


def _env() -> dict[str, str]:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                PATH=f"{VENV_BIN}:{os.environ['PATH']}")


def _run(*cmd: str | Path) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=_env(), text=True, capture_output=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                    f"{result.stderr[-3000:]}")
    return result


def _ssh(inventory: Path, host: str, command: str) -> str:
    ssh_config = ssh_config_path(inventory)
    return subprocess.run(["ssh", "-F", str(ssh_config), host, command], text=True, capture_output=True,
                          check=True, timeout=60).stdout


class _Phases:
    """Prints how long each step of the fixture took (pytest -s shows it)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def lap(self, what: str) -> None:
        now = time.monotonic()
        print(f"{what}: {now - self.last:.1f} s")
        self.last = now


def _worker_urls(inventory: Path) -> dict[str, str]:
    """Each worker's serving URL, at the private address it binds behind the router (lab.py up --router)."""
    urls, host = {}, None
    for line in inventory.read_text().splitlines():
        word = line.strip().rstrip(":")
        if word in WORKERS:
            host = word
        elif host and line.strip().startswith("sglang_service_host:"):
            urls[host] = f"http://{line.split(':', 1)[1].strip()}:30000"
    return urls


def _wait_serving(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} does not serve"
        time.sleep(0.5)


def _router_workers(router_url: str) -> list[dict]:
    req = urllib.request.Request(f"{router_url}/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["workers"]


def _router_workers_when_up(router_url: str) -> list[dict]:
    """The router's workers, or none while it (re)starts."""
    try:
        return _router_workers(router_url)
    except OSError:
        return []


def _routed_to(router_url: str, key: str) -> str:
    """The worker that answered one chat completion through the router (smg's x-smg-routed-worker-id), or the
    HTTP error the router answered with. The prompt starts with a part of its own: the cache-aware policy sends a
    prompt whose prefix it has seen to the worker that served it."""
    body = json.dumps({"model": "kimi-k2.6", "max_tokens": 1,
                       "messages": [{"role": "user", "content": f"{time.monotonic_ns()} which worker?"}]}).encode()
    headers = {"content-type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(f"{router_url}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.headers.get("x-smg-routed-worker-id", "")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"


def _status(inventory: Path, tmp: Path) -> dict[str, dict]:
    path = tmp / "status.json"
    result = run_playbook(inventory, "playbooks/status.yml", f"moefleet_status_path={path}")
    assert result.returncode == 0, result.stdout[-3000:]
    document = json.loads(path.read_text())
    jsonschema.validate(document, STATUS_SCHEMA)
    return {h["host"]: h for h in document["hosts"]}


def _serves_the_model(router_url: str) -> bool:
    """The gateway runs and lists a worker ready and healthy with the model (one it can route requests to)."""
    return any(w.get("status") == "ready" and w.get("is_healthy") and w.get("model_id") == "kimi-k2.6"
               for w in _router_workers_when_up(router_url))


def _rollout_under_load(inventory: Path, router_url: str, *extra: str, client_key: str | None = None,
                        from_first_worker: bool = False, verbose: bool = False, serve_only: bool = True,
                        log_path: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """The rollout playbook on the installed workers as `moefleet rollout --serve-only` runs it (--skip-tags install;
    serve_only=False: the whole path, as `moefleet upgrade` runs it), with bounded load chunks through the router from
    its start to its end (from_first_worker: from the moment the gateway, which the rollout installs, first lists a
    worker that serves the model), sent with ``client_key`` (default KEYS["worker"]); verbose: -v, which prints each
    task's result; log_path: where its output goes as it runs (a temporary file by default)."""
    client_key = KEYS["worker"] if client_key is None else client_key
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "rollout.yml"),
           *(SERVE_ONLY if serve_only else ()), "-e", "confirm=yes", "-e", EXTRA,
           *(a for e in extra for a in ("-e", e)),
           *(["-v"] if verbose else [])]
    with (open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")) as log:
        rc, totals = under_load(cmd, router_url, chunk=CHUNK, rate=RATE, max_tokens=MAX_TOKENS, api_key=client_key,
                                cwd=str(ROOT), env=_env(), output=log,
                                ready=(lambda: _serves_the_model(router_url)) if from_first_worker else None)
        log.seek(0)
        out = log.read()
    print(f"rollout {extra}: {totals}")
    return subprocess.CompletedProcess(cmd, rc, out, ""), totals


@pytest.fixture(scope="module")
def routed_lab(tmp_path_factory):
    """3 workers serving tp8 behind the gateway: (inventory, router URL)."""
    base = tmp_path_factory.mktemp("routed")
    inventory = base / "hosts.yml"
    clock = _Phases()
    _run(sys.executable, LAB_PY, "down", "--name", LAB, "--inventory", inventory)  # a killed run's leftovers
    _run(sys.executable, LAB_PY, "image")
    _run(sys.executable, ROOT / "sim" / "mirrors" / "build.py")
    # the workers from the installed-base image (lab.py installed): molecule's default scenario installs from bare
    _run(sys.executable, LAB_PY, "up", "--name", LAB, "--hosts", "3", "--router", "--monitoring", "--installed",
         "--inventory", inventory)
    clock.lap("lab up")
    try:
        _run(VENV_BIN / "ansible-playbook", "-i", inventory, ROOT / "sim" / "playbooks" / "prepare.yml")
        clock.lap("prepare")
        # A fault of the past in each worker's boot log, before moefleet came: GPU 5 fell off the bus and came back
        # (its lines only). The watcher a deploy installs starts reading after them: nothing acts on it.
        for worker in WORKERS:
            _run(sys.executable, LAB_PY, "fault", worker, "xid79-lines", "--gpu", str(OLD_FAULT_GPU))
        # A fleet without a gateway first: all workers at once (deploy.yml), each serving on its loopback address
        # (the role's default) without a key. test_a_fleet_given_a_gateway_... then gives it the inventory's gateway,
        # addresses and key in one rollout. The workers are installed (the installed base): only what serves
        # changes, as --serve-only. (No gateway serves yet: deploy.yml behind routers needs the maintenance window,
        # which it announces.)
        deployed = run_playbook(inventory, "deploy.yml", "profile=tp8", EXTRA, "moefleet_maintenance_window=true",
                                json.dumps(UNROUTED), options=SERVE_ONLY)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        clock.lap("deploy tp8 to 3 workers at once, no gateway")
        router_ip = [line.split()[-1] for line in inventory.read_text().splitlines() if "ansible_host" in line][-1]
        yield inventory, f"http://{router_ip}:30000"
    finally:
        _run(sys.executable, LAB_PY, "down", "--name", LAB, "--inventory", inventory)


def test_a_fleet_given_a_gateway_rolls_out_through_it_and_fails_no_request(routed_lab, tmp_path, record_property):
    """The fleet serves without a gateway, each worker on its loopback address and without a key (the fixture). The
    operator adds the routers group, each worker's address and the key (the lab's inventory) and rolls ep8 out: the
    rollout installs the gateway, and each worker's drain asks its server where and as it runs now (loopback, no
    key) before it restarts on its address with the key and joins. Load through the new gateway from the moment it
    first routes to a worker: none fails, and every worker joins."""
    inventory, router_url = routed_lab
    for host, url in _worker_urls(inventory).items():  # serving, but not at the address the gateway will use
        assert on_host(inventory, host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health") == "200"
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/health", timeout=5)
    with pytest.raises(urllib.error.URLError):
        _router_workers(router_url)  # no gateway yet
    result, load = _rollout_under_load(inventory, router_url, "profile=ep8", from_first_worker=True)
    # bench part (e)'s row for this rollout (its smoke run: the bench measures the same way, tests/router_load.py)
    record_property("figure", f"bench (e) smoke, ep8 rolled out to 3 workers through a new gateway under load "
                              f"({CHUNK} requests per {CHUNK / RATE:.0f} s chunk): "
                              + " ".join(bench_module().router_row("through router", load, result.returncode).split()))
    assert result.returncode == 0, result.stdout[-4000:]
    assert load["failed"] == 0 and load["sent"] >= CHUNK, load
    hosts = _status(inventory, tmp_path)
    assert {h: (hosts[h]["serving_profile"], hosts[h]["health"], hosts[h]["router"]) for h in WORKERS} == {
        h: ("ep8", "serving", "ready") for h in WORKERS}
    # Each router lists every worker ready with the model (smg registers a worker re-added without its key under
    # model "unknown", ready and healthy, and answers 404 for the model), and requests with the key keep being
    # answered after the rollout, by every worker; without the key the gateway refuses them.
    listed = _router_workers(router_url)
    assert sorted((w["status"], w["model_id"]) for w in listed) == [("ready", "kimi-k2.6")] * 3, listed
    after = Load(router_url, 12, 12.0, 8, api_key=KEYS["worker"]).start().result()
    assert after["failed"] == 0 and after["sent"] == 12, after
    for url in _worker_urls(inventory).values():  # the rollout's own check (modules/gateway_route.py), per worker
        found, attempts, routed, error = gateway_route.wait_routed(router_url, url, "kimi-k2.6", KEYS["worker"], 30)
        assert found, (url, attempts, routed, error)
    assert _routed_to(router_url, "") == "HTTP 401"


def test_the_readmes_deploy_command_is_refused_before_any_host_changes(routed_lab):
    """The README's first command, `ansible-playbook deploy.yml -e profile=...`, on this routed fleet: refused on the
    controller with a sentence that names both ways (the drained rollout, or the maintenance window), and no
    worker's server restarted."""
    inventory, _ = routed_lab
    started = {h: on_host(inventory, h, "systemctl show -p InvocationID --value sglang.service").strip()
               for h in WORKERS}
    result = run_playbook(inventory, "deploy.yml", "profile=tp8", EXTRA, options=SERVE_ONLY)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "moefleet rollout" in result.stdout and "moefleet_maintenance_window=true" in result.stdout, \
        result.stdout[-3000:]
    assert {h: on_host(inventory, h, "systemctl show -p InvocationID --value sglang.service").strip()
            for h in WORKERS} == started


def test_no_worker_holds_the_gateway_admin_key(routed_lab):
    """No file and no process environment or command line of any worker holds the gateway's admin key
    (tests/key_search.py: the key goes to each host's grep on its standard input); the gateway host does (its
    credential), which shows the search finds it where it is."""
    inventory, _ = routed_lab

    def on(host: str):
        def run(argv: list[str], stdin: str) -> str:
            return subprocess.run(["ssh", "-F", str(ssh_config_path(inventory)), host, shlex.join(argv)], input=stdin,
                                  text=True, capture_output=True, timeout=600).stdout
        return run

    assert {h: key_hits(on(h), ADMIN_KEY) for h in WORKERS} == {h: [] for h in WORKERS}
    assert "/etc/smg/credentials/smg-secrets" in key_hits(on(f"{LAB}-router"), ADMIN_KEY)


# ---- A fleet that heals (roles/fault_watch, playbooks/remediate.yml): after the first rollout, every worker on ep8
HEALING: dict[str, str] = {}  # the worker each fault hit, for the tests after
OUT_WITHIN_S = 30  # the bound for a GPU fault; the watcher acts within a second of the kernel's line
# a hang: SGLang's /health fails after its own 20 s, the lab's fault_watch_hang_seconds is 20 (one failed answer),
# plus up to two of the watcher's 5-s intervals
HANG_OUT_WITHIN_S = 20 + 20 + 2 * 5 + 5


def _loads(url: str) -> int:
    """Requests the worker runs or queues now (SGLang's /v1/loads); -1 when it does not answer."""
    req = urllib.request.Request(f"{url}/v1/loads?include=core", headers={"Authorization": f"Bearer {KEYS['worker']}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(json.load(resp)["aggregate"]["total_reqs"])
    except (OSError, ValueError, KeyError):
        return -1


def _routable(router_url: str, url: str) -> bool:
    """The router may send the worker new requests: listed, and not draining (smg routes none to a draining worker
    and forgets it 5 s later)."""
    return any(w["url"] == url and w.get("status") != "draining" for w in _router_workers_when_up(router_url))


def _inject(host: str, fault: str) -> None:
    _run(sys.executable, LAB_PY, "fault", host, fault, "--gpu", "3")


def _health_record(inventory: Path, host: str) -> dict:
    """The fault watcher's record on the host (none before its first event)."""
    text = on_host(inventory, host, "cat /etc/ansible/facts.d/moefleet_health.fact 2>/dev/null || echo '{}'")
    return json.loads(text)


def _remediate(inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "moefleet"), "remediate", "-i", str(inventory), *extra], cwd=ROOT,
                          env=_env(), text=True, capture_output=True, timeout=900)


def _fault_under_load(inventory: Path, router_url: str, fault: str, candidates: list[str], within: float,
                      seconds: float) -> dict:
    """Streaming load through the router (and, for the comparison, straight to every worker) for `seconds`; the fault
    is injected on the candidate running the most requests; returns when the load ended, with what it measured."""
    urls = _worker_urls(inventory)
    ids = {w["id"]: w["url"] for w in _router_workers(router_url)}
    load = Load(router_url, int(4 * seconds), 4, MAX_TOKENS, api_key=KEYS["worker"]).start()
    direct = Load([urls[h] for h in WORKERS], int(1.5 * seconds), 1.5, MAX_TOKENS, api_key=KEYS["worker"]).start()
    deadline = time.monotonic() + 20
    while True:  # a worker with requests in flight, so that the fault cuts some
        running = {h: _loads(urls[h]) for h in candidates}
        victim = max(candidates, key=running.__getitem__)
        if running[victim] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    faulted = time.monotonic()
    _inject(victim, fault)
    while _routable(router_url, urls[victim]):
        assert time.monotonic() - faulted < within, f"{victim} still routable {within} s after the fault"
        time.sleep(0.1)
    out = time.monotonic()
    summary, direct_summary = load.result(), direct.result()
    after = [t for t in load.timed if t[0] > out]
    cut = [t for t in load.timed if not t[2]]
    direct_cut = [t for t in direct.timed if not t[2]]
    measured = {"victim": victim, "in_flight_at_fault": running[victim], "out_after_s": round(out - faulted, 2),
                "through_router": summary, "failed_through_router": len(cut),
                "direct": direct_summary, "failed_direct": len(direct_cut),
                "failed_direct_after_out": sum(1 for t in direct_cut if t[0] > out)}
    print(f"{fault} on {victim}: {measured}")
    # From the moment it was out: no request went to it, none failed.
    assert after, "the load ended before the host was out"
    assert all(t[2] for t in after), [t for t in after if not t[2]]
    assert not any(ids.get(t[4]) == urls[victim] for t in after)
    assert all(t[0] <= out for t in cut), "a request that started after the host was out failed"
    return measured


def test_a_gpu_that_falls_off_the_bus_takes_its_host_out_at_once(routed_lab, tmp_path):
    """Xid 79 on GPU 3 of the busiest worker under streaming load: within a second (the issue allows 30) it is no
    longer routable, requests started after that all succeed and none reaches it; the watcher records the event once
    (gpu 3, Xid 79), stopped SGLang, which systemd does not restart into the lost GPU; status calls it unhealthy."""
    inventory, router_url = routed_lab
    before = {h: len(_health_record(inventory, h).get("events", [])) for h in WORKERS[1:]}
    # 20 s of load: out within a second of the fault (about 2 s in), then requests that must all go elsewhere
    measured = _fault_under_load(inventory, router_url, "xid79", WORKERS[1:], OUT_WITHIN_S, 20)
    victim = HEALING["xid79"] = measured["victim"]
    assert measured["out_after_s"] <= OUT_WITHIN_S
    record = _health_record(inventory, victim)
    assert record["state"] == "unfit" and record["reason"] == "gpu 3: Xid 79 GPU has fallen off the bus", record
    xids = [e for e in record["events"][before[victim]:] if e.get("code") == 79]
    assert len(xids) == 1, record["events"]  # the driver's second "fallen off the bus" line is the same fault
    assert xids[0]["actions"] == {"stopped": True}  # the worker calls no gateway: the gateway's guard took it out
    left_out = _ssh(inventory, f"{LAB}-router", "cat /var/lib/smg/workers-left-out").split()
    assert _worker_urls(inventory)[victim] in left_out  # a restarted gateway leaves it out
    time.sleep(8)  # past the serving drop-in's first RestartSec (5 s)
    state = on_host(inventory, victim, "systemctl show -p ActiveState --value sglang.service").strip()
    assert state in ("inactive", "failed"), state
    assert "GPU is lost" in on_host(inventory, victim, "nvidia-smi -L")
    entry = _status(inventory, tmp_path)[victim]
    assert entry["state"] == "unhealthy" and entry["fault"]["reason"] == record["reason"], entry


def test_remediate_reboots_the_host_and_puts_it_back(routed_lab, tmp_path):
    """moefleet remediate: the host reboots (for real: the container restarts and systemd boots), its GPUs match what
    it had at deploy, it serves its unit again and every router routes to it."""
    inventory, router_url = routed_lab
    victim = HEALING["xid79"]
    booted = on_host(inventory, victim, "awk '{print $22}' /proc/1/stat")
    result = _remediate(inventory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{victim} was unfit (gpu 3: Xid 79 GPU has fallen off the bus)" in result.stdout
    assert on_host(inventory, victim, "awk '{print $22}' /proc/1/stat") != booted, "it did not reboot"
    assert _routable(router_url, _worker_urls(inventory)[victim])
    record = _health_record(inventory, victim)
    assert record["state"] == "healthy" and record["remediations"][-1]["was"] == "unfit"
    assert _status(inventory, tmp_path)[victim]["state"] == "ready"


def test_the_same_fault_right_after_keeps_the_host_out_with_the_evidence(routed_lab, tmp_path):
    """The same Xid 79 again, within fault_watch_retry_window of the remediation: out again at once, and
    moefleet remediate keeps it out (no reboot loop) saying it needs hardware attention, with the evidence; a deploy
    to it is refused. After a repair, -e fault_watch_retry_window=0 lets it back."""
    inventory, router_url = routed_lab
    victim, url = HEALING["xid79"], _worker_urls(inventory)[HEALING["xid79"]]
    faulted = time.monotonic()
    _inject(victim, "xid79")
    while _routable(router_url, url):
        assert time.monotonic() - faulted < OUT_WITHIN_S
        time.sleep(0.1)
    booted = on_host(inventory, victim, "awk '{print $22}' /proc/1/stat")
    result = _remediate(inventory)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{victim} needs hardware attention" in result.stderr and "gpu 3: Xid 79" in result.stderr
    assert on_host(inventory, victim, "awk '{print $22}' /proc/1/stat") == booted, "it rebooted"
    assert not _routable(router_url, url)
    assert _health_record(inventory, victim)["state"] == "hardware"
    entry = _status(inventory, tmp_path)[victim]
    assert entry["state"] == "unhealthy" and entry["fault"]["state"] == "hardware", entry
    # A deploy does not start SGLang on it either: refused with the reason, before the unit changes.
    unit = on_host(inventory, victim, "sha256sum /etc/systemd/system/sglang.service")
    # (deploy.yml does not drain: behind routers only in a maintenance window; the host is out of the routers anyway)
    deployed = run_playbook(inventory, "deploy.yml", "profile=ep8", EXTRA, "moefleet_maintenance_window=true",
                            options=(*SERVE_ONLY, "-l", f"{victim},localhost"))
    assert deployed.returncode != 0
    assert f"{victim} is unfit to serve since" in deployed.stdout and "moefleet remediate" in deployed.stdout
    assert on_host(inventory, victim, "sha256sum /etc/systemd/system/sglang.service") == unit
    again = _remediate(inventory, "-e", "fault_watch_retry_window=0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _routable(router_url, url)


def test_a_hang_while_serving_takes_the_host_out_and_remediate_brings_it_back(routed_lab):
    """Every NCCL collective of the other worker hangs (no error, requests stop advancing): SGLang's /health fails,
    the watcher calls it a hang, takes the host out and stops SGLang; remediate reboots it back into service."""
    inventory, router_url = routed_lab
    others = [h for h in WORKERS[1:] if h != HEALING["xid79"]]
    measured = _fault_under_load(inventory, router_url, "hang", others, HANG_OUT_WITHIN_S, 40)
    victim = measured["victim"]
    record = _health_record(inventory, victim)
    assert record["state"] == "unfit" and record["events"][-1]["kind"] == "hang", record
    result = _remediate(inventory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _routable(router_url, _worker_urls(inventory)[victim])
    assert _health_record(inventory, victim)["state"] == "healthy"

def test_a_host_whose_start_fails_never_receives_a_request(routed_lab, tmp_path):
    inventory, router_url = routed_lab
    canary = WORKERS[0]
    before = _ssh(inventory, canary, "systemctl show -P InvocationID sglang.service").strip()
    since = time.time()  # the lab's hosts share this machine's clock
    fault = json.dumps({"sim_faults": [{"fault": "oom_weight_load", "profile": "tp2ep4"}]})
    result, load = _rollout_under_load(inventory, router_url, "profile=tp2ep4", fault)
    assert result.returncode != 0, "the canary's failed start stops the rollout"
    assert load["failed"] == 0, load
    hosts = _status(inventory, tmp_path)
    assert hosts[canary]["router"] == "out" and hosts[canary]["asked_profile"] == "tp2ep4"
    assert hosts[canary]["outcome"] in ("degraded", "restored", "failed")
    assert {h: (hosts[h]["serving_profile"], hosts[h]["router"]) for h in WORKERS[1:]} == {
        h: ("ep8", "ready") for h in WORKERS[1:]}
    # A restarted gateway goes back to the workers it was started with, except those a rollout left out.
    _ssh(inventory, f"{LAB}-router", "systemctl restart smg.service")
    deadline = time.monotonic() + 60
    while sum(w["status"] == "ready" for w in _router_workers_when_up(router_url)) < 2:
        assert time.monotonic() < deadline, _router_workers_when_up(router_url)
        time.sleep(1)
    time.sleep(5)  # a worker it would register takes its first health check to show up
    assert _worker_urls(inventory)[canary] not in {w["url"] for w in _router_workers(router_url)}
    # Since this rollout began, only the start that served before it (drained first) answered clients' requests: the
    # failed tp2ep4 start and the fallback that serves now answered none. The correctness gate's own requests come
    # from the worker itself (its private address; the access log names the client), not through the router.
    journal = _ssh(inventory, canary, "journalctl -u sglang.service -o json")
    own = _worker_urls(inventory)[canary].split("//", 1)[1].rsplit(":", 1)[0]
    served = [e for e in map(json.loads, journal.splitlines())
              if "POST /v1/chat/completions" in str(e.get("MESSAGE")) and int(e["__REALTIME_TIMESTAMP"]) / 1e6 > since
              and str(e.get("MESSAGE")).split()[1].rsplit(":", 1)[0] not in (own, "127.0.0.1")]
    assert {e.get("_SYSTEMD_INVOCATION_ID") for e in served} <= {before}, len(served)


def test_the_confirmation_refuses_on_the_hosts_that_would_restart(routed_lab, tmp_path):
    """Without confirm=yes the rollout fails on each host that serves another profile (not on the first host,
    which needs no restart here) and changes nothing anywhere."""
    inventory, _ = routed_lab
    overlay = tmp_path / "profiles.yml"  # per host: the first keeps what it serves, the second would restart
    overlay.write_text("blackwell:\n  hosts:\n" + "".join(
        f"    {h}:\n      sglang_profile: {'tp8' if h == WORKERS[1] else 'ep8'}\n" for h in WORKERS))
    invocations = {h: _ssh(inventory, h, "systemctl show -P InvocationID sglang.service").strip() for h in WORKERS}
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "-i", str(overlay),
           str(ROOT / "playbooks" / "rollout.yml")]
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), text=True, capture_output=True, timeout=300)
    assert result.returncode != 0, result.stdout[-3000:]
    failed = {line.split("[", 1)[1].split("]", 1)[0] for line in result.stdout.splitlines()
              if line.startswith("fatal: [")}
    assert failed == {WORKERS[1]}, result.stdout[-3000:]
    assert f"These hosts serve another profile and would be restarted: {WORKERS[1]}." in result.stdout
    assert "Install, check and serve the profile" not in result.stdout, "the run stopped before the rollout"
    assert {h: _ssh(inventory, h, "systemctl show -P InvocationID sglang.service").strip()
            for h in WORKERS} == invocations


def _stop_under_load(inventory: Path, host: str, url: str) -> tuple[dict, float]:
    """A plain systemctl stop of the serving host while streamed requests run on it (sent to it directly):
    the load's summary and the seconds the stop took."""
    # all 6 start within a second; each streams for about 3.5 s
    load = Load(url, 6, 6.0, 1200, api_key=KEYS["worker"]).start()
    time.sleep(1.2)
    began = time.monotonic()
    _ssh(inventory, host, "systemctl stop sglang.service")
    took = time.monotonic() - began
    return load.result(), took


def test_a_plain_stop_finishes_the_requests_in_flight(routed_lab):
    """sglang.service's KillMode=mixed: systemctl stop SIGTERMs SGLang's main process alone, which drains;
    with KillMode=control-group (a drop-in, to show what it guards against) the same stop cuts them."""
    inventory, _ = routed_lab
    host = WORKERS[2]
    url = _worker_urls(inventory)[host]
    assert "KillMode=mixed" in _ssh(inventory, host, "systemctl cat sglang.service")
    # SGLang's watchdog looks every 5 s, so a drain can take two looks (up to ~9 s here): room beyond the lab's
    # 10 s stop timeout (real hosts: 300 s), so that this checks the kill mode, not the timeout
    timeout = "/etc/systemd/system/sglang.service.d/zz-test-timeout.conf"
    _ssh(inventory, host, f"printf '[Service]\\nTimeoutStopSec=30\\n' > {timeout} && systemctl daemon-reload")
    try:
        mixed, took = _stop_under_load(inventory, host, url)
    finally:
        _ssh(inventory, host, f"rm -f {timeout} && systemctl daemon-reload")
    print(f"KillMode=mixed: {mixed}, stop took {took:.1f} s")
    assert mixed["failed"] == 0 and mixed["sent"] == 6, mixed
    assert took > 1, "the stop waited for the requests"
    dropin = "/etc/systemd/system/sglang.service.d/zz-test-killmode.conf"
    _ssh(inventory, host, f"printf '[Service]\\nKillMode=control-group\\n' > {dropin} && systemctl daemon-reload"
                          " && systemctl start sglang.service")
    try:
        _wait_serving(url)
        cut, took = _stop_under_load(inventory, host, url)
        print(f"KillMode=control-group: {cut}, stop took {took:.1f} s")
        assert cut["failed"] > 0, cut
    finally:
        _ssh(inventory, host, f"rm -f {dropin} && systemctl daemon-reload")
    # A start that has not served yet (loading, slowed down here) has nothing to drain: its stop takes
    # seconds, not the stop timeout (10 s in the lab), so a failed or hung start is still stopped at once.
    slow = "/etc/systemd/system/sglang.service.d/zz-test-slow.conf"
    _ssh(inventory, host, f"printf '[Service]\\nEnvironment=SGLANG_SIM_TIME_SCALE=5\\n' > {slow}"
                          " && systemctl daemon-reload && systemctl start --no-block sglang.service && sleep 3")
    try:
        assert _ssh(inventory, host, "systemctl is-active sglang.service").strip() == "active"
        began = time.monotonic()
        _ssh(inventory, host, "systemctl stop sglang.service")
        took = time.monotonic() - began
        print(f"stop of a start still loading took {took:.1f} s")
        assert took < 5, took
    finally:
        _ssh(inventory, host, f"rm -f {slow} && systemctl daemon-reload && systemctl start sglang.service")
    _wait_serving(url)


class RouterWatch(threading.Thread):
    """Every half second: whether the router lists the worker, and one short request through the router (a
    client of the gateway; answered or not)."""

    def __init__(self, router_url: str, worker_url: str) -> None:
        super().__init__(daemon=True)
        self.router_url, self.worker_url = router_url, worker_url
        self.samples: list[tuple[float, bool | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            body = json.dumps({"model": "kimi-k2.6", "max_tokens": 1,  # a prompt of its own: see _routed_to
                               "messages": [{"role": "user", "content": f"{time.monotonic_ns()} hi"}]}).encode()
            now = time.time()
            try:
                listed = any(w["url"] == self.worker_url for w in _router_workers(self.router_url))
            except (OSError, ValueError):
                listed = None
            self.samples.append((now, listed))
            req = urllib.request.Request(f"{self.router_url}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json",
                                                  "Authorization": f"Bearer {KEYS['worker']}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()
            except (OSError, ValueError):
                pass
            self.done.wait(0.5)


def test_a_bench_sweep_measures_the_bind_address_out_of_the_router(routed_lab, tmp_path):
    """playbooks/bench.yml on a worker behind the gateway: bench_serving measures the address the worker binds
    (not 127.0.0.1, which it refuses), the host is out of the router from before its first restart to after the
    restore, then back in it, ready, serving what it served before (ep8, from the first test)."""
    inventory, router_url = routed_lab
    host = WORKERS[2]
    worker_url = _worker_urls(inventory)[host]
    worker_ip = worker_url.removeprefix("http://").rsplit(":", 1)[0]
    router_ip = router_url.removeprefix("http://").rsplit(":", 1)[0]
    # The worker binds its lab address only: a client at 127.0.0.1 (the sweep's address before) is refused.
    probe = "python3 -c \"import urllib.request as u; u.urlopen('http://{}:30000/health', timeout=5)\" && echo served"
    assert on_host(inventory, host, probe.format(worker_ip)).strip().endswith("served")
    assert "Connection refused" in on_host(inventory, host, probe.format("127.0.0.1"))
    since = time.time()  # the lab's hosts share this machine's clock
    watch = RouterWatch(router_url, worker_url)
    watch.start()
    try:
        result = run_playbook(inventory, "playbooks/bench.yml", EXTRA, json.dumps({
            "profiles": ["tp8"], "bench_ladder": [1], "bench_input_len": 64, "bench_output_len": 32,
            "bench_prompts_min": 2, "bench_report_dir": str(tmp_path), "bench_host": host}), timeout=900)
    finally:
        watch.done.set()
        watch.join(30)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    (report_file,) = tmp_path.glob("bench-*.json")
    report = json.loads(report_file.read_text())
    assert [(p["profile"], p["status"]) for p in report["profiles"]] == [("tp8", "ok")]
    assert report["workload"]["server_url"] == worker_url

    # The worker's runs (systemd invocations), each with its journal lines: the one that served before the sweep,
    # then the starts since: tp8's, then the restored ep8's (the last).
    journal = [json.loads(line) for line in on_host(
        inventory, host, "journalctl -u sglang.service -o json --no-pager").splitlines() if line.startswith("{")]
    invocations: dict[str, list[tuple[float, str]]] = {}
    for entry in journal:
        if entry.get("_SYSTEMD_INVOCATION_ID"):
            invocations.setdefault(entry["_SYSTEMD_INVOCATION_ID"], []).append(
                (int(entry["__REALTIME_TIMESTAMP"]) / 1e6, str(entry.get("MESSAGE"))))
    runs = sorted(invocations.values(), key=lambda lines: lines[0][0])
    started = [lines for lines in runs if lines[0][0] > since]
    assert len(started) >= 2, [lines[0] for lines in started]
    measured = [message for lines in started[:-1] for _, message in lines]

    def routed(lines):
        return [m for _, m in lines if f"INFO:     {router_ip}:" in m and '"POST ' in m]

    # bench_serving reached the server at its lab address (from the worker itself), ...
    assert any(f"INFO:     {worker_ip}:" in m and '"POST /generate HTTP/1.1" 200' in m for m in measured)
    # ... and the router, which sent its clients' requests to the worker before the sweep and again after it,
    # sent the sweep's starts none: it did not list the worker from before the first restart to after the last.
    # (the run before the sweep was restarted by the stop test and may have had no router request since: the
    # router listing it before the sweep stands for it)
    assert routed(started[-1])
    assert not [m for lines in started[:-1] for m in routed(lines)]
    first, last = started[0][0][0], started[-2][-1][0]
    assert any(listed for t, listed in watch.samples if t < first), "the router listed the worker before"
    assert not [t for t, listed in watch.samples if first <= t <= last and listed], "a router listed the worker"
    # Back in the router, ready, serving ep8 again.
    assert [(w["status"], w["is_healthy"]) for w in _router_workers(router_url) if w["url"] == worker_url] == [
        ("ready", True)]
    facts = json.loads(on_host(inventory, host, "cat /etc/ansible/facts.d/moefleet.fact"))
    assert (facts["serving_profile"], facts["outcome"]) == ("ep8", "ready")


# ------------------------------------------------------------------------------------------------ monitoring
# playbooks/monitoring.yml with Prometheus and Alertmanager on the gateway's host (lab.py up --monitoring), from
# Debian's archive: the real Prometheus scrapes the real smg, the real node_exporter and the simulated workers.
DASHBOARDS = ROOT / "roles" / "monitoring_server" / "files" / "dashboards"
SCRAPE_S = 5  # inventory/sim/group_vars/monitoring.yml


def _prometheus(router_url: str, path: str, **params: str):
    base = router_url.rsplit(":", 1)[0] + ":9090"
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{base}{path}{'?' + query if query else ''}", timeout=30) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def _firing(router_url: str, alert: str, host: str) -> dict | None:
    for a in _prometheus(router_url, "/api/v1/alerts")["alerts"]:
        if a["labels"].get("alertname") == alert and a["labels"].get("host") == host and a["state"] == "firing":
            return a
    return None


def _wait_firing(router_url: str, alert: str, host: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while (fired := _firing(router_url, alert, host)) is None:
        assert time.monotonic() < deadline, (alert, host, _prometheus(router_url, "/api/v1/alerts")["alerts"])
        time.sleep(1)
    return fired


def test_prometheus_scrapes_every_target_and_every_dashboard_panel_has_data(routed_lab, tmp_path):
    """The monitoring playbook on the fleet: every target up (3 workers' SGLang, the gateway, node_exporter on all
    4 hosts, Prometheus and Alertmanager), and every query of every shipped dashboard returns series, with $host a
    worker's name. The canary the failed rollout left on a fallback fires MoefleetServesFallback."""
    inventory, router_url = routed_lab
    result = run_playbook(inventory, "playbooks/monitoring.yml")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    expected = {("sglang", w) for w in WORKERS} | {("node", h) for h in [*WORKERS, f"{LAB}-router"]} | {
        ("smg", f"{LAB}-router"), ("prometheus", None), ("alertmanager", None)}
    deadline = time.monotonic() + 60
    while True:
        targets = _prometheus(router_url, "/api/v1/targets")["activeTargets"]
        seen = {(t["labels"]["job"], t["labels"].get("host")): t["health"] for t in targets}
        if set(seen) == expected and set(seen.values()) == {"up"}:
            break
        assert time.monotonic() < deadline, {k: (v, [t.get("lastError") for t in targets
                                                      if t["labels"]["job"] == k[0]]) for k, v in seen.items()}
        time.sleep(2)
    # Streamed requests through the gateway and straight to the worker $host stands for, so the request families of
    # the last minute have samples there (SGLang observes the time between tokens of streamed requests only, and the
    # gateway's cache-aware policy may send all of the gateway's to the other worker).
    traffic = Load([router_url, _worker_urls(inventory)[WORKERS[2]]], 6, 3.0, 16,
                   api_key=KEYS["worker"]).start().result()
    assert traffic["ok"] == 6, traffic
    time.sleep(2 * SCRAPE_S)
    empty = []
    for name in ("moefleet-fleet.json", "moefleet-host.json", "moefleet-gateway.json"):
        board = json.loads((DASHBOARDS / name).read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m").replace("$host", WORKERS[2])
                if not _prometheus(router_url, "/api/v1/query", query=expr)["result"]:
                    empty.append(f"{name} / {panel['title']}: {expr}")
    assert not empty, "\n".join(empty)
    # The failed rollout's canary serves a fallback (test 2): the rule says so.
    fallback = _wait_firing(router_url, "MoefleetServesFallback", WORKERS[0], 3 * SCRAPE_S)
    assert fallback["labels"]["outcome"] in ("degraded", "restored"), fallback
    # moefleet status finds Prometheus (group monitoring) and shows each worker's live figures.
    _status(inventory, tmp_path)  # runs the status playbook, validates its document against the schema
    document = json.loads((tmp_path / "status.json").read_text())
    assert document["monitoring"]["prometheus"] == router_url.rsplit(":", 1)[0] + ":9090"
    assert {h["host"]: set(h["live"]) for h in document["hosts"]} == {
        w: {"running_requests", "kv_usage", "ttft_p99_seconds"} for w in WORKERS}
    assert document["hosts"][2]["live"]["running_requests"] is not None


def _paging(router_url: str) -> list[dict]:
    """The critical alerts Alertmanager would send now (active, neither silenced nor inhibited)."""
    base = router_url.rsplit(":", 1)[0] + ":9093"
    query = urllib.parse.urlencode({"active": "true", "silenced": "false", "inhibited": "false"})
    with urllib.request.urlopen(f"{base}/api/v2/alerts?{query}", timeout=30) as resp:
        alerts = json.load(resp)
    return [a["labels"] for a in alerts if a["labels"].get("severity") == "critical"]


def _long_prompt(url: str, tokens: int) -> dict:
    """One prompt of `tokens` tokens (SGLang's /generate with input_ids), 8 tokens back; its answer."""
    body = json.dumps({"input_ids": [0] * tokens, "sampling_params": {"max_new_tokens": 8}}).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={
        "content-type": "application/json", "Authorization": f"Bearer {KEYS['worker']}"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)


def _rotate_key(inventory: Path, key: str) -> None:
    """Give every worker (sglang_service_api_key) and the gateway (sglang_router_worker_api_key) a new key, as host
    variables of the lab's inventory (they take precedence over inventory/sim/group_vars)."""
    lines = []
    for line in inventory.read_text().splitlines():
        lines.append(line)
        if line.strip().startswith("sglang_service_host:"):
            lines.append(f"          sglang_service_api_key: {key}")
        elif line.strip() == f"ansible_host: {line.split()[-1]}" and lines[-2].strip() == f"{LAB}-router:":
            lines.append(f"          sglang_router_worker_api_key: {key}")
    inventory.write_text("\n".join(lines) + "\n")
    assert inventory.read_text().count(key) == len(WORKERS) + 1, inventory.read_text()


def _answer_code(url: str, key: str) -> int:
    """The HTTP status of one short chat completion sent straight to a worker with ``key``."""
    body = json.dumps({"model": "kimi-k2.6", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(), headers={
        "content-type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _release_of(inventory: Path, host: str) -> str:
    """The release the worker's server reports, and the virtualenv its unit runs: "0.5.10 in 0.5.10"."""
    req = urllib.request.Request(f"{_worker_urls(inventory)[host]}/server_info",
                                 headers={"Authorization": f"Bearer {KEYS['worker']}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        version = json.load(resp)["version"]
    unit = on_host(inventory, host, "systemctl cat sglang.service")
    venv = re.search(r"/opt/sglang/([0-9.]+)/bin/python -m sglang", unit)
    return f"{version} in {venv.group(1) if venv else '?'}"


def _health_code(url: str) -> int:
    """The status of one GET /health of a worker (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_a_rollout_that_rotates_the_key_completes(routed_lab, tmp_path, monkeypatch, record_property):
    """The operator sets a new key for the workers and the gateway (host variables here, over the lab's group
    variables) and rolls out: each worker is drained with the key its server runs with, restarts with the new one and
    is put back with it; the gateway keeps the clients' old key until the last worker is back, then switches and
    routes to every worker with the new key. Afterwards every worker takes the new key only, and so does the gateway.
    No load here: under load with the old key the requests smg sends a worker already rolled fail (smg 1.13 forwards
    the client's key; measured once, 350 of 740 over a 3-worker rotation: README, "Rotating the workers' key"), and a
    load would only make the drains wait.

    The fleet's path through the code, traced per worker (tests/callbacks/task_files.py, as
    test_deploy_trace_lab.py traces a plain deploy): a worker's batch enters router_membership's file once to go out
    and once to come back, and no file more than twice (caps with their reasons below)."""
    inventory, router_url = routed_lab
    urls = _worker_urls(inventory)
    _rotate_key(inventory, NEW_KEY)
    trace = tmp_path / "trace.json"
    # run_playbook passes the environment on; the repository's own callback stays enabled beside the tracer
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", str(ROOT / "tests" / "callbacks"))
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "moefleet.serving.moefleet_report,task_files")
    monkeypatch.setenv("MOEFLEET_TASK_TRACE", str(trace))
    result = run_playbook(inventory, "playbooks/rollout.yml", f"profile={ROTATION_PROFILE}", "confirm=yes", EXTRA,
                          options=SERVE_ONLY)
    assert result.returncode == 0, result.stdout[-4000:]
    KEYS["worker"] = NEW_KEY
    per_host = json.loads(trace.read_text())["hosts"]
    for host in WORKERS:
        found = summarize(per_host[host], str(ROOT))
        again = {name: found["reentries"].count(name) for name in found["reentries"]}
        print(f"{host}: {len(found['entries'])} entries of {len(found['files'])} task files; re-entered: {again}")
        record_property("figure", f"router lab: a routed rollout's path on {host}: {len(found['files'])} task files, "
                                  f"{len(found['entries'])} entries, re-entered {again or 'none'}")
        for n, name in enumerate(found["entries"], 1):
            print(f"  {n:3} {name}")
        # A worker's rollout is the plain deploy's path (test_deploy_trace_lab.py: at most 25 files) between its
        # drain and its return, plus router_membership's one file: at most 26.
        assert len(found["files"]) <= 26, found["files"]
        # router_membership's file twice (out, then back in); any other file entered again at most once more.
        assert max(again.values(), default=0) <= 1, found["entries"]
        assert not [f for f in found["reentries"] if f.startswith("roles/sglang_service/")], found["entries"]
    for url in urls.values():  # every worker serves with the new key, and refuses the old one
        assert _answer_code(url, NEW_KEY) == 200 and _answer_code(url, WORKER_KEY) == 401, url
    assert _routed_to(router_url, WORKER_KEY) == "HTTP 401"  # the gateway switched after the last worker
    after = Load(router_url, 12, 12.0, 8, api_key=NEW_KEY).start().result()
    assert after["failed"] == 0 and after["sent"] == 12, after
    for url in urls.values():
        found, attempts, routed, error = gateway_route.wait_routed(router_url, url, "kimi-k2.6", NEW_KEY, 30)
        assert found, (url, attempts, routed, error)


def _upgrade_stopped_at_the_canary(inventory: Path, router_url: str, tmp_path: Path, fault: dict) -> dict:
    """`moefleet upgrade --to NEW`'s rollout at tp8 under load through the gateway, with ``fault`` in NEW (the
    simulator's release fault: NEW misbehaves, OLD serves healthily in the same environment): it fails at the canary,
    which serves OLD's unit again, while no request fails and no other worker is touched. The canary's report row."""
    report = tmp_path / "upgrade"
    faults = json.dumps({"sim_faults": [{**fault, "release": NEW}]})
    result, load = _rollout_under_load(inventory, router_url, "profile=tp8", UPGRADE, faults,
                                       f"moefleet_report_path={report}", serve_only=False)
    assert result.returncode != 0, result.stdout[-4000:]
    assert load["failed"] == 0 and load["sent"] >= CHUNK, load
    data = json.loads(report.with_suffix(".json").read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    rows = {row["host"]: row for row in data["hosts"]}
    assert data["result"] != "complete" and len(rows) == len(WORKERS), data
    canary = [h for h in WORKERS if rows[h]["outcome"] != "untouched"]
    assert len(canary) == 1, rows  # the first batch's one host; the others untouched
    host = canary[0]
    assert (rows[host]["outcome"], rows[host]["serving_profile"]) == ("restored", "tp8"), rows[host]
    assert {h: _release_of(inventory, h) for h in WORKERS} == {h: f"{OLD} in {OLD}" for h in WORKERS}
    assert on_host(inventory, host, "ls /opt/sglang").split() == [OLD, NEW]
    return {"host": host, **rows[host], "markdown": " ".join(report.with_suffix(".md").read_text().split())}


@pytest.mark.skipif(not ROUTED_UPGRADE, reason="make test-upgrade's mode (MOEFLEET_ROUTED_UPGRADE=1)")
def test_a_slower_release_is_switched_back_at_the_canary_behind_the_gateway(routed_lab, tmp_path, record_property):
    """`moefleet upgrade --to 0.5.23` of the routed fleet under load, 0.5.23 serving 1.5 times slower (the simulator's
    release fault; 1.5 as in test_upgrade_lab.py, whose docstring says why not 1.2 on a busy machine): the canary
    installs 0.5.23 beside 0.5.10 while it is out of the gateway, is measured old against new at tp8, is judged
    slower and switched back to 0.5.10's unit without pip; the rollout stops there, the other workers untouched, no
    request failed, and the report says why."""
    inventory, router_url = routed_lab
    canary = _upgrade_stopped_at_the_canary(inventory, router_url, tmp_path, {"fault": "slow", "factor": 1.5})
    host, compared = canary["host"], canary["release_compare"]
    record_property("figure", f"router lab: a slower {NEW} stopped at the canary {host} in {canary['seconds']} s: "
                              f"{compared and compared['reason']}")
    assert compared and compared["verdict"] == "slower", compared
    assert compared["reason"].startswith(f"SGLang {NEW} is slower than {OLD} on {host}: "), compared
    assert f"SGLang {NEW} is slower than {OLD} on {host}" in canary["message"], canary["message"]
    assert "[slower: switched back]" in canary["markdown"], canary["markdown"][-2000:]
    # no pip once the comparison began: the switch back was the last good unit and systemd
    pips = journal_times(inventory, host, "ansible-ansible.builtin.pip")
    measured = journal_times(inventory, host, "ansible-moefleet.serving.sglang_speed")
    assert len(measured) >= 2 and pips and max(pips) < min(measured[-2:]), (pips, measured)


@pytest.mark.skipif(not ROUTED_UPGRADE, reason="make test-upgrade's mode (MOEFLEET_ROUTED_UPGRADE=1)")
def test_a_release_that_answers_garbage_is_stopped_by_the_gate_behind_the_gateway(routed_lab, tmp_path):
    """The same upgrade with 0.5.23 answering garbage: the canary's correctness gate stops it before any comparison
    (0.5.23's virtualenv is there from the test before: nothing to install), the canary serves 0.5.10 again, the
    other workers are untouched and no request fails."""
    inventory, router_url = routed_lab
    canary = _upgrade_stopped_at_the_canary(inventory, router_url, tmp_path, {"fault": "garbage"})
    assert "answers wrongly" in canary["message"], canary["message"]
    assert canary["release_compare"] is None  # the gate stopped it before its benchmark


def test_healthy_but_unusual_hosts_are_left_alone(routed_lab, tmp_path, record_property):
    """Every automatic action stays silent on the healthy hosts that look most like its fault, with monitoring on,
    through a rollout under load through the gateway: an NVMe drive's fatal AER error and a NIC's surprise link down
    in two workers' kernel logs; each watcher restarted on a boot log that holds GPU 5's Xid 79 lines from before
    the first deploy; and, on the worker rolled first, a prompt as long as its KV cache holds, sent when the second
    batch reaches its fault watcher (the role's last tasks), so that the gate between batches ("every host done so
    far still serves") asks the rolled worker while its prefill lasts more than twice the lab's hang window (20 s)
    and its /health fails (each 8192-token chunk outlasts SGLang's wait for the scheduler, 2 s here) while its
    chunks print progress: the gate counts it busy and serving (plugins/modules/sglang_serves.py). Each start passes
    the correctness gate with K2.6's own sampling and thoughts of realistic length. Ends with no host taken out, the
    rollout complete, every request answered, and Alertmanager sending no critical alert at any moment of it.

    In make test the rollout switches the workers from ep8 to tp8 (serve-only). In make test-upgrade
    (MOEFLEET_ROUTED_UPGRADE=1) it is `moefleet upgrade --to 0.5.23` at tp8 (the whole path, -e
    sglang_package_spec): each worker installs 0.5.23 beside 0.5.10 while it is out of the gateway, is measured old
    against new at tp8, and keeps the new release, which is as fast as the old (the comparison's own healthy-but-
    unusual host: a release measured on a machine busy with the load; tolerance 0.2 here, 0.1 by default). It ends
    with every worker on 0.5.23 and the report showing both releases' numbers per worker."""
    inventory, router_url = routed_lab
    urls = _worker_urls(inventory)
    log, report = tmp_path / "rollout.log", tmp_path / "upgrade"
    assert {h: _release_of(inventory, h) for h in WORKERS} == {h: f"{OLD} in {OLD}" for h in WORKERS}
    upgrade = (UPGRADE, f"moefleet_report_path={report}") if ROUTED_UPGRADE else ()
    nvme, nic = WORKERS[1], WORKERS[2]
    paged: list[dict] = []
    stop = threading.Event()
    prompt: dict = {}

    asked: list[float] = []  # when Alertmanager answered: a watcher that died asking would leave `paged` empty

    def watch_alerts():
        while not stop.is_set():
            paged.extend(a for a in _paging(router_url) if a not in paged)
            asked.append(time.monotonic())
            stop.wait(5)

    def long_prompt_while_the_next_batch_starts():
        # The second batch reaching its fault watcher (the role's last tasks): the gate between batches follows
        # within some 10 to 20 s, and asks the worker rolled first while its prefill lasts (45 s here).
        anchor = "TASK [fault_watch : Install the watcher, its event table and its configuration]"
        text = ""
        while not stop.is_set() and text.count(anchor) < 2:
            stop.wait(0.5)
            text = log.read_text() if log.exists() else ""
        if text.count(anchor) < 2:
            return
        rolled = prompt["host"] = re.search(rf"\[({LAB}-\d)\]", text[text.index(anchor):]).group(1)
        info = json.load(urllib.request.urlopen(urllib.request.Request(
            f"{urls[rolled]}/get_server_info", headers={"Authorization": f"Bearer {KEYS['worker']}"}), timeout=30))
        prompt["tokens"] = min(28000, int(info["max_total_num_tokens"]) - 1000)
        codes = prompt["health"] = []
        done = threading.Event()

        def poll_health():
            while not done.is_set():
                codes.append(_health_code(urls[rolled]))
                done.wait(1)

        began = time.monotonic()
        threading.Thread(target=poll_health, daemon=True).start()
        try:
            prompt["answer"] = _long_prompt(urls[rolled], prompt["tokens"])
        finally:
            done.set()
            prompt["seconds"] = time.monotonic() - began

    threads = [threading.Thread(target=f, daemon=True) for f in (watch_alerts, long_prompt_while_the_next_batch_starts)]
    for thread in threads:
        thread.start()
    try:
        for host, fault in ((nvme, "nvme-aer"), (nic, "nic-down")):
            _run(sys.executable, LAB_PY, "fault", host, fault)
        for host in WORKERS:
            on_host(inventory, host, "systemctl restart moefleet-fault-watch.service")
        result, load = _rollout_under_load(inventory, router_url, "profile=tp8", *upgrade,
                                           verbose=True, serve_only=not ROUTED_UPGRADE, log_path=log)
        threads[1].join(120)
    finally:
        stop.set()
        threads[0].join(30)
    assert result.returncode == 0, result.stdout[-4000:]
    assert load["failed"] == 0 and load["sent"] >= CHUNK, load
    assert "gate_inconclusive" not in result.stdout, result.stdout[-4000:]
    rolled, codes = prompt.get("host"), prompt.get("health", [])
    print(f"{prompt.get('tokens')}-token prompt on {rolled} while the next batch started: answered after "
          f"{prompt.get('seconds', 0):.1f} s; /health meanwhile: {codes.count(503)} x 503 of {len(codes)}")
    assert prompt.get("answer", {}).get("meta_info", {}).get("prompt_tokens") == prompt.get("tokens"), prompt
    assert prompt["seconds"] > 2 * 20, prompt["seconds"]  # more than twice the lab's hang window
    assert codes.count(503) >= 10, codes  # SGLang's /health failed through much of it
    # The gate between batches asked the rolled worker during the prefill and counted it busy (-v shows its result,
    # in YAML that wraps long lines).
    said = " ".join(result.stdout.split())
    assert f"{urls[rolled]}/health answered HTTP 503, but the scheduler printed a progress line" in said, \
        result.stdout[-4000:]
    hosts = _status(inventory, tmp_path)
    assert {h: (hosts[h]["serving_profile"], hosts[h]["health"], hosts[h]["router"]) for h in WORKERS} == {
        h: ("tp8", "serving", "ready") for h in WORKERS}
    for host in WORKERS:
        record = _health_record(inventory, host)
        assert record.get("state", "healthy") == "healthy", record
        assert not any(e.get("pci") == OLD_FAULT_PCI for e in record.get("events", [])), record  # before the deploy
        assert on_host(inventory, host, "test -e /var/lib/moefleet/unfit && echo unfit || echo fit").strip() == "fit"
    for host, fault in ((nvme, "0000:05:00.0"), (nic, "0000:80:03.1")):
        recorded = [e for e in _health_record(inventory, host).get("events", []) if e.get("pci") == fault]
        assert recorded and not any(e["unfit"] for e in recorded), recorded
        assert all("neither a GPU nor a bridge above one" in e["meaning"] for e in recorded), recorded
    assert paged == [] and len(asked) >= load["rollout_s"] / 10, (paged, len(asked))
    if not ROUTED_UPGRADE:
        assert {h: _release_of(inventory, h) for h in WORKERS} == {h: f"{OLD} in {OLD}" for h in WORKERS}
        return
    # The upgrade: every worker on the new release, in its own virtualenv beside the old one, each measured old
    # against new at its profile (tp8 before and after) and kept; the report shows both releases' numbers.
    assert {h: _release_of(inventory, h) for h in WORKERS} == {h: f"{NEW} in {NEW}" for h in WORKERS}
    data = json.loads(report.with_suffix(".json").read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["result"] == "complete", data
    rows = {row["host"]: row for row in data["hosts"]}
    record_property("figure", f"router lab: upgrade {OLD} -> {NEW} of 3 workers under load: {load['ok']} of "
                              f"{load['sent']} answered, {load['failed']} failed, {load['rollout_s']} s; per worker "
                              + ", ".join(f"{h} {rows[h]['seconds']} s" for h in WORKERS))
    for host in WORKERS:
        compared = rows[host]["release_compare"]
        print(f"{host}: {rows[host]['seconds']} s; {compared and compared['reason']}")
        assert compared and compared["verdict"] == "not_slower", (host, compared)
        assert (compared["before"]["release"], compared["after"]["release"]) == (OLD, NEW), compared
        assert on_host(inventory, host, "ls /opt/sglang").split() == [OLD, NEW]
    assert "## SGLang releases, old against new" in report.with_suffix(".md").read_text()


def test_a_runtime_oom_fires_its_alert_within_two_scrape_intervals(routed_lab):
    """An OOM while serving on the canary (out of the router since test 2): systemd restarts SGLang, the exit hook
    records it in the local facts, the path unit rewrites moefleet.prom, and MoefleetRuntimeOOM fires. The
    simulator's fault comes in through a runtime drop-in (test equipment), everything after it is the product's."""
    inventory, router_url = routed_lab
    host = WORKERS[0]
    url = _worker_urls(inventory)[host]
    assert _firing(router_url, "MoefleetRuntimeOOM", host) is None
    fault = json.dumps([{"fault": "oom_runtime", "after_requests": 0}]).replace('"', '\\"')
    dropin = base64.b64encode(f'[Service]\nEnvironment="SGLANG_SIM_FAULTS={fault}"\n'.encode()).decode()
    on_host(inventory, host, "mkdir -p /run/systemd/system/sglang.service.d && echo " + dropin + " | base64 -d "
            "> /run/systemd/system/sglang.service.d/zz-lab-fault.conf && systemctl daemon-reload "
            "&& systemctl restart sglang.service")
    _wait_serving(url)
    body = json.dumps({"model": "kimi-k2.6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(), headers={
        "content-type": "application/json", "Authorization": f"Bearer {KEYS['worker']}"})
    with pytest.raises(OSError):  # the server dies under the request
        urllib.request.urlopen(req, timeout=60).read()
    fired = _wait_firing(router_url, "MoefleetRuntimeOOM", host, 120)
    runtime = json.loads(on_host(inventory, host, "cat /etc/ansible/facts.d/moefleet_runtime.fact"))
    recorded = datetime.datetime.fromisoformat(runtime["last"]["time"])
    active = datetime.datetime.fromisoformat(fired["activeAt"].replace("Z", "+00:00"))
    took = (active - recorded).total_seconds()
    print(f"runtime OOM recorded -> alert active: {took:.1f} s (scrape and evaluation every {SCRAPE_S} s)")
    assert runtime["last"]["state"] == "oom"
    # node_exporter's next scrape, then the rule's next evaluation (both every SCRAPE_S)
    assert took <= 2 * SCRAPE_S + 1, took


def test_a_stopped_worker_fires_worker_down(routed_lab):
    """systemctl stop on the canary: its /metrics stops answering and MoefleetWorkerDown fires once the rule's
    `for` (15 s in the lab) has passed; the other workers' does not."""
    inventory, router_url = routed_lab
    host = WORKERS[0]
    # Back from the OOM's restart first (it may have been down long enough to fire already).
    _wait_serving(_worker_urls(inventory)[host])
    deadline = time.monotonic() + 60
    while _firing(router_url, "MoefleetWorkerDown", host) is not None:
        assert time.monotonic() < deadline, "MoefleetWorkerDown stays firing for a serving worker"
        time.sleep(1)
    on_host(inventory, host, "rm -f /run/systemd/system/sglang.service.d/zz-lab-fault.conf && "
            "systemctl daemon-reload && systemctl stop sglang.service")
    stopped = time.monotonic()
    fired = _wait_firing(router_url, "MoefleetWorkerDown", host, 90)
    print(f"worker stopped -> MoefleetWorkerDown firing: {time.monotonic() - stopped:.1f} s")
    assert fired["labels"]["severity"] == "critical"
    assert all(_firing(router_url, "MoefleetWorkerDown", other) is None for other in WORKERS[1:])


def test_uninstall_takes_the_host_out_of_the_router_first(routed_lab):
    """playbooks/uninstall.yml on a host behind the router: out of the router (and remembered there as left
    out) before its server goes; the others keep serving through it."""
    inventory, router_url = routed_lab
    host, url = WORKERS[1], _worker_urls(inventory)[WORKERS[1]]
    assert url in {w["url"] for w in _router_workers(router_url)}
    result = run_playbook(inventory, "playbooks/uninstall.yml", "confirm=yes", options=("-l", host))
    assert result.returncode == 0, result.stdout[-3000:]
    assert url not in {w["url"] for w in _router_workers(router_url)}
    assert url in _ssh(inventory, f"{LAB}-router", "cat /var/lib/smg/workers-left-out").split()
    # the one left (the canary of the failed rollout stays out; the last host's health checks may still recover
    # from the stop test) answers
    deadline = time.monotonic() + 60
    while (routed := _routed_to(router_url, KEYS["worker"])) != _worker_urls(inventory)[WORKERS[2]]:
        assert time.monotonic() < deadline, routed
        time.sleep(2)
