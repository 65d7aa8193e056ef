"""What a lab host is left with, and how the next deploy recovers it, one deploy each, in order (each starts from
where the last one left the host): GPU memory held by a leftover process (the service user's, cleaned; someone
else's, refused), OOMs while serving (systemd restarts the unit; repeated ones retune the next deploy), a failed
start that stays failed, a package install cut short, a record written by older code, and a failure inside the
rollback itself. Converge deployed the lab's tp2ep4 (the last good unit). The first of this scenario's two files
(pytest runs them in name order); the start-up faults follow in test_rollback.py, on the same host
(tests/fault_deploys.py deploys for both).

Cost (a fresh-clone make test, beside two other jobs; measured when this was a scenario of its own): each test
24-82 s (the interrupted package install, the whole path, 82 s), all deploys of one host.
"""

import concurrent.futures
import json
import re
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from fault_deploys import deploy, facts, faults, invocation, serving_args  # noqa: E402


def stale_holder(host, user: str) -> int:
    """Leave an orphaned scheduler of `user` holding 20 GiB on every GPU, outside the unit (as an earlier
    start run by hand or in another cgroup would), and return its PID."""
    host.check_output(  # its stdio closed, so the SSH session does not wait for the daemon; the pinned release's venv
        f"runuser -u {user} -- /opt/sglang/0.5.10/bin/python -m sglang._sim.stale "
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


# The fault counts every request the server answers; the correctness gate's four small chats after the start would
# be the ones to run out of memory. A runtime OOM stands for load the gate never makes, so these deploys skip it.
RUNTIME_OOM_AFTER_2 = json.dumps({"sglang_service_answer_check": False, "sglang_service_extra_env": {
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


def test_an_interrupted_package_install_is_finished_by_the_next_run(host):
    # what a cut-short install leaves: a package unpacked but not configured (dpkg --audit names it)
    host.check_output("sed -i '/^Package: nvidia-persistenced$/,/^$/s/^Status: install ok installed$/"
                      "Status: install ok half-configured/' /var/lib/dpkg/status")
    assert "nvidia-persistenced" in host.run("dpkg --audit").stdout
    rc, out, _ = deploy("profile=tp8", RUNTIME_OOM_AFTER_2, install=True)
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
    # Once the start began, systemd-analyze (the unit checker's) refuses the next unit it is given: the fallback's,
    # inside the rollback, and the pass's rescue (tasks/start.yml) restores the last unit that served. Only that one:
    # the restore writes the last good unit through the same checker (tasks/restore.yml), which passes it.
    before = invocation(host)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(deploy, "profile=tp8", faults(("oom_weight_load", "tp8")))
        try:
            while invocation(host) == before and not run.done():
                time.sleep(0.2)
            host.check_output("mv /usr/bin/systemd-analyze /usr/bin/systemd-analyze.moved && "
                              "printf '#!/bin/sh\\nmkdir /run/refused-once 2>/dev/null && exit 1\\n"
                              "exec /usr/bin/systemd-analyze.moved \"$@\"\\n' > /usr/bin/systemd-analyze && "
                              "chmod 755 /usr/bin/systemd-analyze")
            rc, out, _ = run.result()
        finally:
            host.run("test -e /usr/bin/systemd-analyze.moved && mv -f /usr/bin/systemd-analyze.moved "
                     "/usr/bin/systemd-analyze; rmdir /run/refused-once")
    assert rc != 0
    said = " ".join(out.split())
    assert "The rollback itself failed at" in said and "Install sglang.service" in said, out[-3000:]
    f = facts(host)
    assert (f["asked_profile"], f["outcome"]) == ("tp8", "restored"), out[-3000:]
    assert host.service("sglang.service").is_running
