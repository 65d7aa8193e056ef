"""The gateway guard (roles/sglang_router/files/moefleet-gateway-guard) against a stand-in smg and stand-in workers'
/fitness, and the search that a worker holds no gateway key (tests/key_search.py).

What the guard must do: a worker whose fault watcher answers "unfit" (or "hardware") is written to the gateway's
workers-left-out and removed from the gateway (GET /workers, DELETE /workers/{id} with the admin key), again after a
gateway restart re-listed it; a healthy one is kept; a /fitness that does not answer, or answers something else, keeps
the worker; a wrong admin key is said, and the worker is still left out for a restarted gateway. It never adds one."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from key_search import key_hits

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "roles" / "sglang_router" / "files" / "moefleet-gateway-guard"
UNIT = ROOT / "roles" / "sglang_router" / "templates" / "etc/systemd/system/moefleet-gateway-guard.service.j2"
CHECKER = ROOT / "roles" / "moefleet_common" / "files" / "systemd-verify-strict"
ADMIN = "gateway-admin-key-for-the-test-0123"
SICK, WELL, SILENT, ODD = ("http://10.0.0.7:30000", "http://10.0.0.8:30000", "http://10.0.0.9:30000",
                           "http://10.0.0.10:30000")


def load_guard():
    loader = importlib.machinery.SourceFileLoader("gateway_guard", str(GUARD))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gateway_guard", loader))
    loader.exec_module(module)
    return module


class Smg(BaseHTTPRequestHandler):
    """smg 1.13's worker API as the guard uses it: 401 without the admin key; DELETE answers 202 and the worker shows
    "draining" (smg forgets it 5 s later); GET /workers lists url, id, status."""

    workers: list[dict] = []
    deleted: list[str] = []
    lock = threading.Lock()

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {ADMIN}":
            return True
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Unauthorized"}')
        return False

    def do_GET(self):  # noqa: N802
        if self.path != "/workers" or not self._authorized():
            return
        with Smg.lock:
            body = json.dumps({"workers": Smg.workers, "total": len(Smg.workers)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self):  # noqa: N802
        if not self._authorized():
            return
        wid = self.path.removeprefix("/workers/")
        with Smg.lock:
            Smg.deleted.append(wid)
            for w in Smg.workers:
                if w["id"] == wid:
                    w["status"] = "draining"
        self.send_response(202)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"status": "accepted", "worker_id": wid}).encode())

    def do_POST(self):  # noqa: N802  (the guard never adds a worker: a test fails on this)
        Smg.deleted.append("POST " + self.path)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args):
        pass


class Fitness(BaseHTTPRequestHandler):
    """The workers' fault watchers: /sick answers unfit, /well healthy, /odd a 404 (not a watcher)."""

    def do_GET(self):  # noqa: N802
        answers = {"/sick/fitness": {"state": "unfit", "reason": "gpu 3: Xid 79 GPU has fallen off the bus",
                                     "since": "2026-03-29T15:38:59+00:00"},
                   "/well/fitness": {"state": "healthy", "reason": None, "since": None}}
        if self.path not in answers:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answers[self.path]).encode())

    def log_message(self, *args):
        pass


def serve(handler) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def fleet(tmp_path):
    smg, watchers = serve(Smg), serve(Fitness)
    Smg.workers = [{"id": f"w-{i}", "url": url, "status": "ready", "is_healthy": True}
                   for i, url in enumerate((SICK, WELL, SILENT, ODD), 1)]
    Smg.deleted = []
    base = f"http://127.0.0.1:{watchers.server_port}"
    config = {"gateway_url": f"http://127.0.0.1:{smg.server_port}", "left_out_file": str(tmp_path / "workers-left-out"),
              "interval": 0.2,
              "workers": [{"url": SICK, "fitness_url": f"{base}/sick/fitness"},
                          {"url": WELL, "fitness_url": f"{base}/well/fitness"},
                          {"url": SILENT, "fitness_url": f"http://127.0.0.1:{closed_port()}/fitness"},
                          {"url": ODD, "fitness_url": f"{base}/odd/fitness"}]}
    yield tmp_path, config
    smg.shutdown()
    watchers.shutdown()


def test_an_unfit_worker_is_left_out_and_removed_the_others_are_kept(fleet, capsys):
    tmp, config = fleet
    (tmp / "workers-left-out").write_text("http://10.0.0.99:30000\n")  # a rollout's, kept as it is
    guard = load_guard().Guard(config, ADMIN)
    found = guard.round()
    assert found[SICK] == "removed"
    assert found[WELL] == "healthy"
    assert found[SILENT].startswith("kept: /fitness no answer")  # a network blip is no fault
    assert found[ODD] == "kept: /fitness HTTP 404"
    assert Smg.deleted == ["w-1"]
    assert (tmp / "workers-left-out").read_text() == f"http://10.0.0.99:30000\n{SICK}\n"
    assert oct((tmp / "workers-left-out").stat().st_mode & 0o777) == "0o644"  # smg-launch reads it
    said = capsys.readouterr().out
    assert f"{SICK} is unfit (gpu 3: Xid 79 GPU has fallen off the bus)" in said
    # The next round: nothing more to do (smg lists it draining), nothing written twice, nothing said twice.
    assert guard.round()[SICK] == "not listed"
    assert Smg.deleted == ["w-1"]
    assert (tmp / "workers-left-out").read_text().count(SICK) == 1
    assert capsys.readouterr().out == ""
    # A gateway restarted without smg-launch's list (or a hand-made POST) lists it again: out again.
    with Smg.lock:
        Smg.workers = [w for w in Smg.workers if w["url"] != SICK] + [{"id": "w-5", "url": SICK, "status": "ready"}]
    assert guard.round()[SICK] == "removed" and Smg.deleted == ["w-1", "w-5"]
    assert [w["id"] for w in Smg.workers if w["status"] == "ready"] == ["w-2", "w-3", "w-4"]


def test_a_wrong_admin_key_is_said_and_the_worker_still_left_out(fleet, capsys):
    tmp, config = fleet
    guard = load_guard().Guard(config, "not-the-admin-key-0123456789")
    guard.check()
    assert "HTTP 401 (the admin key is wrong" in capsys.readouterr().out
    found = guard.round()
    assert found[SICK].startswith("NOT removed: the gateway answered GET /workers with HTTP 401 (the admin key is")
    assert Smg.deleted == []
    assert SICK in (tmp / "workers-left-out").read_text()  # a restarted gateway leaves it out all the same


def test_a_gateway_that_does_not_answer_is_tried_again(fleet):
    tmp, config = fleet
    config = dict(config, gateway_url=f"http://127.0.0.1:{closed_port()}")
    guard = load_guard().Guard(config, ADMIN)
    assert guard.round()[SICK].startswith("NOT removed: the gateway did not answer GET /workers")
    assert SICK in (tmp / "workers-left-out").read_text()


def test_the_program_reads_the_key_from_the_gateways_credential_and_acts(fleet, tmp_path):
    _, config = fleet
    (tmp_path / "guard.json").write_text(json.dumps(config))
    (tmp_path / "smg-secrets").write_text(f"# a comment\nCONTROL_PLANE_KEY={ADMIN}\nWORKER_API_KEY=\n")
    # Unbuffered, its lines read as they come: stopped as soon as the gateway saw the DELETE, the program had not
    # always printed why yet (a loaded machine: CI16), and a buffered line dies with it.
    proc = subprocess.Popen([sys.executable, str(GUARD), str(tmp_path / "guard.json"), str(tmp_path / "smg-secrets")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30  # a bound on a hung program, not a measure
        while (not Smg.deleted or not any(f"{SICK} is unfit" in line for line in lines)) \
                and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        reader.join(10)
        out = "".join(lines)
    assert Smg.deleted[:1] == ["w-1"], out
    assert "the gateway at http://127.0.0.1:" in out and f"{SICK} is unfit" in out
    assert not any(d.startswith("POST") for d in Smg.deleted)


def test_no_admin_key_in_the_credential_is_refused(tmp_path):
    (tmp_path / "guard.json").write_text(json.dumps({"gateway_url": "http://127.0.0.1:9", "interval": 2,
                                                     "left_out_file": str(tmp_path / "x"), "workers": []}))
    (tmp_path / "smg-secrets").write_text("WORKER_API_KEY=abc\n")
    done = subprocess.run([sys.executable, str(GUARD), str(tmp_path / "guard.json"), str(tmp_path / "smg-secrets")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "no CONTROL_PLANE_KEY" in done.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_guard_unit_verifies_silently(tmp_path):
    text = UNIT.read_text()
    values = {"ansible_managed | comment": "# managed", "moefleet_libexec_dir": str(GUARD.parent),
              "sglang_router_user": "nobody", "sglang_router_group": "nogroup", "sglang_router_config_dir": "/etc/smg",
              "sglang_router_home": "/var/lib/smg"}
    for name, value in values.items():
        text = text.replace("{{ " + name + " }}", value)
    assert "{{" not in text
    unit = tmp_path / "moefleet-gateway-guard.service"
    unit.write_text(text)
    done = subprocess.run([str(CHECKER), str(unit)], capture_output=True, text=True,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    assert done.returncode == 0, done.stderr
    assert "User=nobody" in text and "CapabilityBoundingSet=\n" in text and "LoadCredential=smg-secrets:" in text


def _local(argv: list[str], stdin: str) -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60).stdout


def test_the_key_search_finds_files_and_process_environments_and_nothing_else(tmp_path):
    key = "admin-key-the-search-must-find-0123"
    (tmp_path / "etc" / "moefleet").mkdir(parents=True)
    (tmp_path / "etc" / "moefleet" / "fault-watch.json").write_text(json.dumps({"admin_key": key}))
    (tmp_path / "etc" / "moefleet" / "other.json").write_text(json.dumps({"admin_key": "something else entirely"}))
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "blob").write_bytes(b"\x00\x01" + key.encode() + b"\xff")  # binary files count too
    (tmp_path / "proc").mkdir()  # the root's proc, sys and dev are not files
    (tmp_path / "proc" / "kcore").write_text(key)
    os.mkfifo(tmp_path / "var" / "fifo")  # skipped, not waited on
    # a large file is searched only under var/log (a journal); elsewhere it is weights or a library (sparse here)
    for big in (tmp_path / "var" / "log" / "journal" / "system.journal", tmp_path / "opt" / "model" / "shard"):
        big.parent.mkdir(parents=True)
        with big.open("wb") as fh:
            fh.seek(20 * 1024 * 1024)
            fh.write(key.encode())
    holder = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "GATEWAY_KEY": key})
    clean = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "GATEWAY_KEY": "no"})
    try:
        hits = key_hits(_local, key, str(tmp_path))
    finally:
        holder.kill()
        clean.kill()
        holder.wait()
        clean.wait()
    files = [h for h in hits if not h.startswith("/proc/")]
    assert files == [f"{tmp_path}/etc/moefleet/fault-watch.json", f"{tmp_path}/var/blob",
                     f"{tmp_path}/var/log/journal/system.journal"]
    assert f"/proc/{holder.pid}/environ (sleep)" in hits
    assert not any(h.startswith(f"/proc/{clean.pid}/") for h in hits)
    assert not any("(sh)" in h or "(grep)" in h for h in hits)  # the search does not find itself
    assert key_hits(_local, "a-key-nobody-has-0123456789", str(tmp_path)) == []
