"""What a serving host's journal says about its GPUs, PCIe links and SGLang while it serves: the fault watcher's
(roles/fault_watch, files/moefleet-fault-watch) event table, also read by `moefleet diagnose` for a kernel journal
excerpt and by the status and remediation plays for the host's health facts.

Pure standard library, no I/O. Sources (docs/healing.md has the table with links): NVIDIA's "Xid Errors" catalog
(docs.nvidia.com/deploy/xid-errors), the kernel's PCIe AER and pciehp messages, SGLang 0.5.10's health check
(entrypoints/http_server.py: /health sends a one-token request and answers 503 when no output arrives within
SGLANG_HEALTH_CHECK_TIMEOUT, 20 s) and PyTorch's NCCL watchdog.

An event is a dict: ``kind`` (xid, fell_off_bus, pcie_fatal, link_down, nccl_timeout, hang), ``code`` (the Xid, or
null), ``pci`` (the device's PCI address as the kernel wrote it, or null), ``meaning``, ``unfit`` (the host's GPUs
are not trustworthy until it reboots: it is taken out of the routers and SGLang is stopped) and ``advice``.

Public API:

    XID: {code: (meaning, unfit, advice)}
    classify_kernel(message) -> dict | None      one kernel message (journal MESSAGE, without its prefix)
    classify_service(message) -> dict | None     one line of sglang.service's output
    hang_event(seconds, health_url) -> dict      the serving process made no progress for that long
    scan(text) -> list[dict]                     every event in a pasted journal excerpt (any journalctl format)
    is_kernel_log(text) -> bool                  the text is a kernel log (journalctl -k, dmesg, syslog's kernel lines)
    KernelLines().feed(message) -> str           a message with the driver's earlier lines of the same record joined
    is_progress(message) -> bool                 a line of sglang.service that shows its scheduler working
    serving_devices(gpus) -> set[str]            the GPUs' PCI addresses and the bridges above them (the baseline's)
    concerns_serving(event, devices) -> bool     a PCIe event of one of those devices (others are recorded only)
    same_fault(earlier, event) -> bool           the event repeats one of `earlier` (the driver's second line)
    reason(event, gpus=None) -> str              "gpu 3: Xid 79 GPU has fallen off the bus"
    gpu_index(pci, gpus) -> int | None           the nvidia-smi index of a kernel PCI address
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

REBOOT = "Reboot the host (moefleet remediate); if it returns, the GPU or its slot, riser or power needs service."
RESTART = "SGLang restarts by itself; repeated, it points at the model's kernels or the driver."
RECORD = "Recorded only; watch for more."

# Xid: NVIDIA's meaning (the Xid Catalog, docs.nvidia.com/deploy/xid-errors), whether the host is unfit to serve
# until it reboots, and what to do. The catalog's RESTART_APP and IGNORE codes end at most the SGLang process that hit
# them (systemd restarts it): recorded. Its RESET_GPU, RESTART_BM, WORKFLOW_XID_48 and NVLink codes make the host
# unfit: a GPU reset needs every process off the GPU, and with eight GPUs serving one model a reboot is what moefleet
# does. Xid 8
# is RESTART_APP in the catalog, but on Blackwell it comes with GSP watchdog timeouts that only a reboot clears
# (NVIDIA/open-gpu-kernel-modules#1159, #1111): unfit here.
XID: dict[int, tuple[str, bool, str]] = {
    8: ("GPU stopped processing (on Blackwell often with GSP watchdog timeouts)", True, REBOOT),
    13: ("Graphics engine exception (usually an application error)", False, RESTART),
    31: ("GPU memory page fault (usually an application error)", False, RESTART),
    32: ("Invalid or corrupted push buffer stream (often PCIe quality)", False, RESTART),
    43: ("GPU stopped processing: the application hit a fault; the GPU stays healthy", False, RECORD),
    45: ("Preemptive cleanup after an earlier error", False, RECORD),
    48: ("Double-bit ECC error", True, REBOOT),
    61: ("Internal micro-controller breakpoint or warning", False, RECORD),
    62: ("Internal micro-controller halt", True, REBOOT),
    63: ("GPU memory remapping event", False, RECORD),
    64: ("GPU memory remapping failure", True, REBOOT),
    68: ("NVDEC0 exception", False, RESTART),
    69: ("Graphics engine class error", False, RESTART),
    74: ("NVLink error", True, REBOOT),
    79: ("GPU has fallen off the bus", True, REBOOT),
    92: ("High single-bit ECC error rate", False, RECORD),
    94: ("Contained memory error (the application that hit it ends)", False, RESTART),
    95: ("Uncontained memory error", True, REBOOT),
    109: ("Context switch timeout", True, REBOOT),
    119: ("GSP RPC timeout", True, REBOOT),
    120: ("GSP error", True, REBOOT),
    140: ("Unrecovered ECC error", True, REBOOT),
    143: ("GPU initialization error", True, REBOOT),
    154: ("GPU recovery action changed", False, RECORD),  # unfit when the new action is not "None" (_RECOVERY)
}

# Xid 154's text (the driver's gpu.c): "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
_RECOVERY = re.compile(r"recovery action changed from .* to (?P<value>0x[0-9a-fA-F]+) \((?P<name>[^)]*)\)")
# NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)(?:, (?P<rest>.*))?")
# NVRM: GPU 0000:41:00.0: GPU has fallen off the bus.   /   NVRM: The NVIDIA GPU 0000:41:00.0 ... fallen off the bus
_BDF_TEXT = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
_OFF_BUS = re.compile(r"NVRM: .*?(?P<pci>" + _BDF_TEXT + r").*fallen off the bus", re.S)
# pcieport 0000:40:01.1: AER: Uncorrectable (Fatal) error message received from 0000:41:00.0
# pcieport 0000:40:01.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)
_AER_FATAL = re.compile(r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Fatal\)|severity=Uncorrect(?:ed|able) \(Fatal\)")
_BDF = re.compile(r"\b(?P<pci>" + _BDF_TEXT + r")\b")
# pcieport 0000:40:01.1: pciehp: Slot(1): Link Down   /   ... Surprise Down Error
_LINK_DOWN = re.compile(r"pciehp.*slot\(.*\): Link Down|Surprise (?:Link )?Down", re.IGNORECASE)
# PyTorch's NCCL watchdog: "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=...,
# OpType=ALLREDUCE, ...) ran for 600005 milliseconds before timing out."
_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: (?P<work>WorkNCCL\([^)]*\))?")


def _event(kind: str, meaning: str, unfit: bool, advice: str, code: int | None = None,
           pci: str | None = None, message: str = "") -> dict[str, Any]:
    return {"kind": kind, "code": code, "pci": pci, "meaning": meaning, "unfit": unfit, "advice": advice,
            "message": message[:400]}


def classify_kernel(message: str) -> dict[str, Any] | None:
    """The event one kernel message stands for, or None."""
    text = message.strip()
    match = _XID.search(text)
    if match:
        code = int(match.group("code"))
        meaning, unfit, advice = XID.get(code, (f"Xid {code} (not in moefleet's table)", False, RECORD))
        recovery = _RECOVERY.search(text) if code == 154 else None
        if recovery and recovery.group("name").strip().lower() != "none":
            meaning, unfit, advice = f"the driver asks for: {recovery.group('name')}", True, REBOOT
        return _event("xid", meaning, unfit, advice, code, match.group("pci"), text)
    match = _OFF_BUS.search(text)
    if match:
        return _event("fell_off_bus", "GPU has fallen off the bus", True, REBOOT, 79, match.group("pci"), text)
    if _AER_FATAL.search(text):
        found = _BDF.findall(text)
        return _event("pcie_fatal", "Uncorrectable (fatal) PCIe error", True,
                      "Reboot the host (moefleet remediate); a fatal PCIe error that returns needs the slot, riser or "
                      "GPU serviced.", None, found[-1] if found else None, text)
    if _LINK_DOWN.search(text):
        found = _BDF.findall(text)
        return _event("link_down", "PCIe link down (surprise link down)", True, REBOOT, None,
                      found[0] if found else None, text)
    return None


def classify_service(message: str) -> dict[str, Any] | None:
    """The event one line of the serving unit's output stands for, or None (the exit hook and the readiness check
    judge the rest of it with sglang_log)."""
    match = _NCCL_TIMEOUT.search(message)
    if match:
        return _event("nccl_timeout", "A collective operation hung (NCCL watchdog timeout)", True,
                      "Reboot the host (moefleet remediate). Hangs that return point at P2P through the IOMMU "
                      "(ACS on the PCIe switches): see docs/healing.md.", None, None, message.strip())
    return None


def hang_event(seconds: float, health_url: str) -> dict[str, Any]:
    """The serving process stopped making progress: its /health (one token; 503 when no output arrives in SGLang's
    20 s) failed for `seconds` while the unit was active and had served."""
    return _event("hang", f"SGLang made no progress for {seconds:.0f} s (its /health got no token)", True,
                  "Reboot the host (moefleet remediate). Hangs that return point at NCCL and P2P through the IOMMU "
                  "(ACS on the PCIe switches): see docs/healing.md.", None, None, f"GET {health_url} failed")


# journalctl's short formats: "Dec 02 13:58:45 host kernel: MESSAGE", short-iso, short-precise, syslog files without
# the host ("Mar 29 15:38:59 kernel: MESSAGE": a hostname has no colon, so "kernel:" is never taken for one), and
# dmesg's "[12345.678901] MESSAGE"; -o cat has the message alone.
_PREFIX = re.compile(
    r"^(?:(?:\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT[\d:.,+-]+Z?) (?:[^\s:]+ )?"
    r"(?P<ident>[^\s:\[]+)(?:\[\d+\])?: )?"
    r"(?:\[\s*\d+\.\d+\] )?")
# dmesg with -T: "[Sun Mar 29 15:38:59 2026] MESSAGE"
_DMESG_TIME = re.compile(r"^\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ")
# What only a kernel log has: the kernel's identifier, dmesg's uptime stamp, the NVIDIA driver's or PCIe's own lines.
_KERNEL_LINE = re.compile(r"^(?:\S.* )?kernel: |^\[\s*\d+\.\d+\] |^\[\w{3} \w{3} [ \d]\d [\d:]{8} \d{4}\] |"
                          r"^NVRM: |^(?:pcieport|nvidia|nvme) [0-9a-f]{4}:")


class KernelLines:
    """Joins the NVIDIA driver's record that dmesg and the journal print as three lines:

        NVRM: The NVIDIA GPU 0000:b3:00.0
        NVRM: (PCI ID: 10de:2bb5) installed in this system has
        NVRM: fallen off the bus and is not responding to commands.

    feed() returns the message to classify: the last line with the two before it, or the message itself."""

    def __init__(self) -> None:
        self._recent: list[str] = []

    def feed(self, message: str) -> str:
        text = message.strip()
        out = text
        if re.match(r"NVRM:\s+fallen off the bus", text):
            out = "\n".join([*self._recent[-2:], text])
        self._recent = ([*self._recent, text] if text.startswith("NVRM:") else [])[-2:]
        return out


def _body(raw: str) -> str:
    import json  # noqa: PLC0415  (only for -o json lines)

    line = raw.strip()
    if line.startswith("{"):
        with contextlib.suppress(ValueError, AttributeError):
            line = str(json.loads(line).get("MESSAGE") or "")
    line = _DMESG_TIME.sub("", line, count=1)
    return _PREFIX.sub("", line, count=1)


def scan(text: str) -> list[dict[str, Any]]:
    """Every event in a journal excerpt: kernel messages (a line of `journalctl -k`, dmesg, a syslog file, or a
    MESSAGE of `journalctl -o json`) and the serving unit's output."""
    events = []
    joined = KernelLines()
    for raw in text.splitlines():
        body = joined.feed(_body(raw))
        event = classify_kernel(body) or classify_service(body)
        if event and not same_fault(events, event):
            events.append(event)
    return events


def is_kernel_log(text: str) -> bool:
    """Most of the text's non-empty lines are kernel lines (a healthy dmesg or `journalctl -k` excerpt)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kernel = sum(1 for line in lines if _KERNEL_LINE.search(line))
    return bool(lines) and kernel * 2 >= len(lines)


# SGLang's scheduler prints one line per prefill batch (each chunk of a chunked prefill) and one per
# --decode-log-interval decode batches (observability/scheduler_metrics_mixin.py): "Prefill batch, #new-seq: 1,
# #new-token: 8192, ..." and "Decode batch, #running-req: 3, ...". While they come, the scheduler makes progress,
# whatever /health says (it is 503 while one batch outlasts SGLANG_HEALTH_CHECK_TIMEOUT: a slow prefill chunk, or a
# long prompt with chunked prefill off; a busy scheduler answers a health check after its next batch).
_PROGRESS = re.compile(r"\b(?:Prefill|Decode) batch[.,]? #(?:new-seq|running-req)")


def is_progress(message: str) -> bool:
    return bool(_PROGRESS.search(message))


def serving_devices(gpus: Sequence[Mapping[str, Any]] | None) -> set[str]:
    """The PCI devices serving depends on: each GPU of the baseline and the bridges above it (its "upstream",
    resolved from sysfs when the baseline was taken), as bus:device.function without the domain."""
    out: set[str] = set()
    for gpu in gpus or []:
        for pci in [gpu.get("pci_bus_id"), *(gpu.get("upstream") or [])]:
            norm = _norm_bdf(pci)
            if norm:
                out.add(norm)
    return out


def concerns_serving(event: Mapping[str, Any], devices: set[str]) -> bool:
    """A PCIe event (fatal AER, link down) concerns serving when the device it names is a GPU or a bridge above one.
    Other devices' events (an NVMe bay hot-swapped, a NIC's link) are recorded, never acted on; so is an event that
    names no device, or any PCIe event when the GPUs' addresses are unknown (no baseline)."""
    if event.get("kind") not in ("pcie_fatal", "link_down"):
        return True
    norm = _norm_bdf(event.get("pci"))
    return bool(norm and norm in devices)


def _norm_bdf(pci: Any) -> str | None:
    """00000000:41:00.0 / 0000:41:00.0 / 41:00.0 -> 41:00.0 (lower case); None when it is not an address."""
    match = re.search(r"([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$", str(pci or "").strip())
    return match.group(1).lower() if match else None


def same_fault(earlier: Sequence[Mapping[str, Any]], event: Mapping[str, Any]) -> bool:
    """The driver writes "GPU has fallen off the bus" twice (the Xid 79 line, then its own line): the second is the
    same fault of the same GPU, not a new event."""
    if event.get("kind") != "fell_off_bus":
        return False
    want = _norm_pci(event.get("pci"))
    return any(e.get("code") == 79 and _norm_pci(e.get("pci")) == want for e in list(earlier)[-5:])


def _norm_pci(pci: str | None) -> str | None:
    """0000:41:00 / 0000:41:00.0 / 00000000:41:00.0 -> 41:00 (bus:device, lower case)."""
    if not pci:
        return None
    parts = pci.lower().split(":")
    if len(parts) < 2:
        return None
    return f"{parts[-2]}:{parts[-1].split('.')[0]}"


def gpu_index(pci: str | None, gpus: Sequence[Mapping[str, Any]] | None) -> int | None:
    """The index nvidia-smi gives the GPU at `pci` (gpus: [{"index", "pci_bus_id"}] as the watcher read them while
    the GPUs answered), or None."""
    want = _norm_pci(pci)
    for gpu in gpus or []:
        if want is not None and _norm_pci(str(gpu.get("pci_bus_id") or "")) == want:
            try:
                return int(gpu["index"])
            except (KeyError, TypeError, ValueError):
                return None
    return None


def reason(event: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] | None = None) -> str:
    """One phrase for `moefleet status`: "gpu 3: Xid 79 GPU has fallen off the bus"."""
    index = event.get("gpu")
    if index is None:
        index = gpu_index(event.get("pci"), gpus)
    where = f"gpu {index}" if index is not None else (f"PCI {event['pci']}" if event.get("pci") else "")
    what = f"Xid {event['code']} {event['meaning']}" if event.get("kind") == "xid" else str(event.get("meaning"))
    return f"{where}: {what}" if where else what
