"""moefleet's fault watcher (roles/fault_watch/files/moefleet-fault-watch) run as the unit runs it, with stand-ins for
what a unit test cannot have (journalctl's follow mode fed from a file, systemctl recording its calls) and the lab's
simulated nvidia-smi for the GPU baseline and the check after a reboot.

What it must do: a kernel Xid 79 written by the kernel (or root) stops SGLang, writes the unfit file, records the
event once, also across a restart of the watcher, and GET /fitness says "unfit" (the host calls no gateway and holds
no key: the gateways' guards read /fitness, tests/unit/test_gateway_guard.py); a "kernel"
line from another user is ignored; an Xid that is an application error is only recorded; verify finds a lost GPU
and a narrower PCIe link; clear and hold keep the record."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sim" / "gpu"))
import pci_tree  # noqa: E402  (the lab's simulated PCI tree)

WATCH = ROOT / "roles" / "fault_watch" / "files" / "moefleet-fault-watch"

FAKE_JOURNALCTL = r'''#!/usr/bin/env python3
import sys, time
after = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--after-cursor=")), None)
with open(sys.argv[0] + ".entries") as fh:
    lines = fh.read().splitlines()
if after:
    cursors = [__import__("json").loads(l)["__CURSOR"] for l in lines]
    lines = lines[cursors.index(after) + 1:]
for line in lines:
    print(line, flush=True)
time.sleep(3600)
'''
FAKE_SYSTEMCTL = r'''#!/bin/sh
echo "$*" >> "$0.calls"
case "$*" in
  *"--value"*) echo inactive ;;
  show*) printf 'ActiveState=inactive\nInvocationID=\n' ;;
esac
'''


def entry(cursor: str, message: str, **fields: str) -> str:
    return json.dumps({"__CURSOR": cursor, "MESSAGE": message, **fields})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def host(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("journalctl", FAKE_JOURNALCTL), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "nvidia-smi").symlink_to(ROOT / "sim" / "gpu" / "nvidia-smi")
    config = {
        "unit": "sglang.service", "lib": str(ROOT / "plugins" / "module_utils"),
        "health_url": "http://127.0.0.1:9/health", "interval": 3600, "hang_seconds": 60,
        "facts_file": str(tmp_path / "facts.d" / "moefleet_health.fact"), "unfit_file": str(tmp_path / "unfit"),
        "cursor_file": str(tmp_path / "cursor"), "baseline_file": str(tmp_path / "gpu-baseline.json"),
        "status_host": "127.0.0.1", "status_port": free_port(),
    }
    pci_tree.write(str(tmp_path / "sysroot"), pci_tree.gpu_bus_ids())  # the lab's PCI tree: GPUs under 2 switches
    config["sysfs_pci_devices"] = str(tmp_path / "sysroot" / "sys" / "bus" / "pci" / "devices")
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SIM_GPU_RUN_DIR=str(tmp_path / "run"),
               SIM_GPU_STATE_DIR=str(tmp_path / "procs"))
    yield tmp_path, env, config


def command(host, *args):
    tmp, env, _ = host
    return subprocess.run([sys.executable, str(WATCH), str(tmp / "config.json"), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def watch_until(host, done, timeout=20):
    tmp, env, _ = host
    proc = subprocess.Popen([sys.executable, str(WATCH), str(tmp / "config.json")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not done():
            time.sleep(0.1)
        time.sleep(0.5)  # what it would do after
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # with its journalctl
    return proc.communicate()[0]


def ask(host, path: str = "/fitness", method: str = "GET"):
    """The watcher's answer at `path` on its status address: the JSON, "HTTP <code>", or None when nothing answers."""
    req = urllib.request.Request(f"http://127.0.0.1:{host[2]['status_port']}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError:
        return None


def watch_and_ask(host, done, timeout=20, questions=(("/fitness", "GET"),)):
    """The watcher run until done() (at most `timeout` s); then what its status address answers to each question,
    once it answers at all (bounded by 20 s): ([answers], output)."""
    tmp, env, _ = host
    proc = subprocess.Popen([sys.executable, str(WATCH), str(tmp / "config.json")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done():
            time.sleep(0.1)
        deadline = time.monotonic() + 20
        while ask(host) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        answers = [ask(host, path, method) for path, method in questions]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # with its journalctl
    return answers, proc.communicate()[0]


def facts(host) -> dict:
    path = Path(host[2]["facts_file"])
    return json.loads(path.read_text()) if path.exists() else {}


def test_an_xid_79_takes_the_host_out_once(host):
    tmp = host[0]
    (tmp / "bin" / "journalctl.entries").write_text("\n".join([
        entry("c1", "NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.",
              SYSLOG_IDENTIFIER="kernel", _UID="1000", _TRANSPORT="syslog"),  # forged by a user: ignored
        entry("c2", "NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=python3, Graphics SM Warp Exception",
              SYSLOG_IDENTIFIER="kernel", _TRANSPORT="kernel"),  # an application error: recorded only
        entry("c3", "NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
              SYSLOG_IDENTIFIER="kernel", _TRANSPORT="kernel"),
        entry("c4", "NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.", SYSLOG_IDENTIFIER="kernel",
              _TRANSPORT="kernel"),  # the driver's second line of the same fault
        entry("c5", "INFO: a line of the server", _SYSTEMD_UNIT="sglang.service"),
    ]) + "\n")
    assert command(host, "baseline").returncode == 0  # GPU 3 is at 61:00 in the baseline
    (told,), out = watch_and_ask(host, lambda: any("actions" in e for e in facts(host).get("events", [])))
    record = facts(host)
    assert record["state"] == "unfit", out
    assert record["reason"] == "gpu 3: Xid 79 GPU has fallen off the bus"
    assert [(e["code"], e["unfit"]) for e in record["events"]] == [(13, False), (79, True)], out
    assert record["events"][1]["actions"] == {"stopped": True}  # no gateway call: the host holds no key
    # what the gateways' guards read: the record's state, reason and time
    assert told == {"state": "unfit", "reason": record["reason"], "since": record["since"]}, out
    calls = (tmp / "bin" / "systemctl.calls").read_text()
    assert "stop --no-block sglang.service" in calls and "kill --kill-whom=all --signal=SIGKILL sglang.service" in calls
    assert json.loads((tmp / "unfit").read_text())["code"] == 79
    assert (tmp / "cursor").read_text() != ""
    # A restart of the watcher reads on from its cursor: nothing is recorded twice, nothing is done twice.
    watch_until(host, lambda: False, timeout=2)
    assert len(facts(host)["events"]) == 2
    # Even without its cursor, an event already recorded is not recorded again.
    (tmp / "cursor").unlink()
    watch_until(host, lambda: False, timeout=2)
    assert len(facts(host)["events"]) == 2
    assert (tmp / "bin" / "systemctl.calls").read_text().count("kill --kill-whom=all") == 1  # nothing done twice


def test_root_s_kernel_line_counts_and_fitness_follows_the_record(host):
    tmp, _, config = host
    # A host that never had an event is healthy; nothing but /fitness is served, and nothing changes through it.
    (tmp / "bin" / "journalctl.entries").write_text("")
    told, out = watch_and_ask(host, lambda: False, timeout=0,
                              questions=(("/fitness", "GET"), ("/health", "GET"), ("/fitness", "POST")))
    assert told == [{"state": "healthy", "reason": None, "since": None}, "HTTP 404", "HTTP 501"], out
    (tmp / "bin" / "journalctl.entries").write_text(entry(
        "c1", "NVRM: Xid (PCI:0000:01:00): 119, pid=1, name=python3, Timeout after 6s of waiting for RPC response",
        SYSLOG_IDENTIFIER="kernel", _UID="0", _TRANSPORT="stdout") + "\n")  # root's line counts
    (told,), out = watch_and_ask(host, lambda: any("actions" in e for e in facts(host).get("events", [])))
    assert facts(host)["events"][0]["actions"] == {"stopped": True}
    assert told["state"] == "unfit" and "Xid 119" in told["reason"] and told["reason"] == facts(host)["reason"], out
    # hold and clear change what it answers (the record is read at each question)
    assert command(host, "hold", "fault back").returncode == 0
    assert watch_and_ask(host, lambda: False, timeout=0)[0][0]["state"] == "hardware"
    assert command(host, "clear", "serviced").returncode == 0
    assert watch_and_ask(host, lambda: False, timeout=0)[0] == [{"state": "healthy", "reason": None,
                                                                 "since": facts(host)["since"]}]


def test_the_role_gives_the_watcher_no_gateway_and_no_key():
    """The worker's configuration names no gateway and holds no key (roles/fault_watch/tasks/main.yml)."""
    tasks = yaml.safe_load((WATCH.parents[1] / "tasks" / "main.yml").read_text())
    config = next(t for t in tasks if t["name"] == "Install the watcher, its event table and its configuration")
    keys = set(config["vars"]["_fault_watch_config"])
    assert keys.isdisjoint({"routers", "admin_key", "worker_url"}) and {"status_host", "status_port"} <= keys
    assert not any("router" in str(t).lower() for t in tasks), "the watcher's role reads no router"


def test_verify_clear_and_hold(host):
    tmp, _, config = host
    assert json.loads(command(host, "baseline").stdout)["gpus"] == 8
    assert command(host, "verify").returncode == 0
    (tmp / "run").mkdir()
    (tmp / "run" / "lost.json").write_text("[3]")  # GPU 3 fell off the bus: nvidia-smi cannot open it
    done = command(host, "verify")
    assert done.returncode == 1
    assert "GPU is lost" in json.loads(done.stdout)["problems"][0]
    (tmp / "run" / "lost.json").unlink()
    baseline = json.loads(Path(config["baseline_file"]).read_text())
    baseline["gpus"][5]["driver_version"] = "570.1"  # it had another driver
    Path(config["baseline_file"]).write_text(json.dumps(baseline))
    assert json.loads(command(host, "verify").stdout)["problems"] == [
        "GPU 5 (0000:a1:00.0): driver 580.95.05, was 570.1"]
    Path(config["unfit_file"]).write_text("{}")
    assert command(host, "hold", "fault back").returncode == 0
    assert facts(host)["state"] == "hardware" and Path(config["unfit_file"]).exists()
    assert command(host, "clear", "serviced").returncode == 0
    record = facts(host)
    assert record["state"] == "healthy" and not Path(config["unfit_file"]).exists()
    assert record["remediations"][-1]["was"] == "hardware" and record["remediations"][-1]["note"] == "serviced"


def test_a_cursor_journald_no_longer_has_is_dropped(host):
    """A volatile journal after a reboot has lost the entry the watcher read last: journalctl refuses its cursor, and
    the watcher forgets it (systemd restarts it, and it reads the boot from its start; events already recorded are
    recognized by their key)."""
    tmp = host[0]
    (tmp / "bin" / "journalctl.entries").write_text(entry("c9", "a line of this boot") + "\n")
    (tmp / "cursor").write_text("s=gone;i=1")
    out = watch_until(host, lambda: not (tmp / "cursor").exists(), timeout=10)
    assert not (tmp / "cursor").exists(), out
    assert "journalctl ended" in out


# -- the GPUs' PCIe links (verify, baseline): sysfs, the lab's PCI tree (sim/gpu/pci_tree.py) written per test -----


class Busy(BaseHTTPRequestHandler):
    """SGLang's /health while the GPUs work: each answer (a one-token generation on every GPU) brings the idle links
    back to the speed they trained at, as the driver does; `trained` is that speed per sysfs directory."""

    trained: dict = {}
    calls = 0

    def do_GET(self):  # noqa: N802
        Busy.calls += 1
        for directory, speed in Busy.trained.items():
            (directory / "current_link_speed").write_text(speed + "\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def links(host):
    tmp, _, config = host
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Busy.trained, Busy.calls = {}, 0
    config.update(health_url=f"http://127.0.0.1:{server.server_port}/health", link_load_seconds=2)
    (tmp / "config.json").write_text(json.dumps(config))
    yield Path(config["sysfs_pci_devices"])
    server.shutdown()


def idle(devices: Path, address: str) -> list[Path]:
    """The GPU at `address` idles: its link reads 2.5 GT/s at both ends, the width unchanged."""
    gpu = (devices / address).resolve()
    for directory in (gpu, gpu.parent):
        (directory / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    return [gpu, gpu.parent]


def test_the_baseline_records_the_bridges_above_each_gpu(host, links):
    assert command(host, "baseline").returncode == 0
    gpus = json.loads(Path(host[2]["baseline_file"]).read_text())["gpus"]
    gpu2 = gpus[2]
    assert (gpu2["pci_bus_id"], gpu2["address"]) == ("00000000:41:00.0", "0000:41:00.0")  # sysfs's 4-digit domain
    # the symlink chain /sys/devices/pci0000:00/0000:00:01.1/0000:10:00.0/0000:11:10.0/0000:41:00.0, root port first
    assert gpu2["upstream"] == ["0000:00:01.1", "0000:10:00.0", "0000:11:10.0"]
    assert gpus[5]["upstream"] == ["0000:80:01.1", "0000:90:00.0", "0000:91:08.0"]  # the other socket's switch
    assert gpu2["links"]["0000:41:00.0"] == {"speed": 32.0, "width": 16, "max_speed": 32.0, "max_width": 16}
    assert set(gpu2["links"]) == {*gpu2["upstream"], "0000:41:00.0"}


def test_a_baseline_taken_while_idle_records_the_trained_speed(host, links):
    Busy.trained = dict.fromkeys(idle(links, "0000:61:00.0"), "32.0 GT/s PCIe")
    assert command(host, "baseline").returncode == 0
    gpu3 = json.loads(Path(host[2]["baseline_file"]).read_text())["gpus"][3]
    assert gpu3["links"]["0000:61:00.0"]["speed"] == 32.0 and Busy.calls > 0


def test_a_link_retrained_narrower_fails_at_once(host, links):
    assert command(host, "baseline").returncode == 0
    pci_tree.downtrain(str(links.parents[3]), "00000000:41:00.0", "16.0 GT/s PCIe", 8)  # both ends of GPU 2's link
    done = command(host, "verify")
    assert done.returncode == 1
    assert json.loads(done.stdout)["problems"] == [
        "GPU 2 (0000:41:00.0): the PCIe link of bridge 0000:11:10.0 above it trained at 16 GT/s x8, was 32 GT/s x16",
        "GPU 2 (0000:41:00.0): its PCIe link trained at 16 GT/s x8, was 32 GT/s x16"]


def test_a_link_retrained_slower_fails_under_load(host, links):
    assert command(host, "baseline").returncode == 0
    pci_tree.downtrain(str(links.parents[3]), "00000000:C1:00.0", "16.0 GT/s PCIe", 16)  # gen 4 instead of 5
    before = json.loads(command(host, "verify").stdout)  # SGLang not started: an idle GPU reads slower too
    assert before["ok"] and "GPU 6 (0000:c1:00.0): its PCIe link reads 16 GT/s x16, was 32 GT/s x16 (idle?)" in \
        before["pending"]
    done = command(host, "verify", "--under-load")
    assert done.returncode == 1 and Busy.calls > 0  # SGLang answered, the link did not come up
    assert "GPU 6 (0000:c1:00.0): its PCIe link trained at 16 GT/s x16 under load, was 32 GT/s x16" in \
        json.loads(done.stdout)["problems"]


def test_an_idle_gpu_whose_link_speed_is_lowered_is_not_a_fault(host, links):
    """The healthy case that looks like the fault: an idle GPU's link reads 2.5 GT/s (its power saving), and comes
    back to 32 GT/s as soon as SGLang makes it work."""
    assert command(host, "baseline").returncode == 0
    Busy.trained = dict.fromkeys(idle(links, "0000:81:00.0"), "32.0 GT/s PCIe")
    before = json.loads(command(host, "verify").stdout)
    assert before["ok"] and before["problems"] == [] and len(before["pending"]) == 2
    done = command(host, "verify", "--under-load")
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["pending"] == [] and Busy.calls > 0


def test_unfit_from_the_p2p_preflight_takes_the_host_out_as_the_watcher_would(host):
    tmp, _, config = host
    why = "P2P preflight: GPU 0 at 100 % and 139.82 W with no process after a hung all-reduce"
    done = command(host, "unfit", "p2p_preflight", why)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "was": "healthy", "stopped": True}
    record = facts(host)
    assert (record["state"], record["reason"]) == ("unfit", why)
    assert record["events"][-1]["source"] == "p2p_preflight" and record["events"][-1]["unfit"] is True
    assert json.loads(Path(config["unfit_file"]).read_text())["reason"] == why  # what a deploy's refusal quotes
    assert "stop --no-block sglang.service" in (tmp / "bin" / "systemctl.calls").read_text()
    # a second report keeps the first reason and the time since when it is out
    assert command(host, "unfit", "p2p_preflight", "again").returncode == 0
    assert facts(host)["reason"] == why and len(facts(host)["events"]) == 2
