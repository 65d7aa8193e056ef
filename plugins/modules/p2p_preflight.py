#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: p2p_preflight
short_description: Prove PCIe peer-to-peer before a model load, and choose pcie_p2p or pcie_shm
description:
  - Reads the host's peer-to-peer state - C(lspci -vvv) and C(lspci -tv) (the ACS control bits of every bridge
    above the GPUs, BAR1; run as root, without root lspci shows no ACS), the kernel command line, C(/sys/class/iommu),
    the kernel's IOMMU messages of this boot (the journal, else C(dmesg)), C(nvidia-smi topo -m) and
    C(topo -p2p r) / C(w) - and runs p2p-allreduce-check (the sglang_service role's files) in the SGLang venv's own
    Python twice over O(gpus) - with NCCL_P2P_DISABLE=1 as the control (O(shm_env)), then with P2P as the NCCL
    set configures it (O(p2p_env)) - each with a data check and its bus bandwidth, under a hard timeout that kills
    a hang with every process of its session.
  - After a run that hung or failed it asks nvidia-smi whether the GPUs still answer; GPUs that do not (or that
    stay busy with no process) make the verdict C(stuck), for remediation (a reboot) instead of a model load.
  - Decides with the collection's evidence rules (p2p_evidence; docs/p2p.md) - C(pcie_p2p), C(pcie_shm), C(stuck),
    or C(unknown) when even the control fails - with the reason and the fix to name (the BIOS ACS setting,
    C(iommu=pt), a C(setpci) line per bridge).
  - Caches the verdict in O(cache_file) under the boot id, a hash of the GPU/PCI hardware, a hash of the P2P state
    (ACS bits, command line, IOMMUs), the GPU set and both runs' NCCL settings; a run with the same key returns it
    with C(cached=true) and runs nothing. A P2P hang is remembered across boots for its hardware and state, so after
    the reboot that frees stuck GPUs the P2P run is not repeated (the verdict is C(pcie_shm)) until the state changes.
  - In check mode it returns the cached verdict, or the verdict of the state alone; it runs no all-reduce.
options:
  gpus:
    description: The GPUs the profile uses (nvidia-smi indices); two or more.
    type: list
    elements: int
    required: true
  python:
    description: The Python of the SGLang venv whose torch and NCCL are to be proven (C(VENV/bin/python)).
    type: path
    required: true
  check_script:
    description: Where the p2p-allreduce-check script is on the host.
    type: path
    required: true
  backend:
    description:
      - The check's collective - C(torch) (torch.distributed with NCCL), or the path of a backend file on the host
        (the moefleet lab's stand-in, sim/gpu/p2p_backend.py, whose venv has no torch).
    type: str
    default: torch
  p2p_env:
    description: The NCCL variables of the set to prove (the catalog's C(nccl_sets.pcie_p2p.env)).
    type: dict
    default: {NCCL_IB_DISABLE: "1", NCCL_P2P_LEVEL: SYS, NCCL_ALGO: Ring}
  shm_env:
    description: The NCCL variables of the control (the catalog's C(nccl_sets.pcie_shm.env)).
    type: dict
    default: {NCCL_IB_DISABLE: "1", NCCL_P2P_DISABLE: "1", NCCL_ALGO: Ring}
  p2p_test:
    description:
      - C(always) runs the P2P all-reduce even where the state is the one that hung elsewhere (ACS redirect with the
        IOMMU translating) - only a run proves it, and a hang is killed; C(unless_hang_state) takes that state's
        verdict (pcie_shm) without running P2P; C(never) runs the control only and decides by the state.
    type: str
    choices: [always, unless_hang_state, never]
    default: always
  size_mib:
    description: The all-reduce's size per GPU, MiB.
    type: int
    default: 256
  iters:
    description: Timed all-reduces per run.
    type: int
    default: 20
  warmup:
    description: Untimed all-reduces before them.
    type: int
    default: 5
  start_timeout:
    description: Seconds each run's workers get to start CUDA and NCCL.
    type: int
    default: 180
  collective_timeout:
    description: Seconds the all-reduces get once every worker started; past them the run is a hang.
    type: int
    default: 60
  settle_seconds:
    description: After a hang or failure, how long GPUs busy with no process get to go idle before they count as stuck.
    type: int
    default: 6
  cache_file:
    description: Where verdicts and hangs are kept.
    type: path
    default: /var/lib/moefleet/p2p-preflight.json
  force:
    description:
      - Run both all-reduces even when the cache has a verdict for this boot, hardware and state, or a P2P hang
        recorded for this hardware and state (a test, or a change the state does not show).
    type: bool
    default: false
  cmdline_path:
    description: The kernel command line (the moefleet lab's hosts keep theirs in C(/etc/sim-gpu/cmdline)).
    type: path
    default: /proc/cmdline
  sysfs_iommu:
    description: The kernel's IOMMU devices directory (the lab's C(/etc/sim-gpu/sys/class/iommu)).
    type: path
    default: /sys/class/iommu
  boot_id_path:
    description: The boot id the cache is keyed by.
    type: path
    default: /proc/sys/kernel/random/boot_id
  lspci:
    description: The lspci command.
    type: str
    default: lspci
  nvidia_smi:
    description: The nvidia-smi command.
    type: str
    default: nvidia-smi
  journalctl:
    description: The journalctl command (C(dmesg) is read where it fails).
    type: str
    default: journalctl
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Prove peer-to-peer over the profile's GPUs before the model load
  moefleet.serving.p2p_preflight:
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    python: /opt/sglang/0.5.10/bin/python
    check_script: /usr/local/lib/moefleet/p2p-allreduce-check
    p2p_env: "{{ catalog.nccl_sets.pcie_p2p.env }}"
    shm_env: "{{ catalog.nccl_sets.pcie_shm.env }}"
  register: __p2p

- name: Hand a host whose GPUs a hang left stuck to remediation
  ansible.builtin.fail:
    msg: "{{ __p2p.reason }} {{ __p2p.fix }}"
  when: __p2p.verdict == 'stuck'
"""

RETURN = r"""
verdict:
  description:
    - C(pcie_p2p), C(pcie_shm), C(stuck) (the GPUs do not answer; reboot) or C(unknown) (even the control failed).
  returned: always
  type: str
reason:
  description: One sentence saying what decided.
  returned: always
  type: str
fix:
  description:
    - What to change to serve with P2P (BIOS ACS, iommu=pt, setpci and pci=disable_acs_redir lines), or the reboot.
  returned: always
  type: str
rules:
  description: The evidence rules that fired, the deciding one first (docs/p2p.md).
  returned: always
  type: list
  elements: str
contradictions:
  description: Evidence that disagreed with the verdict (e.g. the hang state with a passing P2P all-reduce).
  returned: always
  type: list
  elements: str
notes:
  description: What else the evidence showed (small BAR1, P2P slower than the control, no ACS lines without root).
  returned: always
  type: list
  elements: str
missing:
  description: For C(unknown), what would decide.
  returned: always
  type: list
  elements: str
cached:
  description: The verdict came from the cache (nothing ran).
  returned: always
  type: bool
checked:
  description: An all-reduce ran in this call.
  returned: always
  type: bool
runs:
  description:
    - Each all-reduce (label control or p2p) with p2p, result (ok, hang, error, skipped), data_check, busbw_gbps,
      seconds, error, and after a hang or failure gpus_answer with what showed it.
  returned: always
  type: list
  elements: dict
bandwidths:
  description: C(p2p_busbw_gbps) and C(shm_busbw_gbps), the bus bandwidth of each run that passed (null otherwise).
  returned: always
  type: dict
evidence:
  description: One line per piece of evidence read (p2p_evidence.describe).
  returned: always
  type: list
  elements: str
iommu:
  description: The IOMMU mode read (off, passthrough, translated, on), whether it translates, and what showed it.
  returned: always
  type: dict
acs:
  description: Whether ACS redirect is on a bridge above the GPUs, and which bridges.
  returned: always
  type: dict
key:
  description:
    - The cache key (boot, hardware, state, GPUs, NCCL settings), with C(boot_id), C(hardware) and C(state) hashes.
  returned: always
  type: dict
seconds:
  description: This call's duration.
  returned: always
  type: float
decided_at:
  description: When the verdict was reached (UTC, ISO 8601); for a cached verdict, when it was cached.
  returned: always
  type: str
"""

import contextlib
import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils import p2p_evidence as evidence_rules
from ansible_collections.moefleet.serving.plugins.module_utils import p2p_probe as probe

P2P_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS", "NCCL_ALGO": "Ring"}
SHM_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}
HARD_GRACE = 30  # seconds past a run's own timeouts before the module kills its session


def run_cmd(argv, timeout):
    """(status, stdout, stderr); status None when the command did not return within timeout, 127 when it is missing."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=timeout,
                              env=dict(os.environ, LC_ALL="C"), check=False)
    except subprocess.TimeoutExpired:
        return None, "", ""
    except OSError as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def gather(p, tools, notes):
    """The static evidence: lspci, command line, /sys/class/iommu, the kernel's lines, nvidia-smi's topology."""
    items, lspci_items = [], []
    rc, vvv, err = run_cmd([tools["lspci"], "-vvv"], 60)
    _, tree, _ = run_cmd([tools["lspci"], "-tv"], 60)
    if rc != 0:
        notes.append(f"lspci -vvv failed ({(err or vvv).strip()[:200] or rc}): no ACS state; install pciutils")
    elif "<access denied>" in vvv:
        notes.append("lspci showed no capabilities (<access denied>): run the preflight as root (become) for the "
                     "ACS lines")
    try:
        lspci_items = evidence_rules.parse_lspci(f"{vvv}\n{tree}")
        items += lspci_items
    except evidence_rules.Unreadable as exc:
        notes.append(f"lspci: {exc}")
    cmdline = read_text(p["cmdline_path"])
    if cmdline is None:
        notes.append(f"{p['cmdline_path']} cannot be read")
    else:
        try:
            items += evidence_rules.parse_iommu(cmdline)
        except evidence_rules.Unreadable:
            notes.append(f"{p['cmdline_path']} holds no kernel command line")
    try:
        entries = sorted(os.listdir(p["sysfs_iommu"]))
        items.append(evidence_rules.sysfs_iommu_evidence(entries, p["sysfs_iommu"]))
    except OSError:
        entries = None
    rc, out, _ = run_cmd([tools["journalctl"], "-b", "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=kernel"], 60)
    lines = probe.kernel_iommu_lines(out) if rc == 0 else []
    if rc != 0:
        rc, out, _ = run_cmd(["dmesg"], 30)
        lines = [line for line in out.splitlines() if probe.IOMMU_LINE.search(line)] if rc == 0 else []
    if lines:
        with contextlib.suppress(evidence_rules.Unreadable):
            items += evidence_rules.parse_iommu("\n".join(lines))
    for args in (["topo", "-m"], ["topo", "-p2p", "r"], ["topo", "-p2p", "w"]):
        rc, out, err = run_cmd([tools["nvidia_smi"], *args], 60)
        if rc == 0:
            try:
                # The prompt line tells topo -p2p's capability to the parser, as in a paste.
                items += evidence_rules.read(f"$ nvidia-smi {' '.join(args)}\n{out}")
            except evidence_rules.Unreadable as exc:
                notes.append(f"nvidia-smi {' '.join(args)}: {exc}")
    return items, lspci_items, cmdline, entries


def summary(item):
    return {k: item.get(k) for k in ("label", "p2p", "result", "phase", "data_check", "busbw_gbps", "seconds",
                                     "error", "gpus_answer", "answer", "recorded", "transports")}


def main():
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "int", "required": True},
            "python": {"type": "path", "required": True},
            "check_script": {"type": "path", "required": True},
            "backend": {"type": "str", "default": "torch"},
            "p2p_env": {"type": "dict", "default": P2P_ENV},
            "shm_env": {"type": "dict", "default": SHM_ENV},
            "p2p_test": {"type": "str", "default": "always", "choices": ["always", "unless_hang_state", "never"]},
            "size_mib": {"type": "int", "default": 256},
            "iters": {"type": "int", "default": 20},
            "warmup": {"type": "int", "default": 5},
            "start_timeout": {"type": "int", "default": 180},
            "collective_timeout": {"type": "int", "default": 60},
            "settle_seconds": {"type": "int", "default": 6},
            "cache_file": {"type": "path", "default": "/var/lib/moefleet/p2p-preflight.json"},
            "force": {"type": "bool", "default": False},
            "cmdline_path": {"type": "path", "default": "/proc/cmdline"},
            "sysfs_iommu": {"type": "path", "default": "/sys/class/iommu"},
            "boot_id_path": {"type": "path", "default": "/proc/sys/kernel/random/boot_id"},
            "lspci": {"type": "str", "default": "lspci"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "journalctl": {"type": "str", "default": "journalctl"},
        },
        supports_check_mode=True,
    )
    p = module.params
    started = time.monotonic()
    gpus = p["gpus"]
    if len(gpus) < 2 or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        module.fail_json(msg=f"gpus {gpus}: give two or more distinct nvidia-smi indices (a one-GPU profile has no "
                             "peer traffic to prove)")
    p2p_env = {str(k): str(v) for k, v in p["p2p_env"].items()}
    shm_env = {str(k): str(v) for k, v in p["shm_env"].items()}
    if shm_env.get("NCCL_P2P_DISABLE") != "1":
        module.fail_json(msg="shm_env must set NCCL_P2P_DISABLE: '1' (the control runs without P2P)")
    if p2p_env.get("NCCL_P2P_DISABLE", "0") not in ("", "0"):
        module.fail_json(msg="p2p_env sets NCCL_P2P_DISABLE: that set does not use P2P; give the pcie_p2p set's env")
    notes = []
    boot_id = (read_text(p["boot_id_path"]) or "").strip()
    if not boot_id:
        module.fail_json(msg=f"{p['boot_id_path']} cannot be read: the cache needs the boot id")
    # get_bin_path looks in /sbin and /usr/sbin too (lspci's place on older systems); a missing tool is a note.
    tools = {name: module.get_bin_path(p[name]) or p[name] for name in ("lspci", "nvidia_smi", "journalctl")}
    items, lspci_items, cmdline, iommu_entries = gather(p, tools, notes)
    hardware = probe.fingerprint(probe.hardware_of(lspci_items))
    state = probe.fingerprint(probe.state_of(lspci_items, cmdline, iommu_entries))
    key = probe.cache_key(boot_id, hardware, state, gpus, p2p_env, shm_env)
    key_info = {"key": key, "boot_id": boot_id, "hardware": hardware, "state": state}
    cache, problem = probe.load_cache(p["cache_file"])
    if problem:
        notes.append(problem)
    hit = None if p["force"] else probe.cached_verdict(cache, key)
    if hit is not None:
        module.exit_json(changed=False, **dict(hit["verdict"], cached=True, checked=False,
                                               seconds=round(time.monotonic() - started, 3)))

    def finish(verdict, runs, checked, changed=False):
        out = {"verdict": verdict["verdict"], "reason": verdict["reason"], "fix": verdict["fix"],
               "rules": verdict["rules"], "contradictions": verdict["contradictions"],
               "notes": list(dict.fromkeys(notes + verdict["notes"])), "missing": verdict["missing"],
               "iommu": verdict["iommu"], "acs": verdict["acs"], "runs": [summary(r) for r in runs],
               "bandwidths": {"p2p_busbw_gbps": next((r["busbw_gbps"] for r in runs if r["p2p"] and
                                                      r["result"] == "ok"), None),
                              "shm_busbw_gbps": next((r["busbw_gbps"] for r in runs if not r["p2p"] and
                                                      r["result"] == "ok"), None)},
               "evidence": [evidence_rules.describe(item) for item in items + runs], "key": key_info,
               "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cached": False,
               "checked": checked}
        if checked and out["verdict"] in (evidence_rules.VERDICT_P2P, evidence_rules.VERDICT_SHM,
                                          evidence_rules.VERDICT_STUCK):
            probe.remember(cache, key, out)
            changed = True
        if changed:
            try:
                probe.save_cache(p["cache_file"], cache)
            except OSError as exc:
                out["notes"].append(f"the verdict could not be cached in {p['cache_file']} ({exc})")
        module.exit_json(changed=changed, seconds=round(time.monotonic() - started, 3), **out)

    static = evidence_rules.decide(items, gpus)
    if module.check_mode:
        notes.append("check mode: no all-reduce ran; the verdict is the state's alone")
        finish(static, [], checked=False)
    if not module.get_bin_path(p["nvidia_smi"]):
        module.fail_json(msg=f"{p['nvidia_smi']} is not installed: install the NVIDIA driver (role nvidia_driver) "
                             "before the preflight")
    for path, what in ((p["python"], "python (the SGLang venv's bin/python)"), (p["check_script"], "check_script")):
        if not os.path.isfile(path):
            module.fail_json(msg=f"{what} {path} does not exist: install the SGLang venv and the sglang_service "
                                 "role's p2p-allreduce-check first")

    def answer(run, p2p):
        ok, why = probe.gpus_answer(run_cmd, tools["nvidia_smi"], gpus, p["settle_seconds"])
        return evidence_rules.allreduce_evidence(run, p2p, gpus_answer=ok, answer=why,
                                                 transports=transports(run))

    def transports(run):
        lines = run.get("nccl_lines") or []
        if not lines:
            return None
        try:
            return evidence_rules.parse_nccl("\n".join(lines))[0]["families"] or None
        except evidence_rules.Unreadable:
            return None

    def check(label, env):
        argv = [p["python"], p["check_script"], "--gpus", ",".join(map(str, gpus)), "--label", label,
                "--size-mib", str(p["size_mib"]), "--iters", str(p["iters"]), "--warmup", str(p["warmup"]),
                "--start-timeout", str(p["start_timeout"]), "--collective-timeout", str(p["collective_timeout"]),
                "--backend", p["backend"]]
        base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        return probe.run_check(argv, dict(base, **env), p["start_timeout"] + p["collective_timeout"] + HARD_GRACE,
                               label)

    ok, why = probe.gpus_answer(run_cmd, tools["nvidia_smi"], gpus, 0)
    if not ok:  # stuck already (an earlier hang this boot whose verdict is not cached): nothing is run on such GPUs
        runs = [evidence_rules.allreduce_evidence({"label": "before", "result": "skipped"}, False, gpus_answer=False,
                                                  answer=why)]
        finish(evidence_rules.decide(items + runs, gpus), runs, checked=False)

    runs = []
    control = check("control", shm_env)
    runs.append(answer(control, False) if control["result"] != "ok" else
                evidence_rules.allreduce_evidence(control, False, transports=transports(control)))
    recorded = None if p["force"] else probe.recorded_hang(cache, hardware, state)
    skip = None
    if runs[0]["result"] != "ok" or not runs[0]["data_check"]:
        skip = "the control did not pass"
    elif recorded is not None:
        runs.append(evidence_rules.allreduce_evidence(
            {"label": "p2p", "result": "hang", "gpus": recorded.get("gpus")}, True,
            recorded=f"{recorded.get('time')}, boot {str(recorded.get('boot_id'))[:8]}"))
    elif p["p2p_test"] == "never":
        skip = "p2p_test is never"
    elif p["p2p_test"] == "unless_hang_state" and "acs-redirect-iommu-translating" in static["rules"]:
        skip = "p2p_test is unless_hang_state and the state is the one that hangs"
    else:
        run = check("p2p", p2p_env)
        item = answer(run, True) if run["result"] != "ok" else \
            evidence_rules.allreduce_evidence(run, True, transports=transports(run))
        runs.append(item)
        if run["result"] == "hang":
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            probe.remember_hang(cache, hardware, state, boot_id, gpus, when)
    if skip:
        runs.append(evidence_rules.allreduce_evidence({"label": "p2p", "result": "skipped", "error": skip}, True))
    finish(evidence_rules.decide(items + runs, gpus), runs, checked=True,
           changed=any(r["result"] == "hang" and not r.get("recorded") for r in runs if r["p2p"]))


if __name__ == "__main__":
    main()
