"""The fault watcher's event table (plugins/module_utils/host_faults.py): real drivers' and kernels' lines, as public
logs quote them, classified into the events that take a host out (or are only recorded)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import host_faults as hf

GPUS = [{"index": "0", "pci_bus_id": "00000000:01:00.0"}, {"index": "3", "pci_bus_id": "00000000:61:00.0"}]


@pytest.mark.parametrize(("line", "kind", "code", "unfit"), [
    ("NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", "xid", 79, True),
    ("NVRM: Xid (PCI:0000:01:00): 119, pid=2713, name=python3, Timeout after 6s of waiting for RPC response from "
     "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).", "xid", 119, True),
    ("NVRM: Xid (PCI:0000:01:00): 8, pid=3311, name=sglang::schedu, Channel 00000010", "xid", 8, True),
    ("NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=python3, An uncorrectable double bit error (DBE) has been "
     "detected on GPU in the framebuffer at partition 6, subpartition 0.", "xid", 48, True),
    ("NVRM: Xid (PCI:0000:01:00): 13, pid=9, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
     "Out Of Range Address", "xid", 13, False),
    ("NVRM: Xid (PCI:0000:01:00): 31, pid=9, name=python3, Ch 0000000a, intr 10000000. MMU Fault: ENGINE GRAPHICS "
     "GPCCLIENT_T1_0 faulted @ 0x7f_e6a00000. Fault is of type FAULT_PDE ACCESS_TYPE_READ", "xid", 31, False),
    ("NVRM: Xid (PCI:0000:01:00): 63, pid=1, name=python3, Row Remapper: New row marked for remapping", "xid", 63,
     False),
    ("NVRM: Xid (PCI:0000:01:00): 999, pid=1, name=python3, something new", "xid", 999, False),
    ("NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.", "fell_off_bus", 79, True),
    ("pcieport 0000:60:01.1: AER: Uncorrectable (Fatal) error message received from 0000:61:00.0", "pcie_fatal",
     None, True),
    ("pcieport 0000:60:01.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
     "pcie_fatal", None, True),
    ("pcieport 0000:60:01.1: pciehp: Slot(3): Link Down", "link_down", None, True),
    # as public logs quote them (docs/healing.md): no pid, pid=0, older kernels' wording
    ("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", "xid", 79, True),
    ("NVRM: Xid (PCI:0000:09:00): 79, pid=0, GPU has fallen off the bus.", "xid", 79, True),
    ("pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010", "pcie_fatal", None, True),
    ("pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)", "link_down", None, True),
    ("pciehp 0000:02:05.0:pcie24: slot(6): Link Down event", "link_down", None, True),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     "xid", 154, True),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
     "xid", 154, False),
])
def test_kernel_lines(line, kind, code, unfit):
    event = hf.classify_kernel(line)
    assert event is not None, line
    assert (event["kind"], event["code"], event["unfit"]) == (kind, code, unfit)
    assert event["advice"] and event["meaning"]


@pytest.mark.parametrize("line", [
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05",
    "pcieport 0000:60:01.1: AER: Corrected error message received from 0000:61:00.0",
    "pcieport 0000:60:01.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "nvidia 0000:61:00.0: enabling device (0000 -> 0003)",
    "NVRM: GPU at PCI:0000:01:00: GPU-5a3e2c1b-0d4f-4a1e-9c2b-7e6f5d4c3b2a",
    "NVRM: GPU Board Serial Number: 1790025000003",
])
def test_kernel_lines_that_are_no_fault(line):
    assert hf.classify_kernel(line) is None


def test_service_lines():
    timeout = ("[rank3]:[E1202 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=5123, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, "
               "Timeout(ms)=600000) ran for 600005 milliseconds before timing out.")
    event = hf.classify_service(timeout)
    assert event and event["kind"] == "nccl_timeout" and event["unfit"]
    access = "[2026-12-02 10:00:00] INFO:     10.0.0.5:3 - \"POST /generate HTTP/1.1\" 200 OK"
    assert hf.classify_service(access) is None


def test_reason_names_the_gpu_by_its_index():
    event = hf.classify_kernel("NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                               "the bus.")
    assert hf.gpu_index(event["pci"], GPUS) == 3
    assert hf.reason(event, GPUS) == "gpu 3: Xid 79 GPU has fallen off the bus"
    unknown = dict(event, pci="0000:99:00")
    assert hf.reason(unknown, GPUS) == "PCI 0000:99:00: Xid 79 GPU has fallen off the bus"
    hang = hf.hang_event(61, "http://127.0.0.1:30000/health")
    assert hf.reason(hang).startswith("SGLang made no progress for 61 s")


def test_the_drivers_second_fell_off_the_bus_line_is_the_same_fault():
    xid = hf.classify_kernel("NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                             "the bus.")
    second = hf.classify_kernel("NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.")
    other_gpu = hf.classify_kernel("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")
    assert hf.same_fault([xid], second)
    assert not hf.same_fault([xid], other_gpu)
    assert not hf.same_fault([], second)
    assert not hf.same_fault([xid], xid)  # a new Xid is a new event


def test_scan_reads_journal_excerpts_in_any_format():
    short = ("Dec 02 10:00:01 gpu-7 kernel: NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has "
             "fallen off the bus.\n"
             "Dec 02 10:00:01 gpu-7 kernel: NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.\n"
             "Dec 02 10:00:02 gpu-7 systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL\n")
    dmesg = "[123456.789012] NVRM: Xid (PCI:0000:01:00): 119, pid=1, name=python3, Timeout after 6s of waiting\n"
    as_json = json.dumps({"MESSAGE": "NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=python3, DBE", "_TRANSPORT":
                          "kernel"}) + "\n"
    assert [e["kind"] for e in hf.scan(short)] == ["xid"]  # the driver's second line is the same fault
    assert [e["code"] for e in hf.scan(dmesg)] == [119]
    assert [e["code"] for e in hf.scan(as_json)] == [48]
    assert hf.scan("nothing here\n") == []


# -- the shapes real pastes have (syslog without a hostname, dmesg's three-line record) -----------------------------

def test_a_syslog_line_without_a_hostname_is_read():
    (event,) = hf.scan("Mar 29 15:38:59 kernel: NVRM: Xid (PCI:0000:b3:00): 79, pid='<unknown>', name=<unknown>, "
                       "GPU has fallen off the bus.\n")
    assert (event["kind"], event["code"], event["pci"]) == ("xid", 79, "0000:b3:00")
    # the identifier is not taken for a hostname, nor NVRM for the identifier
    assert hf.scan("Mar 29 15:38:59 kernel: NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.")[0]["kind"] == \
        "fell_off_bus"


THREE_LINES = ("NVRM: The NVIDIA GPU 0000:b3:00.0\n"
               "NVRM: (PCI ID: 10de:2bb5) installed in this system has\n"
               "NVRM: fallen off the bus and is not responding to commands.\n")


@pytest.mark.parametrize("prefix", ["", "[ 5012.332811] ", "[Sun Mar 29 15:38:59 2026] ", "Mar 29 15:38:59 kernel: ",
                                    "Mar 29 15:38:59 gpu-7 kernel: "])
def test_the_drivers_three_line_fallen_off_the_bus_record_is_one_event(prefix):
    text = "".join(prefix + line + "\n" for line in THREE_LINES.splitlines())
    (event,) = hf.scan(text)
    assert (event["kind"], event["pci"], event["unfit"]) == ("fell_off_bus", "0000:b3:00.0", True)
    # the last line alone names no GPU: not an event by itself
    assert hf.scan(prefix + "NVRM: fallen off the bus and is not responding to commands.\n") == []
    # after the Xid 79 of the same GPU it is that fault, not a second one
    xid = prefix + "NVRM: Xid (PCI:0000:b3:00): 79, pid=0, GPU has fallen off the bus.\n"
    assert [e["code"] for e in hf.scan(xid + text)] == [79]


def test_the_joiner_keeps_unrelated_lines_apart():
    lines = hf.KernelLines()
    # an Xid 79 line after another Xid is classified alone (its address has no function: not the three-line record)
    lines.feed("NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=python3, Graphics SM Warp Exception")
    xid = "NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert lines.feed(xid) == xid
    assert lines.feed("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04") == \
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04"
    assert lines.feed("usb 1-1: new high-speed USB device") == "usb 1-1: new high-speed USB device"
    # the chain was broken by a line of another driver: nothing to join
    assert lines.feed("NVRM: fallen off the bus and is not responding to commands.") == \
        "NVRM: fallen off the bus and is not responding to commands."


# A healthy kernel log of a real GPU host (NVIDIA H200, driver 580.159.04, 2026-12-04): NVRM lines, no Xid.
HEALTHY_DMESG = """\
[    4.118233] nvidia: loading out-of-tree module taints kernel.
[    4.301245] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build
[    5.002114] NVRM: Persistence mode is deprecated and will be removed in a future release.
[   61.772010] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it.
[   62.000101] nvme nvme0: 16/0/0 default/read/poll queues
"""


def test_a_healthy_dmesg_is_a_kernel_log_without_events():
    assert hf.scan(HEALTHY_DMESG) == []
    assert hf.is_kernel_log(HEALTHY_DMESG)
    assert hf.is_kernel_log("Mar 29 15:38:59 kernel: NVRM: loading NVIDIA UNIX Open Kernel Module\n")
    assert not hf.is_kernel_log("[project]\nname = 'x'\n# kernel: not a log\n")
    assert not hf.is_kernel_log("")


# -- progress and which devices concern serving ---------------------------------------------------------------------

@pytest.mark.parametrize(("line", "progress"), [
    ("[2026-12-04 10:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.03, "
     "#running-req: 0, #queue-req: 1, ", True),
    ("[2026-12-04 10:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 16384, #cached-token: 0, ", True),
    ("[2026-12-04 10:00:09 TP0] Decode batch, #running-req: 3, #token: 41000, token usage: 0.11, "
     "gen throughput (token/s): 61.20, #queue-req: 0, ", True),
    ('INFO:     10.0.0.5:51234 - "GET /health HTTP/1.1" 503 Service Unavailable', False),
    ("[2026-12-04 10:00:01] Prefill batch size changed", False),
])
def test_progress_lines(line, progress):
    assert hf.is_progress(line) is progress


BASELINE = [{"index": "0", "pci_bus_id": "00000000:41:00.0", "upstream": ["0000:40:01.1", "0000:3f:00.0"]},
            {"index": "1", "pci_bus_id": "00000000:42:00.0", "upstream": ["0000:40:01.1", "0000:3f:00.0"]}]


@pytest.mark.parametrize(("line", "concerns"), [
    ("pcieport 0000:40:01.1: AER: Uncorrectable (Fatal) error message received from 0000:41:00.0", True),
    ("nvidia 0000:42:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)",
     True),
    ("pcieport 0000:3f:00.0: pciehp: Slot(2): Link Down", True),  # the switch above the GPUs
    # an NVMe bay hot-swapped, a NIC's link: other devices, under other ports
    ("pcieport 0000:c0:01.1: AER: Uncorrectable (Fatal) error message received from 0000:c1:00.0", False),
    ("nvme 0000:c1:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)",
     False),
    ("pcieport 0000:c0:03.1: pciehp: Slot(12): Link Down", False),
    ("pcieport 0000:80:01.1:    [ 5] Surprise Down Error    (First)", False),
    ("pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010", False),  # names no device of ours
])
def test_pcie_events_concern_serving_only_for_the_gpus_and_the_bridges_above_them(line, concerns):
    event = hf.classify_kernel(line)
    assert event is not None and event["unfit"]  # the table alone calls each one unfit
    assert hf.concerns_serving(event, hf.serving_devices(BASELINE)) is concerns
    assert hf.concerns_serving(event, set()) is False  # no baseline: recorded, never acted on


def test_gpu_events_always_concern_serving():
    event = hf.classify_kernel("NVRM: Xid (PCI:0000:c1:00): 79, pid=0, GPU has fallen off the bus.")
    assert hf.concerns_serving(event, set())
