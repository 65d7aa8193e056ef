"""The fault watcher acts on evidence, and stays silent on the healthy hosts that look most like a fault
(roles/fault_watch/files/moefleet-fault-watch run as its unit runs it, with a stand-in journalctl that follows a file,
a stand-in systemctl with a unit that is active until it is stopped or killed, and a stand-in SGLang /health):

- a hang is no progress: /health failing while SGLang's scheduler prints progress lines (a long chunked prefill on an
  idle server: SGLang's /health is 503 for all of it) is not a hang; /health failing with no progress line for the
  hang window is, and takes the host out; a start whose progress lines never reach the journal is not judged;
- a fatal PCIe line acts only for the GPUs of the baseline and the bridges above them; an NVMe's or a NIC's is recorded;
- nothing written to the journal before the deploy (`mark`) acts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WATCH = ROOT / "roles" / "fault_watch" / "files" / "moefleet-fault-watch"

# journalctl: -n 1 prints the last entry; otherwise the entries after --after-cursor, then follows the file.
FAKE_JOURNALCTL = r'''#!/usr/bin/env python3
import json, sys, time
path = sys.argv[0] + ".entries"
def lines():
    with open(path) as fh:
        return fh.read().splitlines()
if "-n" in sys.argv:
    print(lines()[-1] if lines() else "", flush=True)
    sys.exit(0)
after = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--after-cursor=")), None)
done = 0
if after:
    done = [json.loads(l)["__CURSOR"] for l in lines()].index(after) + 1
while True:
    now = lines()
    for line in now[done:]:
        print(line, flush=True)
    done = len(now)
    time.sleep(0.05)
'''
# systemctl: the unit is active (invocation inv-1) until a stop or kill; every call is recorded.
FAKE_SYSTEMCTL = r'''#!/bin/sh
echo "$*" >> "$0.calls"
state=$(cat "$0.state" 2>/dev/null || echo active)
case "$*" in
  stop*|kill*) echo inactive > "$0.state" ;;
  *"--value"*) echo "$state" ;;
  show*) printf 'ActiveState=%s\nInvocationID=inv-1\n' "$state" ;;
esac
'''


class Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802
        self.send_response(Health.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def host(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("journalctl", FAKE_JOURNALCTL), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "journalctl.entries").write_text("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Health.status = 200
    config = {
        "unit": "sglang.service", "lib": str(ROOT / "plugins" / "module_utils"),
        "health_url": f"http://127.0.0.1:{server.server_port}/health", "worker_url": "http://10.0.0.7:30000",
        "interval": 0.2, "hang_seconds": 2,
        "facts_file": str(tmp_path / "facts.d" / "moefleet_health.fact"), "unfit_file": str(tmp_path / "unfit"),
        "cursor_file": str(tmp_path / "cursor"), "baseline_file": str(tmp_path / "gpu-baseline.json"), "routers": [],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "gpu-baseline.json").write_text(json.dumps({"gpus": [
        {"index": "0", "pci_bus_id": "00000000:41:00.0", "upstream": ["0000:40:01.1", "0000:3f:00.0"]},
        {"index": "1", "pci_bus_id": "00000000:42:00.0", "upstream": ["0000:40:01.1", "0000:3f:00.0"]}]}))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    yield tmp_path, env
    server.shutdown()


class Journal:
    def __init__(self, tmp: Path):
        self.path = tmp / "bin" / "journalctl.entries"
        self.n = 0

    def add(self, message: str, unit: bool = False) -> None:
        self.n += 1
        fields = ({"_SYSTEMD_UNIT": "sglang.service", "_SYSTEMD_INVOCATION_ID": "inv-1"} if unit
                  else {"SYSLOG_IDENTIFIER": "kernel", "_TRANSPORT": "kernel"})
        with self.path.open("a") as fh:
            fh.write(json.dumps({"__CURSOR": f"c{self.n}", "__REALTIME_TIMESTAMP": str(int(time.time() * 1e6)),
                                 "MESSAGE": message, **fields}) + "\n")


def start(host):
    tmp, env = host
    return subprocess.Popen([sys.executable, str(WATCH), str(tmp / "config.json")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc) -> str:
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[0]


def facts(tmp: Path) -> dict:
    path = tmp / "facts.d" / "moefleet_health.fact"
    return json.loads(path.read_text()) if path.exists() else {}


def calls(tmp: Path) -> str:
    path = tmp / "bin" / "systemctl.calls"
    return path.read_text() if path.exists() else ""


PREFILL = ("[2026-12-04 10:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: "
           "0.03, #running-req: 0, #queue-req: 1, ")


def serve_then_fail(host, seconds: float, progress_every: float | None) -> tuple[dict, str, str]:
    """The unit serves (/health 200, one progress line: the health check's own prefill), then /health fails for
    `seconds` while the scheduler prints a progress line every `progress_every` seconds (None: never again)."""
    tmp, _ = host
    journal = Journal(tmp)
    journal.add(PREFILL, unit=True)
    proc = start(host)
    try:
        time.sleep(1)  # served
        Health.status = 503
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and "kill" not in calls(tmp):
            if progress_every is not None:
                journal.add(PREFILL, unit=True)
                time.sleep(progress_every)
            else:
                time.sleep(0.1)
    finally:
        out = stop(proc)
    return facts(tmp), calls(tmp), out


def test_a_long_prefill_that_fails_health_for_twice_the_window_is_not_a_hang(host):
    record, systemctl, out = serve_then_fail(host, 5, progress_every=0.5)
    assert "kill" not in systemctl and "stop" not in systemctl, out
    assert record.get("state", "healthy") == "healthy" and not record.get("events")
    assert not (host[0] / "unfit").exists()


def test_no_progress_while_health_fails_is_a_hang_and_takes_the_host_out(host):
    record, systemctl, out = serve_then_fail(host, 15, progress_every=None)
    assert "kill --kill-whom=all --signal=SIGKILL sglang.service" in systemctl, out
    assert record["state"] == "unfit" and record["events"][-1]["kind"] == "hang"
    assert (host[0] / "unfit").exists()


def test_a_start_whose_progress_lines_never_reach_the_journal_is_not_judged(host):
    tmp, _ = host
    (tmp / "bin" / "journalctl.entries").write_text("")  # --log-level warning: no progress line at all
    proc = start(host)
    try:
        time.sleep(1)
        Health.status = 503
        time.sleep(4)
    finally:
        out = stop(proc)
    assert "kill" not in calls(tmp) and not (tmp / "unfit").exists()
    assert "not judged a hang" in out and out.count("not judged a hang") == 1


@pytest.mark.parametrize(("line", "unfit"), [
    ("pcieport 0000:c0:01.1: AER: Uncorrectable (Fatal) error message received from 0000:c1:00.0", False),  # NVMe
    ("pcieport 0000:80:03.1: pciehp: Slot(4): Link Down", False),  # a NIC's port
    ("pcieport 0000:40:01.1: AER: Uncorrectable (Fatal) error message received from 0000:41:00.0", True),  # GPU 0
    ("pcieport 0000:3f:00.0: pciehp: Slot(1): Link Down", True),  # the switch above GPUs 0 and 1
])
def test_a_pcie_line_acts_only_for_the_gpus_and_the_bridges_above_them(host, line, unfit):
    tmp, _ = host
    Health.status = 503  # never served: only the journal can act
    Journal(tmp).add(line)
    proc = start(host)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not facts(tmp).get("events"):
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        out = stop(proc)
    (event,) = facts(tmp)["events"]
    assert event["unfit"] is unfit and (tmp / "unfit").exists() is unfit, out
    assert ("kill" in calls(tmp)) is unfit
    if not unfit:
        assert "neither a GPU nor a bridge above one" in event["meaning"] and facts(tmp)["state"] == "healthy"


def test_a_fault_written_before_the_deploy_does_not_act_and_one_after_does(host):
    tmp, env = host
    Health.status = 503
    journal = Journal(tmp)
    journal.add("NVRM: Xid (PCI:0000:41:00): 79, pid=0, GPU has fallen off the bus.")  # earlier in this boot
    done = subprocess.run([sys.executable, str(WATCH), str(tmp / "config.json"), "mark"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert json.loads(done.stdout) == {"changed": True} and (tmp / "cursor").read_text() == "c1"
    again = subprocess.run([sys.executable, str(WATCH), str(tmp / "config.json"), "mark"], env=env,
                           capture_output=True, text=True, timeout=30)
    assert json.loads(again.stdout) == {"changed": False}  # a redeploy keeps the position
    proc = start(host)
    try:
        time.sleep(1.5)
        assert facts(tmp).get("events", []) == [] and "kill" not in calls(tmp)
        journal.add("NVRM: Xid (PCI:0000:42:00): 79, pid=0, GPU has fallen off the bus.")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not facts(tmp).get("events"):
            time.sleep(0.1)
    finally:
        out = stop(proc)
    assert [e["pci"] for e in facts(tmp)["events"]] == ["0000:42:00"], out
    assert facts(tmp)["state"] == "unfit"
