"""Fault classes on a lab host, one deploy each, in order (each starts from where the last one left the host).

The deploys run with ansible-playbook against the scenario's inventory, with `sim_faults` given by -e;
the host is then checked with testinfra: what the unit runs, what serves, and the moefleet local facts.
"""

import concurrent.futures
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import run_playbook  # noqa: E402

INVENTORY = os.environ["MOEFLEET_LAB_INVENTORY"]


def deploy(*extra_vars: str) -> tuple[int, str, dict]:
    run = run_playbook(INVENTORY, "deploy.yml", *extra_vars)
    # The lab host's recap line (not localhost's, which validates on the controller).
    recap = re.search(r"^(?!localhost)\S+\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                      run.stdout, re.M)
    keys = ("ok", "changed", "unreachable", "failed")
    stats = dict(zip(keys, map(int, recap.groups()), strict=True)) if recap else {}
    return run.returncode, run.stdout + run.stderr, stats


def faults(*entries: tuple[str, str]) -> str:
    return json.dumps({"sim_faults": [{"fault": f, "profile": p} for f, p in entries]})


FACTS_SCHEMA = json.loads((ROOT / "schemas" / "local_facts.schema.json").read_text())


def facts(host) -> dict:
    """The host's local facts, held to their documented schema each time a test reads them."""
    found = json.loads(host.file("/etc/ansible/facts.d/moefleet.fact").content_string)
    jsonschema.validate(found, FACTS_SCHEMA)
    return found


def serving_args(host) -> dict:
    return json.loads(host.check_output("curl -sf http://127.0.0.1:30000/server_info"))


def invocation(host) -> str:
    return host.check_output("systemctl show -p InvocationID --value sglang.service")


def test_weight_load_oom_falls_back_down_the_ladder(host):
    # sglang_service_rollback=true as -e passes it: a string, which ansible-core 2.19 refuses as a bare
    # conditional ("Conditionals must have a boolean result"), so the rescue must convert it.
    rc, out, _ = deploy("profile=tp8", "sglang_service_rollback=true", faults(("oom_weight_load", "tp8")))
    assert rc == 0, out[-3000:]
    assert "DEGRADED" in out
    f = facts(host)
    assert (f["asked_profile"], f["serving_profile"], f["outcome"]) == ("tp8", "ep8", "degraded")
    assert [(h["profile"], h["outcome"], h["phase"]) for h in f["history"][-2:]] == [
        ("tp8", "oom", "weight_load"), ("ep8", "ready", None)]
    assert serving_args(host)["ep_size"] == 8


def test_rerun_with_nothing_changed_stays_put(host):
    before = invocation(host)
    rc, out, stats = deploy("profile=tp8", faults(("oom_weight_load", "tp8")))
    assert rc == 0, out[-3000:]
    assert stats["changed"] == 0, out[-3000:]
    assert invocation(host) == before
    assert facts(host)["serving_profile"] == "ep8"


def test_kv_pool_oom_retunes_the_same_layout(host):
    rc, out, _ = deploy("profile=tp2ep4", faults(("oom_kv_cache", "tp2ep4")))
    assert rc == 0, out[-3000:]
    f = facts(host)
    assert (f["serving_profile"], f["outcome"]) == ("tp2ep4", "ready")
    first, second = f["history"][-2:]
    assert (first["outcome"], first["phase"]) == ("oom", "kv_cache")
    assert second["outcome"] == "ready" and second["tuning"]["mem_fraction_static"] > 0.8
    assert serving_args(host)["mem_fraction_static"] == second["tuning"]["mem_fraction_static"]


def test_cuda_graph_oom_retunes_the_batch_sizes(host):
    rc, out, _ = deploy("profile=tp4ep2", faults(("oom_cuda_graph", "tp4ep2")))
    assert rc == 0, out[-3000:]
    f = facts(host)
    assert (f["serving_profile"], f["outcome"]) == ("tp4ep2", "ready")
    assert f["history"][-2]["phase"] == "cuda_graph"
    assert serving_args(host)["cuda_graph_max_bs"] == f["history"][-1]["tuning"]["cuda_graph_max_bs"]


def test_hang_retries_with_p2p_off(host):
    rc, out, _ = deploy("profile=ep8", faults(("hang", "ep8")))
    assert rc == 0, out[-3000:]
    f = facts(host)
    assert (f["serving_profile"], f["outcome"]) == ("ep8", "ready")
    assert (f["history"][-2]["outcome"], f["history"][-1]["nccl_set"]) == ("hung", "pcie_shm")
    env = host.check_output("systemctl show -p Environment --value sglang.service")
    assert "NCCL_P2P_DISABLE=1" in env


def test_crash_restores_the_last_unit_that_served(host):
    rc, out, _ = deploy("profile=tp8", faults(("crash", "tp8")))
    assert rc != 0, "a start that crashed for a non-memory reason must fail the play"
    assert "does not serve tp8" in out
    f = facts(host)
    assert (f["asked_profile"], f["outcome"], f["serving_profile"]) == ("tp8", "restored", "ep8")
    assert f["history"][-1]["outcome"] == "crashed"
    assert serving_args(host)["ep_size"] == 8


def test_port_in_use_names_the_holder_and_restores_nothing_onto_it(host):
    # Another process takes the port while the service is down: the start fails with "Address already in use",
    # and the last good unit would fail the same way, so it is put back but not started.
    host.check_output("systemctl stop sglang.service")
    host.check_output("systemd-run --unit moefleet-port-holder --uid nobody "
                      "python3 -m http.server 30000 --bind 127.0.0.1")
    try:
        for _ in range(50):
            if host.socket("tcp://127.0.0.1:30000").is_listening:
                break
            time.sleep(0.1)
        pid = host.check_output("systemctl show -p MainPID --value moefleet-port-holder")
        last_good = json.loads(host.file("/var/lib/moefleet/last-good.json").content_string)
        rc, out, _ = deploy("profile=tp2ep4")
        assert rc != 0
        assert f"PID {pid} (python3, user nobody)" in " ".join(out.split()), out[-3000:]
        f = facts(host)
        assert (f["outcome"], f["serving_profile"]) == ("failed", None)
        assert (f["history"][-1]["profile"], f["history"][-1]["cause"]) == ("tp2ep4", "port_in_use")
        assert host.file("/etc/systemd/system/sglang.service").content_string == last_good["unit"]
        assert not host.service("sglang.service").is_running
        assert host.run(f"kill -0 {pid}").succeeded
    finally:
        host.run("systemctl stop moefleet-port-holder")


def stale_holder(host, user: str) -> int:
    """Leave an orphaned scheduler of `user` holding 20 GiB on every GPU, outside the unit (as an earlier
    start run by hand or in another cgroup would), and return its PID."""
    host.check_output(  # its stdio closed, so the SSH session does not wait for the daemon
        f"runuser -u {user} -- /opt/sglang/venv/bin/python -m sglang._sim.stale "
        "'{\"gpus\": [0, 1, 2, 3, 4, 5, 6, 7], \"mib\": 20480}' </dev/null >/dev/null 2>&1")
    owned = host.check_output(f"pgrep -u {user} -d ' ' . || true").split()
    apps = host.check_output("nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()
    unit = host.check_output("systemctl show -p ControlGroup --value sglang.service")  # empty when stopped
    stale = [int(p) for p in set(owned) & set(apps)
             if not unit or unit not in host.file(f"/proc/{p}/cgroup").content_string]
    assert len(stale) == 1, (owned, apps)
    return stale[0]


def test_service_users_leftover_is_cleaned(host):
    pid = stale_holder(host, "sglang")
    rc, out, _ = deploy("profile=tp8", "sglang_service_retry=true")
    assert rc == 0, out[-3000:]
    assert not host.run(f"kill -0 {pid}").succeeded
    assert facts(host)["serving_profile"] == "tp8"


def test_someone_elses_gpu_process_refuses_the_start(host):
    pid = stale_holder(host, "nobody")
    try:
        before = host.file("/etc/systemd/system/sglang.service").content_string
        rc, out, _ = deploy("profile=ep8")
        assert rc != 0
        assert f"PID {pid}" in out and "Stop them" in out
        assert host.file("/etc/systemd/system/sglang.service").content_string == before
    finally:
        host.run(f"kill -9 {pid}")


RUNTIME_OOM_AFTER_2 = json.dumps({"sglang_service_extra_env": {
    "SGLANG_SIM_FAULTS": json.dumps([{"fault": "oom_runtime", "after_requests": 2}])}})


def runtime_oom(host) -> float:
    """Serve two requests, let the third run out of memory in the forward pass, and return the seconds until
    the unit (restarted by systemd, a new invocation) serves again."""
    before = invocation(host)
    gen = ("curl -s -m 20 -o /dev/null -w '%{http_code}' -H 'content-type: application/json' "
           "-d '{\"text\": \"hi\", \"sampling_params\": {\"max_new_tokens\": 4}}' http://127.0.0.1:30000/generate")
    assert [host.run(gen).stdout for _ in range(2)] == ["200", "200"]
    died = time.time()
    host.run(gen)
    while time.time() - died < 120:
        if invocation(host) != before and host.run("curl -sf -m 2 http://127.0.0.1:30000/health").succeeded:
            return time.time() - died
        time.sleep(1)
    raise AssertionError(host.check_output("journalctl -u sglang.service -n 60 --no-pager"))


def runtime_facts(host) -> dict:
    return json.loads(host.file("/etc/ansible/facts.d/moefleet_runtime.fact").content_string)


def test_runtime_oom_restarts_the_unit_and_is_recorded(host):
    rc, out, _ = deploy("profile=tp8", RUNTIME_OOM_AFTER_2)
    assert rc == 0, out[-3000:]
    assert host.file("/etc/systemd/system/sglang.service.d/moefleet-serving.conf").exists
    seconds = runtime_oom(host)
    print(f"serving again {seconds:.1f} s after the runtime OOM")
    assert seconds < 60
    last = runtime_facts(host)["last"]
    assert (last["state"], last["phase"], last["attempt"]["profile"]) == ("oom", "runtime", "tp8")
    assert last["oom"]["gpu"] == 0 and last["result"] == "signal"


def test_repeated_runtime_ooms_make_the_next_deploy_retune(host):
    assert runtime_oom(host) < 60
    assert runtime_facts(host)["ooms"] >= 2
    rc, out, _ = deploy("profile=tp8", RUNTIME_OOM_AFTER_2)
    assert rc == 0, out[-3000:]
    # the callback's YAML output folds long messages over lines
    assert "ran out of memory while serving; retrying it once with --max-running-requests 128" in " ".join(out.split())
    f = facts(host)
    assert [(h["profile"], h["outcome"], h["phase"]) for h in f["history"][-2:]] == [
        ("tp8", "oom", "runtime"), ("tp8", "ready", None)]
    assert serving_args(host)["max_running_requests"] == 128


def test_a_failed_start_is_not_restarted(host):
    # the serving drop-in comes off before a start the role checks: the crash stays a crash, and is restored
    rc, out, _ = deploy("profile=tp2ep4", faults(("crash", "tp2ep4")))
    assert rc != 0
    assert facts(host)["history"][-1]["outcome"] == "crashed"
    assert "crashed" not in [f["state"] for f in runtime_facts(host)["failures"]]


def test_security_exposure_at_most_3_5(host):
    out = host.check_output("systemd-analyze security --no-pager sglang.service")
    score = float(re.search(r"Overall exposure level for sglang\.service: ([\d.]+)", out).group(1))
    # the same unit without this change's options, for the record
    host.check_output("sed -E '/^(RestrictAddressFamilies|RestrictNamespaces|ProtectHostname|ProtectProc|UMask|"
                      "RemoveIPC|SystemCallErrorNumber)=|^SystemCallFilter=~@mount/d' "
                      "/etc/systemd/system/sglang.service > /tmp/before.service")
    before = host.run("systemd-analyze security --no-pager --offline=true /tmp/before.service").stdout
    was = re.findall(r"Overall exposure level for \S+: ([\d.]+)", before)
    print(f"systemd-analyze security: {score} now; before: {was}")
    assert score <= 3.5, out


def test_an_interrupted_package_install_is_finished_by_the_next_run(host):
    # what a cut-short install leaves: a package unpacked but not configured (dpkg --audit names it)
    host.check_output("sed -i '/^Package: nvidia-persistenced$/,/^$/s/^Status: install ok installed$/"
                      "Status: install ok half-configured/' /var/lib/dpkg/status")
    assert "nvidia-persistenced" in host.run("dpkg --audit").stdout
    rc, out, _ = deploy("profile=tp8", RUNTIME_OOM_AFTER_2)
    finished = r"Finish the packages an interrupted install left unconfigured\]\s*\**\s*changed:"
    assert re.search(finished, out), out[-3000:]
    assert host.run("dpkg --audit").stdout.strip() == "", out[-3000:]


def test_a_record_from_older_code_restores_its_separate_unit_file(host):
    # Older deploys kept the last good unit in sglang.service.last-good beside a record of the attempt alone.
    record = json.loads(host.file("/var/lib/moefleet/last-good.json").content_string)
    host.check_output("cp /etc/systemd/system/sglang.service /var/lib/moefleet/sglang.service.last-good")
    old_record = shlex.quote(json.dumps({"attempt": record["attempt"]}))
    host.check_output(f"echo {old_record} > /var/lib/moefleet/last-good.json")
    rc, out, _ = deploy("profile=tp2ep4", faults(("crash", "tp2ep4")))
    assert rc != 0 and "does not serve tp2ep4" in out, out[-3000:]
    f = facts(host)
    assert (f["outcome"], f["serving_profile"]) == ("restored", record["attempt"]["profile"]), out[-3000:]
    assert host.file("/etc/systemd/system/sglang.service").content_string == record["unit"]
    assert host.service("sglang.service").is_running


def test_a_failure_inside_the_rollback_restores_the_last_good_unit(host):
    # Once the start began, systemd-analyze (the unit checker's) fails: rendering the fallback's unit fails
    # inside the rollback, and the start's rescue (tasks/start.yml) restores the last unit that served.
    before = invocation(host)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(deploy, "profile=tp8", faults(("oom_weight_load", "tp8")))
        try:
            while invocation(host) == before and not run.done():
                time.sleep(0.2)
            host.check_output("mv /usr/bin/systemd-analyze /usr/bin/systemd-analyze.moved && "
                              "printf '#!/bin/sh\\nexit 1\\n' > /usr/bin/systemd-analyze && "
                              "chmod 755 /usr/bin/systemd-analyze")
            rc, out, _ = run.result()
        finally:
            host.run("test -e /usr/bin/systemd-analyze.moved && mv -f /usr/bin/systemd-analyze.moved "
                     "/usr/bin/systemd-analyze")
    assert rc != 0
    said = " ".join(out.split())
    assert "The rollback itself failed at" in said and "Install sglang.service" in said, out[-3000:]
    f = facts(host)
    assert (f["asked_profile"], f["outcome"]) == ("tp8", "restored"), out[-3000:]
    assert host.service("sglang.service").is_running


def test_unit_backups_are_pruned_to_the_newest_three(host):
    backups = host.check_output("ls /etc/systemd/system/ | grep -c '^sglang\\.service\\..*~$' || true")
    assert 1 <= int(backups) <= 3
