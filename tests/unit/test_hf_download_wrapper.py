"""roles/sglang_model/files/hf-download: the token file is gone once hf ends, whatever ends it.

Ansible runs the download as an async job, which keeps running on the host when ansible-playbook is
interrupted; the next run stops it with SIGTERM (tasks/download.yml). A stand-in `hf` (a shell loop) shows
what the wrapper does with the token file and with hf's exit status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

WRAPPER = Path(__file__).resolve().parents[2] / "roles" / "sglang_model" / "files" / "hf-download"


def fake_hf(tmp_path: Path, body: str) -> Path:
    hf = tmp_path / "hf"
    hf.write_text("#!/bin/sh\n" + body + "\n")
    hf.chmod(0o755)
    return hf


def token(tmp_path: Path) -> Path:
    path = tmp_path / "hf-token"
    path.write_text("hf_sentinel")
    path.chmod(0o600)
    return path


def test_hf_reads_the_token_then_the_file_is_removed_and_hfs_status_kept(tmp_path):
    tok = token(tmp_path)
    hf = fake_hf(tmp_path, f'test "$(cat {tok})" = hf_sentinel || exit 9\necho "$@"\nexit 3')
    run = subprocess.run([str(WRAPPER), str(tok), str(hf), "download", "org/model", "--revision", "a b"],
                         capture_output=True, text=True, timeout=10)
    assert run.returncode == 3, run.stderr
    assert run.stdout.strip() == "download org/model --revision a b"
    assert not tok.exists()


def test_a_sigterm_stops_hf_and_removes_the_token(tmp_path):
    tok = token(tmp_path)
    pidfile = tmp_path / "hf.pid"
    hf = fake_hf(tmp_path, f"echo $$ > {pidfile}\nwhile :; do sleep 0.1; done")
    proc = subprocess.Popen([str(WRAPPER), str(tok), str(hf), "download"], start_new_session=True)
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        hf_pid = int(pidfile.read_text())
        assert tok.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 143
        assert not tok.exists()
        time.sleep(0.2)
        assert not Path(f"/proc/{hf_pid}").exists() or "Z" in Path(f"/proc/{hf_pid}/stat").read_text().split()[2]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_without_a_token_the_wrapper_only_runs_hf(tmp_path):
    hf = fake_hf(tmp_path, "exit 0")
    assert subprocess.run([str(WRAPPER), "", str(hf)], timeout=10).returncode == 0


def test_the_next_runs_pattern_finds_a_running_wrapper(tmp_path):
    # tasks/download.yml finds a download an interrupted run left with `pkill -f "^/bin/sh <wrapper> "`: the
    # kernel runs the script through its #! line, so that is how its command line reads.
    installed = tmp_path / "hf-download"
    shutil.copy(WRAPPER, installed)
    tasks = yaml.safe_load((WRAPPER.parents[1] / "tasks" / "download.yml").read_text())[0]["block"]
    stop = next(t for t in tasks if t["name"] == "Stop a download an interrupted run left running")
    pattern = stop["ansible.builtin.command"]["argv"][-1].replace("{{ _sglang_model_hf_download }}", str(installed))
    hf = fake_hf(tmp_path, "while :; do sleep 0.1; done")
    proc = subprocess.Popen([str(installed), str(token(tmp_path)), str(hf), "download"], start_new_session=True)
    try:
        time.sleep(0.3)
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        assert found == [str(proc.pid)]
        assert subprocess.run(["pkill", "-TERM", "-f", pattern]).returncode == 0
        assert proc.wait(10) == 143
        assert not (tmp_path / "hf-token").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
