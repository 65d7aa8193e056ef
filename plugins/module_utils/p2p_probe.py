"""The on-host peer-to-peer preflight's probing (plugins/modules/p2p_preflight.py, issue 36): the fingerprints its
verdict is cached under, the cache file, the all-reduce check run under a hard timeout that kills a hang, the test
whether the GPUs still answer after it, and the kernel's IOMMU lines from the journal. The evidence and the decision
are p2p_evidence's.

The cache (one JSON file) keeps each verdict under a key of the boot (/proc/sys/kernel/random/boot_id), the hardware
(the PCI devices lspci shows: GPUs with their BAR1, bridges with their bus ranges), the P2P state (each bridge's ACSCtl
bits, the kernel command line, /sys/class/iommu), the GPU set and the NCCL settings of both runs: a second run on the
same boot, hardware and state returns the verdict without running anything; a reboot, a moved GPU, a `setpci` that
clears ACS redirect, or another GPU set runs it again. It also keeps every P2P hang with its hardware and state, across
boots: after the reboot that frees GPUs a hang left stuck, the preflight does not run P2P again in the same state
(it would hang again) and serves pcie_shm, until the state changes.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

CACHE_VERSION = 1
KEEP_ENTRIES = 32  # verdicts kept (boots x GPU sets); the oldest go first
KEEP_HANGS = 16
BUSY_PERCENT = 90  # a GPU this busy with no process on it is spinning in a dead collective (FACTS §16)


def fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def hardware_of(lspci: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What identifies the host's GPUs and the PCIe tree between them (from parse_lspci's items)."""
    gpus = sorted({(g["bdf"], g["name"], g["bar1_bytes"]) for item in lspci for g in item["gpus"]})
    bridges = sorted({(b["bdf"], b["name"], b["secondary"], b["subordinate"]) for item in lspci
                      for b in item["bridges"]}, key=lambda row: row[0])
    return {"gpus": [list(g) for g in gpus], "bridges": [list(b) for b in bridges]}


def state_of(lspci: Sequence[dict[str, Any]], cmdline: str | None, iommu_entries: Sequence[str] | None) -> dict:
    """The peer-to-peer state a hang depends on: each bridge's ACSCtl bits, the command line, the IOMMUs set up."""
    acs = {b["bdf"]: sorted(k for k, v in (b["acs_ctl"] or {}).items() if v) for item in lspci
           for b in item["bridges"] if b["acs_ctl"] is not None}
    return {"acs": dict(sorted(acs.items())), "cmdline": (cmdline or "").strip(),
            "iommu": sorted(iommu_entries) if iommu_entries is not None else None}


def cache_key(boot_id: str, hardware: str, state: str, gpus: Sequence[int], p2p_env: dict, shm_env: dict) -> str:
    return fingerprint({"boot": boot_id, "hardware": hardware, "state": state, "gpus": sorted(gpus),
                        "p2p_env": p2p_env, "shm_env": shm_env})


def load_cache(path: str) -> tuple[dict[str, Any], str | None]:
    """The cache, and a sentence when the file could not be used (it is then started anew)."""
    empty = {"version": CACHE_VERSION, "entries": [], "hangs": []}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return empty, None
    except (OSError, ValueError) as exc:
        return empty, f"the cache {path} could not be read ({exc}); it is written anew"
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return empty, f"the cache {path} is of another version; it is written anew"
    data.setdefault("entries", [])
    data.setdefault("hangs", [])
    return data, None


def save_cache(path: str, cache: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed over it), readable by root only."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    cache["entries"] = cache["entries"][-KEEP_ENTRIES:]
    cache["hangs"] = cache["hangs"][-KEEP_HANGS:]
    handle, partial = tempfile.mkstemp(prefix=".p2p-preflight.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(cache, out, indent=1, sort_keys=True)
            out.write("\n")
        os.chmod(partial, 0o600)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def cached_verdict(cache: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((entry for entry in reversed(cache["entries"]) if entry.get("key") == key), None)


def recorded_hang(cache: dict[str, Any], hardware: str, state: str) -> dict[str, Any] | None:
    """A P2P hang seen on this hardware in this P2P state, on any boot."""
    return next((hang for hang in reversed(cache["hangs"])
                 if hang.get("hardware") == hardware and hang.get("state") == state), None)


def remember(cache: dict[str, Any], key: str, verdict: dict[str, Any]) -> None:
    cache["entries"] = [e for e in cache["entries"] if e.get("key") != key] + [{"key": key, "verdict": verdict}]


def remember_hang(cache: dict[str, Any], hardware: str, state: str, boot_id: str, gpus: Sequence[int],
                  when: str) -> None:
    cache["hangs"] = [h for h in cache["hangs"] if not (h.get("hardware") == hardware and h.get("state") == state)]
    cache["hangs"].append({"hardware": hardware, "state": state, "boot_id": boot_id, "gpus": list(gpus),
                           "time": when})


# --- running the check -----------------------------------------------------------------------------------------------


def run_check(argv: Sequence[str], env: dict[str, str], hard_timeout: float, label: str) -> dict[str, Any]:
    """Run p2p-allreduce-check in a session of its own and return its JSON line. Past hard_timeout every process of
    the session (the check and its workers) is killed with SIGKILL and the run counts as a hang; output that is no
    JSON line counts as an error, with the output's end."""
    started = time.monotonic()
    proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=hard_timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process that left the session may hold the pipes
            proc.communicate(timeout=10)
        proc.wait()  # killed with its session: it ends
        return {"label": label, "result": "hang", "phase": None, "data_check": None, "busbw_gbps": None,
                "seconds": round(time.monotonic() - started, 3),
                "error": f"the check itself did not return within {hard_timeout:g} s; its processes were killed",
                "nccl_lines": []}
    kill_session(proc)  # workers the check left behind (it kills its own; a crash of it would not)
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                run = json.loads(line)
            except ValueError:
                continue
            if isinstance(run, dict) and run.get("result") in ("ok", "hang", "error"):
                return run
    tail = " | ".join(x.strip() for x in (out + "\n" + err).strip().splitlines()[-4:])
    return {"label": label, "result": "error", "phase": None, "data_check": None, "busbw_gbps": None,
            "seconds": round(time.monotonic() - started, 3),
            "error": f"the check exited with status {proc.returncode} without a result: {tail[-600:] or 'no output'}",
            "nccl_lines": []}


def kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# --- do the GPUs still answer? -------------------------------------------------------------------------------------

ANSWER_FIELDS = "index,pci.bus_id,utilization.gpu,power.draw"


def judge_answer(rc: int | None, out: str, err: str, apps: str, gpus: Sequence[int]) -> tuple[bool, str]:
    """(the GPUs answer, what showed it) from `nvidia-smi --query-gpu=ANSWER_FIELDS --format=csv,noheader,nounits`
    (rc None: it timed out) and `--query-compute-apps=gpu_bus_id --format=csv,noheader`: stuck when nvidia-smi fails
    or hangs, or when a GPU of the set runs at BUSY_PERCENT % or more with no process on it."""
    if rc is None:
        return False, "nvidia-smi did not return"
    if rc != 0:
        text = " ".join((err.strip() or out.strip()).split())[:300]
        return False, f"nvidia-smi exited with status {rc}: {text or 'no output'}"
    busy_bus_ids = {line.strip().lower() for line in apps.splitlines() if line.strip()}
    spinning = []
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < 4 or not cells[0].isdigit() or int(cells[0]) not in gpus:
            continue
        try:
            util, power = float(cells[2]), float(cells[3])
        except ValueError:
            continue
        if util >= BUSY_PERCENT and cells[1].lower() not in busy_bus_ids:
            spinning.append(f"GPU {cells[0]} at {util:g} % and {power:g} W with no process")
    if spinning:
        return False, "; ".join(spinning)
    return True, "nvidia-smi answers, no GPU of the set busy without a process"


def gpus_answer(run_cmd: Callable[[Sequence[str], float], tuple[int | None, str, str]], nvidia_smi: str,
                gpus: Sequence[int], settle: float, timeout: float = 30) -> tuple[bool, str]:
    """Ask nvidia-smi; a GPU busy without a process may be one whose killed process is still letting go: ask again
    over `settle` seconds before calling it stuck. run_cmd(argv, timeout) -> (rc or None on timeout, out, err)."""
    ids = ",".join(str(g) for g in gpus)
    deadline = time.monotonic() + settle
    while True:
        rc, out, err = run_cmd([nvidia_smi, f"--query-gpu={ANSWER_FIELDS}", "--format=csv,noheader,nounits",
                                "-i", ids], timeout)
        apps = ""
        if rc == 0:
            _, apps, _ = run_cmd([nvidia_smi, "--query-compute-apps=gpu_bus_id", "--format=csv,noheader"], timeout)
        answer, why = judge_answer(rc, out, err, apps, gpus)
        if answer or rc != 0 or time.monotonic() >= deadline:
            return answer, why
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


# --- the kernel's IOMMU lines ----------------------------------------------------------------------------------------

IOMMU_LINE = re.compile(r"iommu|DMAR|AMD-Vi|IO_PAGE_FAULT", re.I)


def kernel_iommu_lines(journal_json: str, limit: int = 400) -> list[str]:
    """The kernel's IOMMU messages of this boot from `journalctl -b -o json SYSLOG_IDENTIFIER=kernel`: entries the
    kernel wrote (transport kernel) or root wrote under its name (as the fault watcher trusts them; the lab's boot
    unit writes its simulated kernel's lines so), the rest ignored."""
    lines = []
    for raw in journal_json.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("SYSLOG_IDENTIFIER") != "kernel" or not (
                entry.get("_TRANSPORT") == "kernel" or entry.get("_UID") == "0"):
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald hands non-UTF-8 messages as bytes
            message = bytes(message).decode("utf-8", "replace")
        for line in str(message or "").splitlines():
            if IOMMU_LINE.search(line) and len(lines) < limit:
                lines.append(line.rstrip())
    return lines
