"""Start-up faults on a lab host, one deploy each, in order (each starts from where the last one left the host):
the fallback ladder after a weight-load OOM, the retunes after KV-pool and CUDA-graph OOMs, a hang retried with
P2P off, a crash restored to the last unit that served, wrong answers (the correctness gate) restored too, a
busy port; then the unit's exposure score and its backups. They run after test_recovery.py (the leftovers, runtime
OOMs, interrupted installs and failures inside the rollback) on the same host, from where a deploy of the lab's
tp2ep4 leaves it (the module's fixture), as converge left it for the recovery tests: one scenario, one host, one
converge (two scenarios side by side cost a second host's create, prepare, converge and destroy).

Cost (a fresh-clone make test, beside two other jobs; measured when this was a scenario of its own): each test
44-77 s (the hang, waiting out the readiness timeout, 77 s; a no-change rerun 44 s), serve-only deploys of one host.
"""

import json
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from fault_deploys import deploy, facts, faults, invocation, serving_args  # noqa: E402
from playbook import bench_module  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def serving_the_labs_profile(host):
    """The host serves the lab's tp2ep4 as asked, as converge left it: test_recovery.py's last deploy left it restored
    for an ask of tp8 with a fault, which a rerun of the same ask would keep (the sticky fallback)."""
    rc, out, _ = deploy("profile=tp2ep4")
    assert rc == 0, out[-3000:]
    f = facts(host)
    assert (f["asked_profile"], f["serving_profile"]) == ("tp2ep4", "tp2ep4"), f


def test_weight_load_oom_falls_back_down_the_ladder(host, record_property):
    # sglang_service_rollback=true as -e passes it: a string, which ansible-core 2.19 refuses as a bare
    # conditional ("Conditionals must have a boolean result"), so the rescue must convert it.
    # The deploy is `make bench` part (c)'s first row (tests/bench/run.py's rollback_row), from the same start
    # (tp2ep4 serving, the fixture), serve-only here: the part's smoke run.
    row = bench_module().rollback_row(lambda *extra: deploy(*extra, "sglang_service_rollback=true")[:2],
                                      lambda: facts(host), "oom_weight_load", "tp8")
    rc, out = row["rc"], row["output"]
    assert rc == 0, out[-3000:]
    record_property("figure", "bench (c) smoke, a serve-only deploy from tp2ep4 (fault, asked, seconds, rc, ends on): "
                              + " ".join(row["row"].split()))
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


def test_wrong_answers_restore_the_last_unit_that_served_quoting_them(host):
    # It starts, passes /health, /v1/models and the flag check: only the correctness gate sees NaN-like output.
    rc, out, _ = deploy("profile=tp8", faults(("garbage", "tp8")))
    assert rc != 0, "a start that answers garbage must fail the play"
    text = " ".join(out.split())
    assert "tp8 started but answers wrongly (check thinking failed)" in text, text[-3000:]
    assert "content is garbage, a run of '!' (what NaN logits decode to)" in text and "'!!!!!!!!" in text
    f = facts(host)
    assert (f["asked_profile"], f["outcome"], f["serving_profile"]) == ("tp8", "restored", "ep8")
    assert (f["history"][-1]["outcome"], f["history"][-1]["phase"]) == ("wrong_output", "serving")
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


def test_unit_backups_are_pruned_to_the_newest_three(host):
    backups = host.check_output("ls /etc/systemd/system/ | grep -c '^sglang\\.service\\..*~$' || true")
    assert 1 <= int(backups) <= 3
