"""The lab host's PCIe peer-to-peer state, and what the simulated tools make of it (not the kernel's, not NVIDIA's).

What a real host keeps in hardware, BIOS and boot settings lives in files under ROOT (/etc/sim-gpu on a lab host, env
SIM_GPU_ROOT), so it survives `sim/lab/lab.py reboot` as a BIOS setting and /etc/default/grub do:

    ROOT/sys/...              the PCI tree (pci_tree.py), in one of its topologies: "two-sockets" or "one-switch"
    ROOT/p2p.json             the topology, ACS control per bridge, the IOMMU mode, the GPUs' BAR1 size, and what a hung
                              P2P all-reduce leaves behind ("after_hang")
    ROOT/cmdline              the kernel command line of the boot (stands in for /proc/cmdline, which a container
                              cannot change)
    ROOT/sys/class/iommu/     one entry per IOMMU the kernel set up (ivhd0, ivhd1: one per socket), none when it is off
    ROOT/kernel-boot.log      the kernel's IOMMU messages of a boot in that state (the lab's boot unit writes them to
                              the journal under the identifier "kernel" at every boot, as the kernel's own would be)

and what one boot leaves behind, in RUN (/run/sim-gpu, env SIM_GPU_RUN_DIR; a reboot clears it):

    RUN/p2p-stuck.json        the GPUs a hung P2P all-reduce left stuck, and how: "busy" (nvidia-smi answers: 100 %,
                              about 140 W, no process) or "unresponsive" (nvidia-smi fails)

Read by sim/gpu/lspci (`lspci -vvv`, `-tv`), sim/gpu/nvidia-smi (`topo -m`, `topo -p2p`, the stuck GPUs) and
sim/gpu/p2p_backend.py (the preflight's all-reduce); written by `sim/lab/lab.py p2p` through this file's command line:

    python3 pcie_sim.py set ROOT [--topology T] [--acs MODE] [--acs-bridge BDF=MODE ...] [--iommu MODE]
                                 [--bar1 SIZE] [--after-hang WHAT] [--reset]
    python3 pcie_sim.py show ROOT          the state as JSON, with the GPU pairs' links and what an all-reduce does

ACS modes (the ACSCtl bits lspci shows on a root port or switch downstream port): "off" (every bit -), "srcvalid"
(SrcValid+ only, harmless), "redirect" (SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+, the bits Linux's
pci_std_enable_acs sets and the lkml/nccl#2079 reports show). IOMMU modes: "translated" (no IOMMU option on the
command line, the kernel's default on AMD), "passthrough" (iommu=pt), "off" (amd_iommu=off). The healthy default:
two sockets, ACS off, IOMMU translated, BAR1 128G, a hang that recovers when its processes are killed.

Standard library only: lab hosts run it with the system python3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pci_tree  # noqa: E402  (the PCI tree this state is about; beside this file on a lab host too)

TOPOLOGIES = pci_tree.TOPOLOGIES
ACS_MODES = ("off", "srcvalid", "redirect")
IOMMU_MODES = ("translated", "passthrough", "off")
AFTER_HANG = ("recover", "busy", "unresponsive")
DEFAULT_STATE = {"topology": "two-sockets", "acs": "off", "acs_bridges": {}, "iommu": "translated", "bar1": "128G",
                 "after_hang": "recover"}
ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
ACS_SET = {"off": set(), "srcvalid": {"SrcValid"}, "redirect": {"SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"}}
# What each kind of bridge can do (ACSCap), as lspci shows it: the AMD root port's from the lkml excerpt in
# tests/data/p2p; a PCIe switch's downstream ports have every ACS control. Switch upstream ports have no ACS.
ACS_CAP = {"root_port": "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+",
           "downstream": "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+"}
BOOT_IMAGE = "BOOT_IMAGE=/boot/vmlinuz-6.1.0-31-amd64 root=UUID=5f1c2e7a-93d4-4b8e-a1f6-0c2d9e4b7a31 ro quiet"
IOMMU_CMDLINE = {"translated": "", "passthrough": " iommu=pt", "off": " amd_iommu=off"}
NVIDIA = "0x10de"

# --- bandwidths (GB/s, NCCL's all-reduce bus bandwidth of 8 GPUs, as nccl-tests computes it) -------------------------
# Measured on 8x RTX PRO 6000 Blackwell (voipmonitor/rtx6kpro, hardware/pcie-bandwidth.md, "NCCL AllReduce Bus
# Bandwidth", all_reduce_perf -g 8): 41.1 behind PCIe switches on one CPU (luke, 3 switches), 40.1 (Grimulkan, 4
# switches, 32M); 37.6 across two Turin sockets (Festr, NCCL_MIN_NCHANNELS=8). The same page measures a P2P write
# between two GPUs at ~54 GB/s behind Broadcom PEX890xx switches and ~50 GB/s across NUMA nodes
# (p2pBandwidthLatencyTest).
P2P_BUSBW = {"PIX": 41.1, "PXB": 41.1, "PHB": 41.1, "NODE": 41.1, "SYS": 37.6}
# Modelled, not measured (no public all_reduce_perf of these cards with NCCL_P2P_DISABLE=1 was found): with P2P off
# each ring step goes GPU -> host memory -> GPU. One pair through host memory moves 42.47 GB/s on Gen5
# (aikitoria/open-gpu-kernel-modules#9, RTX 5090, P2P=Disabled); with eight GPUs sending and receiving at once every
# byte is written and read in host memory (16 flows), and a socket's DDR5 delivers roughly 300 GB/s in practice, so
# about 300 / 16 = 19 GB/s each: 20.
SHM_BUSBW = 20.0
# Modelled: ACS redirect without a translating IOMMU sends peer traffic up to the root complex (NVIDIA NCCL
# troubleshooting, "PCI Access Control Services": "a significant performance reduction"); behind a switch the four
# GPUs then share its x16 uplink both ways (~54 GB/s each way, as above): 54 / 4 = 13.5 GB/s.
REDIRECTED_BUSBW = 13.5
# NCCL_P2P_LEVEL's order (NCCL env docs; legacy integers 0-4, above 4 is SYS, FACTS §6); NODE sits between PHB and SYS.
LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 4.5, "SYS": 5}
LEGACY_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}
# NCCL's default P2P level is SYS except on Intel and ARM CPUs (PXB); the lab's root complex is AMD (pci_tree).
DEFAULT_LEVEL = "SYS"
NCCL_VERSION = "2.27.3"  # modelled: the NCCL of torch 2.9's nvidia-nccl-cu12 wheels


def root_dir() -> str:
    return os.environ.get("SIM_GPU_ROOT", "/etc/sim-gpu")


def run_dir() -> str:
    return os.environ.get("SIM_GPU_RUN_DIR", "/run/sim-gpu")


# --- the state ------------------------------------------------------------------------------------------------------


def read_state(root: str | None = None) -> dict:
    """The host's P2P state (DEFAULT_STATE where ROOT/p2p.json is absent or says nothing)."""
    state = json.loads(json.dumps(DEFAULT_STATE))
    try:
        with open(Path(root or root_dir(), "p2p.json"), encoding="utf-8") as fh:
            state.update(json.load(fh))
    except (OSError, ValueError):
        pass
    return state


def kernel_lines(state: dict, gpus: list[str]) -> list[str]:
    """What the kernel prints about its IOMMU at boot in this state (the formats of tests/data/p2p's AMD-Vi and iommu
    excerpts). 'Default domain type: Translated' is printed with the IOMMU off too, as the real kernel does."""
    mode = state["iommu"]
    if mode == "off":
        return ["iommu: Default domain type: Translated", "iommu: DMA domain TLB invalidation policy: lazy mode"]
    lines = ["pci 0000:00:00.2: AMD-Vi: Found IOMMU cap 0x40", "pci 0000:80:00.2: AMD-Vi: Found IOMMU cap 0x40",
             "AMD-Vi: Interrupt remapping enabled"]
    if mode == "passthrough":
        lines.append("iommu: Default domain type: Passthrough (set via kernel command line)")
    else:
        lines += ["iommu: Default domain type: Translated", "iommu: DMA domain TLB invalidation policy: lazy mode"]
    lines += [f"pci {gpu}: Adding to iommu group {40 + i}" for i, gpu in enumerate(gpus)]
    return lines


def write_state(root: str, state: dict, bus_ids: list[str] | None = None) -> dict:
    """Write the state and what follows from it: the PCI tree of its topology (replacing the old one), p2p.json, the
    command line, /sys/class/iommu and the kernel's boot lines. Returns the state written."""
    bad = [f"{key} {state[key]!r} (one of {', '.join(choices)})" for key, choices in
           (("topology", TOPOLOGIES), ("acs", ACS_MODES), ("iommu", IOMMU_MODES), ("after_hang", AFTER_HANG))
           if state[key] not in choices]
    bad += [f"ACS of bridge {bdf} {mode!r} (one of {', '.join(ACS_MODES)})"
            for bdf, mode in state["acs_bridges"].items() if mode not in ACS_MODES]
    if bad:
        raise ValueError("unknown " + "; ".join(bad))
    parse_size(state["bar1"])
    if not bus_ids:  # the GPUs of the tree already there (a lab host's: nvidia-smi is not beside this file there)
        bus_ids = gpus_in_tree(read_tree(root)) if Path(root, "sys", "bus", "pci", "devices").is_dir() else None
    bus_ids = bus_ids or pci_tree.gpu_bus_ids()
    # Bridges with ACS: root ports (a chain of one) and switch downstream ports (below a switch's upstream port).
    with_acs = [chain[-1] for chain, ids, _, _ in pci_tree.layout(bus_ids, state["topology"])
                if ids[2].startswith("0x0604") and len(chain) in (1, 3)]
    unknown = [bdf for bdf in state["acs_bridges"] if bdf not in with_acs]
    if unknown:
        raise ValueError(f"no bridge with ACS at {', '.join(unknown)} in the {state['topology']} tree (its root ports "
                         f"and switch downstream ports: {', '.join(with_acs)})")
    pci_tree.write(root, bus_ids, state["topology"])
    tree = read_tree(root)
    Path(root, "p2p.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    Path(root, "cmdline").write_text(BOOT_IMAGE + IOMMU_CMDLINE[state["iommu"]] + "\n")
    iommu = Path(root, "sys", "class", "iommu")
    iommu.mkdir(parents=True, exist_ok=True)
    for entry in iommu.iterdir():
        entry.unlink()
    if state["iommu"] != "off":
        for name in ("ivhd0", "ivhd1"):
            (iommu / name).touch()
    gpus = [bdf for bdf, dev in tree.items() if dev["vendor"] == NVIDIA]
    Path(root, "kernel-boot.log").write_text("".join(line + "\n" for line in kernel_lines(state, gpus)))
    return state


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if not text or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"BAR1 size {text!r}: give it as lspci prints it, e.g. 128G or 256M")
    return int(text[:-1]) * units[text[-1]]


# --- the PCI tree -----------------------------------------------------------------------------------------------------


def read_tree(root: str | None = None) -> dict[str, dict]:
    """Every device of ROOT/sys/bus/pci/devices: its chain of addresses from its root port down (itself last), host
    bridge, NUMA node, ids, class, link, and for a bridge its bus range and the kind of ACS it has. Devices in bus
    order. When ROOT has no tree, the default topology's (as pci_tree lays it out for sim/gpu/nvidia-smi's GPUs)."""
    base = Path(root or root_dir(), "sys", "bus", "pci", "devices")
    devices: dict[str, dict] = {}
    if base.is_dir():
        for link in base.iterdir():
            target = link.resolve()
            parts = target.parts
            host = next(i for i, part in enumerate(parts) if part.startswith("pci") and ":" in part)
            info = {name: _read(target / name) for name in ("vendor", "device", "class", "current_link_speed",
                                                              "current_link_width", "max_link_speed", "max_link_width")}
            devices[link.name] = {"chain": list(parts[host + 1:]), "host_bridge": parts[host][3:], **info}
    else:
        try:  # the GPUs sim/gpu/nvidia-smi lists, read from it beside pci_tree.py (the repository's sim/gpu)
            bus_ids = pci_tree.gpu_bus_ids()
        except OSError:
            bus_ids = []
        for chain, (vendor, device, klass), speed, width in pci_tree.layout(bus_ids) if bus_ids else ():
            devices[chain[-1]] = {"chain": chain, "host_bridge": chain[0][:7], "vendor": vendor, "device": device,
                                  "class": klass, "current_link_speed": speed, "max_link_speed": speed,
                                  "current_link_width": str(width), "max_link_width": str(width)}
    for bdf, dev in devices.items():
        children = [d for d in devices.values() if d["chain"][:-1] == dev["chain"]]
        below = [d for d in devices.values() if d["chain"][:len(dev["chain"])] == dev["chain"] and d is not dev]
        dev["bdf"] = bdf
        dev["bus"] = int(bdf[5:7], 16)
        dev["numa"] = 0 if int(dev["host_bridge"].split(":")[1], 16) < 0x80 else 1
        dev["is_bridge"] = dev["class"].startswith("0x0604")
        dev["children"] = sorted(c["chain"][-1] for c in children)
        if dev["is_bridge"] and children:
            dev["secondary"] = min(int(c["chain"][-1][5:7], 16) for c in children)
            dev["subordinate"] = max(int(d["chain"][-1][5:7], 16) for d in below)
        elif dev["is_bridge"]:
            dev["secondary"] = dev["subordinate"] = None
        parent = devices.get(dev["chain"][-2]) if len(dev["chain"]) > 1 else None
        if not dev["is_bridge"]:
            dev["acs_kind"] = None
        elif parent is None:
            dev["acs_kind"] = "root_port"
        elif parent["class"].startswith("0x0604") and len(dev["chain"]) >= 3:
            dev["acs_kind"] = "downstream"  # a switch's downstream port: below the switch's upstream port
        else:
            dev["acs_kind"] = None  # a switch's upstream port has no ACS
    return dict(sorted(devices.items(), key=lambda kv: (kv[0][:4], kv[1]["bus"], kv[0])))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gpus_in_tree(tree: dict[str, dict]) -> list[str]:
    """The NVIDIA GPUs' addresses in bus order: nvidia-smi's index order."""
    return [bdf for bdf, dev in tree.items() if dev["vendor"] == NVIDIA and dev["class"].startswith("0x03")]


def acs_of(state: dict, tree: dict[str, dict], bdf: str) -> set[str] | None:
    """The ACSCtl bits set on a bridge, None when it has no ACS capability."""
    if not tree[bdf]["acs_kind"]:
        return None
    return set(ACS_SET[state["acs_bridges"].get(bdf, state["acs"])])


def link(tree: dict[str, dict], a: str, b: str) -> str:
    """nvidia-smi topo -m's link type between two devices, as NVML derives it from the tree: X itself; PIX below one
    PCIe switch (one bridge each side of their common bridge); PXB through several bridges without the host bridge;
    PHB under one host bridge; NODE under host bridges of one NUMA node; SYS across NUMA nodes."""
    if a == b:
        return "X"
    ca, cb = tree[a]["chain"], tree[b]["chain"]
    common = 0
    while common < min(len(ca), len(cb)) and ca[common] == cb[common]:
        common += 1
    if common:
        return "PIX" if len(ca) - common == 2 and len(cb) - common == 2 else "PXB"
    if tree[a]["host_bridge"] == tree[b]["host_bridge"]:
        return "PHB"
    return "NODE" if tree[a]["numa"] == tree[b]["numa"] else "SYS"


def path_bridges(tree: dict[str, dict], a: str, b: str) -> list[str]:
    """The bridges peer traffic between a and b passes: below their common bridge on each side, or every bridge of
    both chains when they share none (the traffic crosses the root complex)."""
    ca, cb = tree[a]["chain"], tree[b]["chain"]
    common = 0
    while common < min(len(ca), len(cb)) and ca[common] == cb[common]:
        common += 1
    return list(dict.fromkeys(ca[common:-1] + cb[common:-1]))


# --- what an all-reduce does ------------------------------------------------------------------------------------------


def p2p_level(env: dict) -> tuple[str | None, str]:
    """(the highest link NCCL uses P2P over, None when P2P is disabled; why)."""
    if str(env.get("NCCL_P2P_DISABLE", "")).strip() not in ("", "0"):
        return None, "NCCL_P2P_DISABLE=1"
    level = str(env.get("NCCL_P2P_LEVEL", "")).strip().upper()
    if not level:
        return DEFAULT_LEVEL, f"NCCL's default on an AMD host ({DEFAULT_LEVEL})"
    if level.isdigit():
        level = LEGACY_LEVELS.get(level, "SYS")
    if level not in LEVELS:
        return DEFAULT_LEVEL, f"NCCL_P2P_LEVEL={level} is no level NCCL knows; its default"
    return level, f"NCCL_P2P_LEVEL={level}"


def plan(gpus: list[int], env: dict, root: str | None = None) -> dict:
    """What NCCL's all-reduce over these GPUs (nvidia-smi indices) does on this host: each pair's link and transport
    (P2P where the link is within the P2P level, else SHM), whether it hangs (a P2P pair whose path has a bridge with
    ReqRedir or CmpltRedir while the IOMMU translates: the state of the public hangs, FACTS §16), and its bus
    bandwidth (the slowest pair's figure)."""
    state = read_state(root)
    tree = read_tree(root)
    addresses = gpus_in_tree(tree)
    level, why = p2p_level(env)
    pairs = []
    for i, ga in enumerate(gpus):
        for gb in gpus[i + 1:]:
            a, b = addresses[ga], addresses[gb]
            kind = link(tree, a, b)
            p2p = level is not None and LEVELS[kind] <= LEVELS[level]
            redirect = [br for br in path_bridges(tree, a, b)
                        if (acs_of(state, tree, br) or set()) & {"ReqRedir", "CmpltRedir"}]
            hangs = p2p and bool(redirect) and state["iommu"] == "translated"
            if not p2p:
                busbw = SHM_BUSBW
            elif redirect and kind in ("PIX", "PXB"):
                busbw = REDIRECTED_BUSBW  # redirected up through the switch's shared uplink
            else:
                busbw = P2P_BUSBW[kind]
            pairs.append({"a": ga, "b": gb, "link": kind, "transport": "P2P" if p2p else "SHM",
                          "redirect_bridges": redirect, "hangs": hangs, "busbw_gbps": busbw})
    hanging = [p for p in pairs if p["hangs"]]
    return {"gpus": list(gpus), "level": level, "level_why": why, "iommu": state["iommu"], "pairs": pairs,
            "hangs": bool(hanging), "hanging_pairs": [(p["a"], p["b"]) for p in hanging],
            "busbw_gbps": min((p["busbw_gbps"] for p in pairs), default=None),
            "transport": "P2P" if pairs and all(p["transport"] == "P2P" for p in pairs) else
            "SHM" if pairs and all(p["transport"] == "SHM" for p in pairs) else "mixed",
            "after_hang": state["after_hang"]}


# --- the GPUs a hang left stuck ---------------------------------------------------------------------------------------


def stuck_gpus(run: str | None = None) -> dict[int, str]:
    """GPU index -> "busy" or "unresponsive", for the GPUs a hung P2P all-reduce left stuck this boot."""
    try:
        with open(Path(run or run_dir(), "p2p-stuck.json"), encoding="utf-8") as fh:
            data = json.load(fh)
        return {int(g): str(data["mode"]) for g in data["gpus"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def mark_stuck(gpus: list[int], mode: str, run: str | None = None) -> None:
    """What the real GPUs do when the all-reduce hangs: they keep spinning (or stop answering) after its processes are
    killed, until the host reboots (FACTS §16; rtx6kpro#15)."""
    directory = Path(run or run_dir())
    directory.mkdir(parents=True, exist_ok=True)
    known = stuck_gpus(str(directory))
    known.update(dict.fromkeys(gpus, mode))
    # one partial file per writer: the stand-in backend's ranks are threads of one process, and two of them hang at
    # once (a shared partial file was renamed away under the second, which failed its rank: CI17, make check)
    partial = directory / f"p2p-stuck.json.{os.getpid()}.{threading.get_ident()}"
    partial.write_text(json.dumps({"gpus": sorted(known), "mode": mode}) + "\n")
    partial.replace(directory / "p2p-stuck.json")


# --- lspci ----------------------------------------------------------------------------------------------------------

NAMES = {  # vendor:device -> the name lspci prints (an ID its pci.ids lacks prints as "Device XXXX", as it does)
    ("0x10de", "0x2bb5"): ("3D controller", "NVIDIA Corporation Device 2bb5 (rev a1)"),
    ("0x1000", "0xc030"): ("PCI bridge", "Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)"),
    ("0x1022", "0x14ab"): ("PCI bridge", "Advanced Micro Devices, Inc. [AMD] Device 14ab"),
    ("0x144d", "0xa80c"): ("Non-Volatile memory controller", "Samsung Electronics Co Ltd Device a80c"),
    ("0x15b3", "0x1021"): ("Ethernet controller", "Mellanox Technologies MT2910 Family [ConnectX-7]"),
}
DRIVERS = {"0x10de": "nvidia", "0x144d": "nvme", "0x15b3": "mlx5_core"}


def _short(bdf: str) -> str:
    """lspci leaves out domain 0000 when every device is in it."""
    return bdf[5:] if bdf.startswith("0000:") else bdf


def _name(dev: dict) -> tuple[str, str]:
    return NAMES.get((dev["vendor"], dev["device"]), ("Unclassified device", f"Device {dev['device'][2:]}"))


def _speed(text: str) -> str:
    return text.split(" ")[0].replace(".0", "") + "GT/s" if text else "Unknown"


def lspci_vvv(root: str | None = None, as_root: bool = True) -> str:
    """`lspci -vvv` of the tree, in lspci's layout (tab-indented; capability blocks and ACS lines only for root, as
    lspci prints "<access denied>" otherwise)."""
    state = read_state(root)
    tree = read_tree(root)
    iommu_on = state["iommu"] != "off"
    bar1 = state["bar1"]
    out = []
    for group, (bdf, dev) in enumerate(tree.items()):
        klass, name = _name(dev)
        suffix = " (prog-if 00 [Normal decode])" if dev["is_bridge"] else ""
        out.append(f"{_short(bdf)} {klass}: {name}{suffix}")
        if dev["vendor"] == NVIDIA:
            out.append("\tSubsystem: NVIDIA Corporation Device 204e")
        out.append("\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B- "
                   "DisINTx+")
        out.append("\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- "
                   "INTx-")
        out.append("\tLatency: 0, Cache Line Size: 64 bytes" if dev["is_bridge"] else "\tLatency: 0")
        out.append(f"\tInterrupt: pin {'?' if dev['is_bridge'] else 'A'} routed to IRQ {40 + group}")
        out.append(f"\tNUMA node: {dev['numa']}")
        if iommu_on:
            out.append(f"\tIOMMU group: {group}")
        if dev["is_bridge"] and dev["secondary"] is not None:
            out.append(f"\tBus: primary={dev['bus']:02x}, secondary={dev['secondary']:02x}, "
                       f"subordinate={dev['subordinate']:02x}, sec-latency=0")
        if dev["vendor"] == NVIDIA:
            base = 0x18000000000 + group * (1 << 38)
            out += [f"\tRegion 0: Memory at {0xf0000000 + group * (1 << 26):x} (32-bit, non-prefetchable) [size=64M]",
                    f"\tRegion 1: Memory at {base:x} (64-bit, prefetchable) [size={bar1}]",
                    f"\tRegion 3: Memory at {base + parse_size(bar1):x} (64-bit, prefetchable) [size=32M]"]
        if not as_root:
            out.append("\tCapabilities: <access denied>")
        else:
            port = {"root_port": "Root Port (Slot+)", "downstream": "Downstream Port (Slot+)"}.get(
                dev["acs_kind"] or "", "Upstream Port" if dev["is_bridge"] else "Endpoint")
            out.append(f"\tCapabilities: [68] Express (v2) {port}, IntMsgNum 0")
            out.append(f"\t\tLnkCap:\tPort #0, Speed {_speed(dev['max_link_speed'])}, Width x{dev['max_link_width']}, "
                       "ASPM L1, Exit Latency L1 <64us")
            slower = dev["current_link_speed"] != dev["max_link_speed"] or \
                dev["current_link_width"] != dev["max_link_width"]
            out.append(f"\t\tLnkSta:\tSpeed {_speed(dev['current_link_speed'])}"
                       f"{' (downgraded)' if slower else ''}, Width x{dev['current_link_width']}")
            acs = acs_of(state, tree, bdf)
            if acs is not None:
                ctl = " ".join(f"{flag}{'+' if flag in acs else '-'}" for flag in ACS_FLAGS)
                out += ["\tCapabilities: [2a0 v1] Access Control Services",
                        f"\t\tACSCap:\t{ACS_CAP[dev['acs_kind']]}", f"\t\tACSCtl:\t{ctl}"]
        driver = "pcieport" if dev["is_bridge"] else DRIVERS.get(dev["vendor"])
        if driver:
            out.append(f"\tKernel driver in use: {driver}")
        out.append("")
    return "\n".join(out) + "\n"


def lspci_tree(root: str | None = None, verbose: bool = True) -> str:
    """`lspci -t` (`-tv` with names) as pciutils' ls-tree.c draws it: each root bus as -+-[dddd:bb]-, bridges as
    dd.f-[sec-sub]-, one child as ----, several as +- / \\-, and the line's drawn part turned into | and blanks for
    the lines after (print_it)."""
    tree = read_tree(root)
    roots: dict[str, list[str]] = {}
    for bdf, dev in tree.items():
        if len(dev["chain"]) == 1:
            roots.setdefault(dev["host_bridge"], []).append(bdf)
    lines: list[str] = []
    line = [""]

    def emit(text: str) -> None:
        lines.append(text)
        line[0] = "".join("|" if ch in "+|" else " " for ch in text)

    def show_dev(bdf: str, prefix: str) -> None:
        dev = tree[bdf]
        text = prefix + bdf[8:]
        if dev["is_bridge"]:
            if dev["secondary"] is None:
                emit(text)
                return
            sec, sub = dev["secondary"], dev["subordinate"]
            text += f"-[{sec:02x}]-" if sec == sub else f"-[{sec:02x}-{sub:02x}]-"
            show_bus(dev["children"], text + "-")
            return
        if verbose:
            text += "  " + _name(dev)[1].split(" (rev")[0]
        emit(text)

    def show_bus(children: list[str], prefix: str) -> None:
        if not children:
            emit(prefix)
            return
        if len(children) == 1:
            show_dev(children[0], prefix + "--")
            return
        for child in children[:-1]:
            show_dev(child, prefix + "+-")
            prefix = line[0][:len(prefix)]
        show_dev(children[-1], prefix + "\\-")

    hosts = sorted(roots)
    if len(hosts) == 1:
        show_bus(roots[hosts[0]], f"-[{hosts[0]}]-")
    else:
        prefix = "-"
        for host in hosts[:-1]:
            show_bus(sorted(roots[host]), prefix + f"+-[{host}]-")
            prefix = line[0][:len(prefix)]
        show_bus(sorted(roots[hosts[-1]]), prefix + f"\\-[{hosts[-1]}]-")
    return "\n".join(lines) + "\n"


# --- the lab's command line -------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pcie_sim.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    set_p = sub.add_parser("set", help="change the host's P2P state (what is not given stays as it is)")
    set_p.add_argument("root")
    set_p.add_argument("--topology", choices=TOPOLOGIES)
    set_p.add_argument("--acs", choices=ACS_MODES, help="every bridge with ACS (root ports, switch downstream ports)")
    set_p.add_argument("--acs-bridge", action="append", default=[], metavar="BDF=MODE",
                       help="one bridge's ACS, e.g. 0000:11:00.0=redirect (over --acs); BDF=default drops it")
    set_p.add_argument("--iommu", choices=IOMMU_MODES)
    set_p.add_argument("--bar1", help="the GPUs' BAR1 size as lspci prints it (128G; 256M: Resizable BAR off)")
    set_p.add_argument("--after-hang", choices=AFTER_HANG, help="what a hung P2P all-reduce leaves behind")
    set_p.add_argument("--reset", action="store_true", help="start from the healthy default")
    set_p.add_argument("--bus-ids", help="the GPUs' pci.bus_id, comma-separated (default: nvidia-smi's)")
    show_p = sub.add_parser("show")
    show_p.add_argument("root")
    args = parser.parse_args(argv)
    if args.cmd == "show":
        state = read_state(args.root)
        tree = read_tree(args.root)
        everything = list(range(len(gpus_in_tree(tree))))
        print(json.dumps({"state": state, "p2p": plan(everything, {"NCCL_P2P_LEVEL": "SYS"}, args.root),
                          "shm": plan(everything, {"NCCL_P2P_DISABLE": "1"}, args.root)}, indent=1))
        return 0
    state = json.loads(json.dumps(DEFAULT_STATE)) if args.reset else read_state(args.root)
    for key in ("topology", "acs", "iommu", "bar1", "after_hang"):
        if getattr(args, key) is not None:
            state[key] = getattr(args, key)
    if args.topology is not None and not args.acs_bridge:
        state["acs_bridges"] = {}  # another tree's bridges
    for item in args.acs_bridge:
        bdf, _, mode = item.partition("=")
        if not mode:
            parser.error(f"--acs-bridge {item!r}: give BDF=MODE, e.g. 0000:11:00.0=redirect")
        bdf = bdf.lower() if bdf.count(":") == 2 else f"0000:{bdf.lower()}"
        if mode == "default":
            state["acs_bridges"].pop(bdf, None)
        else:
            state["acs_bridges"][bdf] = mode
    try:
        write_state(args.root, state, args.bus_ids.split(",") if args.bus_ids else None)
    except ValueError as exc:
        print(f"pcie_sim.py: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(state, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
