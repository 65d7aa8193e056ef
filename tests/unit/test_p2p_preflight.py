"""The P2P preflight module (plugins/modules/p2p_preflight.py) on a simulated host: its verdict in each state the lab
sets (the stand-in lspci, nvidia-smi and all-reduce backend of sim/gpu read it), its cache by boot, hardware and state,
the hang it remembers across a reboot, check mode; and its probing pieces (plugins/module_utils/p2p_probe.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import p2p_probe as probe
from ansible_collections.moefleet.serving.plugins.modules import p2p_preflight
from readiness_module import AnsibleExitJson, AnsibleFailJson, set_module_args

ROOT = Path(__file__).resolve().parents[2]
SIM_GPU = ROOT / "sim" / "gpu"
sys.path.insert(0, str(SIM_GPU))
import pcie_sim  # noqa: E402  (the lab's PCIe model: writes the state the stand-in tools read)

STAND_INS = {(SIM_GPU / "lspci").resolve(), (SIM_GPU / "nvidia-smi").resolve()}
REAL_RUN_CMD = p2p_preflight.run_cmd


def journal(root: Path) -> str:
    """journalctl as the preflight calls it (-b -o json SYSLOG_IDENTIFIER=kernel): the simulated kernel's boot lines
    as root wrote them (the lab's boot unit), and one forged line from an unprivileged user that must not count."""
    entries = [{"SYSLOG_IDENTIFIER": "kernel", "_UID": "0", "_TRANSPORT": "stdout", "MESSAGE": line}
               for line in (root / "kernel-boot.log").read_text().splitlines()]
    entries.append({"SYSLOG_IDENTIFIER": "kernel", "_UID": "1000", "_TRANSPORT": "stdout",
                    "MESSAGE": "iommu: Default domain type: Passthrough (set via kernel command line)"})
    return "".join(json.dumps(entry) + "\n" for entry in entries)


def run_in_process(argv, timeout):
    """The module's run_cmd, with the stand-in lspci and nvidia-smi run in this process (their own code, as a script:
    a Python start per call would cost most of this file's time) and journalctl answered from the host's boot lines."""
    if Path(argv[0]).name == "journalctl":
        return 0, journal(Path(os.environ["SIM_GPU_ROOT"])), ""
    if Path(argv[0]).resolve() not in STAND_INS:
        return REAL_RUN_CMD(argv, timeout)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with mock.patch.object(sys, "argv", [str(argv[0]), *argv[1:]]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            runpy.run_path(str(argv[0]), run_name="__main__")
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return code, out.getvalue(), err.getvalue()


class Host:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.root, self.run = tmp, tmp / "etc-sim-gpu", tmp / "run"
        self.boot, self.cache = tmp / "boot_id", tmp / "var" / "p2p-preflight.json"
        self.root.mkdir()
        self.reboot()
        self.set()

    def set(self, **changes) -> None:
        state = dict(json.loads(json.dumps(pcie_sim.DEFAULT_STATE)), **changes)
        pcie_sim.write_state(str(self.root), state)

    def reboot(self) -> None:
        """A new boot id, and /run as a reboot leaves it: empty."""
        self.boot.write_text(os.urandom(16).hex() + "\n")
        for leftover in self.run.glob("*") if self.run.is_dir() else ():
            leftover.unlink()

    def args(self, gpus=(0, 1), **extra) -> dict:
        return {"gpus": list(gpus), "python": sys.executable,
                "check_script": str(ROOT / "roles" / "sglang_service" / "files" / "p2p-allreduce-check"),
                "backend": str(SIM_GPU / "p2p_backend.py"), "size_mib": 256, "iters": 2, "warmup": 1,
                "start_timeout": 30, "collective_timeout": 1, "settle_seconds": 0, "cache_file": str(self.cache),
                "cmdline_path": str(self.root / "cmdline"), "sysfs_iommu": str(self.root / "sys" / "class" / "iommu"),
                "boot_id_path": str(self.boot), "lspci": str(SIM_GPU / "lspci"),
                "nvidia_smi": str(SIM_GPU / "nvidia-smi"), "journalctl": "journalctl", **extra}


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_GPU_ROOT", str(tmp_path / "etc-sim-gpu"))
    monkeypatch.setenv("SIM_GPU_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("SIM_GPU_SPEC", str(tmp_path / "gpus.json"))
    monkeypatch.setenv("SIM_GPU_STATE_DIR", str(tmp_path / "procs"))
    monkeypatch.setenv("SIM_LSPCI_USER", "root")
    for var in [v for v in os.environ if v.startswith("NCCL_")]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(p2p_preflight, "run_cmd", run_in_process)
    return Host(tmp_path)


def preflight(args: dict, check_mode: bool = False) -> dict:
    with set_module_args(args, check_mode):
        try:
            p2p_preflight.main()
        except AnsibleExitJson as done:
            return done.args[0]
        except AnsibleFailJson as failed:
            return failed.args[0]
    raise AssertionError("the module returned without exit_json or fail_json")


def test_a_healthy_host_keeps_p2p_and_the_next_run_on_this_boot_reads_the_cache(host):
    first = preflight(host.args(gpus=range(2, 6)))  # GPUs 2-5: the ring crosses the sockets
    assert (first["verdict"], first["rules"][0], first["cached"], first["checked"]) == (
        "pcie_p2p", "allreduce-p2p-ok", False, True)
    assert first["changed"] and host.cache.is_file()
    bw = first["bandwidths"]
    assert bw == {"p2p_busbw_gbps": pcie_sim.P2P_BUSBW["SYS"], "shm_busbw_gbps": pcie_sim.SHM_BUSBW}  # across sockets
    assert [(r["label"], r["p2p"], r["result"], r["data_check"]) for r in first["runs"]] == [
        ("control", False, "ok", True), ("p2p", True, "ok", True)]
    assert first["runs"][1]["transports"] == ["P2P"] and first["runs"][0]["transports"] == ["SHM"]
    # translated: the journal's forged "Passthrough" line of an unprivileged user did not count
    assert first["iommu"]["mode"] == "translated" and first["acs"]["redirect_on_path"] is False
    assert any(line.startswith("all-reduce with P2P: ok; data check passed") for line in first["evidence"])
    started = time.monotonic()
    second = preflight(host.args(gpus=range(2, 6)))
    assert (second["verdict"], second["cached"], second["checked"], second["changed"]) == (
        "pcie_p2p", True, False, False)
    assert second["decided_at"] == first["decided_at"] and second["key"] == first["key"]
    assert time.monotonic() - started < 5  # nothing ran
    host.reboot()
    third = preflight(host.args(gpus=range(2, 6)))
    assert (third["cached"], third["checked"]) == (False, True)
    assert third["key"]["hardware"] == first["key"]["hardware"] and third["key"]["boot_id"] != first["key"]["boot_id"]


def test_the_hang_state_gets_shm_with_the_fix_and_p2p_is_not_run_again_after_the_reboot(host):
    host.set(acs="redirect")
    started = time.monotonic()
    hung = preflight(host.args())
    assert (hung["verdict"], hung["rules"][0]) == ("pcie_shm", "allreduce-p2p-hang")
    assert "acs-redirect-iommu-translating" in hung["rules"]
    assert "setpci -s 0000:11:00.0 ECAP_ACS+0x6.w=0000:000c" in hung["fix"] and "iommu=pt" in hung["fix"]
    assert "state of the public hangs" in hung["reason"] and "without P2P it passed at" in hung["reason"]
    assert hung["runs"][1]["result"] == "hang" and hung["runs"][1]["gpus_answer"] is True
    assert time.monotonic() - started < 1 + 10  # the collective timeout, with the workers' start around it
    cache = json.loads(host.cache.read_text())
    assert len(cache["hangs"]) == 1 and cache["hangs"][0]["gpus"] == [0, 1]
    host.reboot()
    again = preflight(host.args())
    assert (again["verdict"], again["rules"][0], again["checked"]) == ("pcie_shm", "allreduce-p2p-hang", True)
    assert "was not run again" in again["reason"] and again["runs"][1]["recorded"]
    assert [r["result"] for r in again["runs"]] == ["ok", "hang"]
    host.set(acs="off")  # the BIOS fixed: another state, so P2P is proven again
    fixed = preflight(host.args())
    assert (fixed["verdict"], fixed["rules"][0]) == ("pcie_p2p", "allreduce-p2p-ok")
    assert fixed["key"]["state"] != again["key"]["state"] and fixed["key"]["hardware"] == again["key"]["hardware"]


def test_gpus_a_hang_leaves_busy_make_the_host_stuck_and_stay_so_this_boot(host):
    host.set(acs="redirect", after_hang="busy")
    stuck = preflight(host.args())
    assert (stuck["verdict"], stuck["rules"][0]) == ("stuck", "gpus-stuck")
    assert "GPU 0 at 100 % and 139.82 W with no process" in stuck["reason"]
    assert stuck["fix"].startswith("reboot the host (remediation)")
    again = preflight(host.args())
    assert (again["verdict"], again["cached"]) == ("stuck", True)
    host.reboot()  # the remediation's reboot frees the GPUs; the hang is remembered
    after = preflight(host.args())
    assert (after["verdict"], after["rules"][0]) == ("pcie_shm", "allreduce-p2p-hang")


def test_gpus_that_do_not_answer_before_the_check_are_stuck_and_nothing_runs(host):
    pcie_sim.mark_stuck([1], "unresponsive", str(host.run))
    result = preflight(host.args())
    assert (result["verdict"], result["checked"], result["runs"][0]["result"]) == ("stuck", False, "skipped")
    assert "before any all-reduce ran" in result["reason"] and "nvidia-smi exited with status 255" in result["reason"]


def test_redirect_without_translation_keeps_p2p_and_names_the_faster_fix(host):
    host.set(acs="redirect", iommu="passthrough")
    result = preflight(host.args())
    assert (result["verdict"], result["rules"][0]) == ("pcie_p2p", "allreduce-p2p-ok")
    assert result["bandwidths"]["p2p_busbw_gbps"] < result["bandwidths"]["shm_busbw_gbps"]
    assert any(note.startswith("P2P moved") for note in result["notes"])
    assert any("setpci -s 0000:11:00.0" in note for note in result["notes"])
    assert result["iommu"]["mode"] == "passthrough"


def test_check_mode_runs_nothing_and_answers_from_the_state_or_the_cache(host):
    host.set(acs="redirect")
    static = preflight(host.args(), check_mode=True)
    assert (static["verdict"], static["rules"][0], static["checked"], static["runs"]) == (
        "pcie_shm", "acs-redirect-iommu-translating", False, [])
    assert not host.cache.exists() and not static["changed"]
    assert not (host.run / "p2p-stuck.json").exists()
    host.set(acs="off")
    preflight(host.args())
    cached = preflight(host.args(), check_mode=True)
    assert (cached["verdict"], cached["cached"]) == ("pcie_p2p", True)


def test_unless_hang_state_takes_the_states_verdict_without_running_p2p(host):
    host.set(acs="redirect")
    result = preflight(host.args(p2p_test="unless_hang_state"))
    assert (result["verdict"], result["rules"][0]) == ("pcie_shm", "acs-redirect-iommu-translating")
    assert [(r["label"], r["result"]) for r in result["runs"]] == [("control", "ok"), ("p2p", "skipped")]
    assert json.loads(host.cache.read_text())["hangs"] == []


def test_a_control_that_fails_too_decides_nothing_and_is_not_cached(host):
    host.run.mkdir(exist_ok=True)
    (host.run / "nccl-hang").touch()  # lab.py fault HOST hang: every collective hangs
    result = preflight(host.args())
    assert (result["verdict"], result["rules"][0]) == ("unknown", "allreduce-control-failed")
    assert [r["result"] for r in result["runs"]] == ["hang", "skipped"] and result["missing"]
    assert not host.cache.exists()


def test_without_root_lspci_shows_no_acs_and_the_preflight_says_why(host, monkeypatch):
    monkeypatch.setenv("SIM_LSPCI_USER", "user")
    result = preflight(host.args(), check_mode=True)
    assert any("run the preflight as root (become)" in note for note in result["notes"])
    assert result["acs"]["known"] is False


@pytest.mark.parametrize(("change", "words"), [
    ({"gpus": [0]}, "give two or more distinct nvidia-smi indices"),
    ({"shm_env": {"NCCL_IB_DISABLE": "1"}}, "shm_env must set NCCL_P2P_DISABLE"),
    ({"p2p_env": {"NCCL_P2P_DISABLE": "1"}}, "p2p_env sets NCCL_P2P_DISABLE"),
    ({"python": "/nonexistent/bin/python"}, "install the SGLang venv"),
])
def test_bad_arguments_are_refused_with_a_sentence(host, change, words):
    result = preflight(host.args(**change))
    assert result["failed"] and words in result["msg"]


# --- the probing pieces -----------------------------------------------------------------------------------------------


def test_a_check_that_outlives_its_hard_timeout_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(pidfile)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    started = time.monotonic()
    run = probe.run_check([sys.executable, "-c", script], dict(os.environ), 1, "p2p")
    assert run["result"] == "hang" and "did not return within 1 s" in run["error"]
    assert time.monotonic() - started < 5
    child = int(pidfile.read_text())
    assert gone(child), "the check's child outlived the kill"


def gone(pid: int, wait: float = 3) -> bool:
    """The process ended: no longer there, or a zombie its new parent has not reaped yet."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_check_without_a_result_line_is_an_error_with_its_output(tmp_path):
    run = probe.run_check([sys.executable, "-c", "import sys; print('Traceback: no torch'); sys.exit(3)"],
                          dict(os.environ), 30, "control")
    assert run["result"] == "error" and "status 3" in run["error"] and "no torch" in run["error"]


@pytest.mark.parametrize(("rc", "out", "apps", "answers", "words"), [
    (0, "0, 00000000:01:00.0, 0, 41.57\n1, 00000000:21:00.0, 3, 45.1\n", "", True, "nvidia-smi answers"),
    (0, "0, 00000000:01:00.0, 100, 139.82\n", "", False, "GPU 0 at 100 % and 139.82 W with no process"),
    (0, "0, 00000000:01:00.0, 100, 300.5\n", "00000000:01:00.0\n", True, "nvidia-smi answers"),  # a process works
    (0, "5, 00000000:C1:00.0, 100, 139.8\n", "", True, "nvidia-smi answers"),  # not a GPU of the set
    (255, "Unable to determine the device handle for GPU 0000:01:00.0: Unknown Error\n", "", False, "status 255"),
    (None, "", "", False, "did not return"),
])
def test_stuck_gpus_are_told_from_busy_ones(rc, out, apps, answers, words):
    answer, why = probe.judge_answer(rc, out, "", apps, [0, 1])
    assert answer is answers and words in why


def test_only_the_kernels_or_roots_lines_count(tmp_path):
    entries = [{"SYSLOG_IDENTIFIER": "kernel", "_TRANSPORT": "kernel",
                "MESSAGE": "AMD-Vi: Interrupt remapping enabled"},
               {"SYSLOG_IDENTIFIER": "kernel", "_UID": "0", "MESSAGE": "iommu: Default domain type: Translated"},
               {"SYSLOG_IDENTIFIER": "kernel", "_UID": "1000", "MESSAGE": "iommu: Default domain type: Passthrough"},
               {"SYSLOG_IDENTIFIER": "kernel", "_TRANSPORT": "kernel", "MESSAGE": "nvme nvme0: 32/0/0 queues"},
               {"SYSLOG_IDENTIFIER": "kernel", "_TRANSPORT": "kernel", "MESSAGE": list(b"DMAR: IOMMU enabled")}]
    text = "\n".join(json.dumps(e) for e in entries) + "\nnot json\n"
    assert probe.kernel_iommu_lines(text) == ["AMD-Vi: Interrupt remapping enabled",
                                             "iommu: Default domain type: Translated", "DMAR: IOMMU enabled"]


def test_a_cache_file_that_cannot_be_read_is_started_anew(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    cache, problem = probe.load_cache(str(path))
    assert cache["entries"] == [] and "could not be read" in problem
    probe.remember(cache, "k1", {"verdict": "pcie_p2p"})
    probe.remember(cache, "k1", {"verdict": "pcie_shm"})
    probe.save_cache(str(path), cache)
    again, problem = probe.load_cache(str(path))
    assert problem is None and probe.cached_verdict(again, "k1") == {"key": "k1", "verdict": {"verdict": "pcie_shm"}}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path) == ["cache.json"]  # no temporary file left
