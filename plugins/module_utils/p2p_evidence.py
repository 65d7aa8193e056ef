"""Peer-to-peer evidence: read what a host prints about its GPUs' PCIe peer-to-peer path, and decide the NCCL set
(`pcie_p2p` or `pcie_shm`) from it, with the reason and the fix to name.

Read by `moefleet p2p-check FILE...` for pasted outputs, and by the on-host preflight (plugins/modules/p2p_preflight.py,
issue 36), which hands it the same texts it runs on the host and its own all-reduce's results. Pure standard library,
no I/O, no Ansible import. docs/p2p.md has the evidence table (state -> verdict -> fix) and the public sources;
tests/data/p2p/SOURCES.md the corpus it is tested on.

What it reads (each parser takes the whole text and keeps the lines it knows, so a pasted report with several
outputs, shell prompts, `sudo` lines, ANSI colour codes, CRLF line ends, tabs or runs of spaces reads as well):

    topo_matrix     `nvidia-smi topo -m`: the GPU x GPU link matrix (X, SYS, NODE, PHB, PXB, PIX, NV#), NIC rows
                    and columns, CPU and NUMA affinity; wrapped rows are joined, a legend may be cut or absent
    topo_p2p        `nvidia-smi topo -p2p r|w|rw|n|a|p`: the driver's peer status per pair (OK, NS, CNS, GNS, TNS,
                    DR, U); a driver "OK" proves nothing, anything else means the driver will not do P2P there
    lspci           `lspci -vvv` blocks (bridges with their bus ranges and ACSCap/ACSCtl, NVIDIA GPUs with their
                    BAR1 size, "IOMMU group" lines), `lspci -t`/`-tv` trees, or bare `grep ACSCtl` lines
    iommu           the kernel command line (/proc/cmdline or a GRUB_CMDLINE_LINUX line) and kernel messages
                    (DMAR, AMD-Vi, "iommu: Default domain type", IOMMU group lines, IO_PAGE_FAULT and DMAR faults)
    nccl            NCCL_DEBUG=INFO output: version, each channel's transport (P2P/IPC, P2P/CUMEM, P2P/direct
                    pointer, SHM, NET), WARN lines, and an nccl-tests results table with its data check
    p2p_bandwidth   CUDA samples' p2pBandwidthLatencyTest: the connectivity and bandwidth matrices

Public API:

    detect(text) -> list[str]                  the kinds of output in a pasted text, most specific first
    read(text) -> list[dict]                   every piece of evidence in it (one dict per matrix or kind);
                                               Unreadable with a sentence when none can be read
    parse_topo_matrix / parse_topo_p2p / parse_lspci / parse_iommu / parse_nccl / parse_p2p_bandwidth
                                               one kind each: a list of evidence dicts, Unreadable when the kind's
                                               output is there but cannot be read (a cut matrix, no rows)
    decide(evidence, gpus=None) -> dict        verdict "pcie_p2p", "pcie_shm" or "unknown", with reason, fix,
                                               what is missing, the rules that fired and any contradiction
    RULES                                      the evidence table: each row's state, verdict, fix and source
    allreduce_evidence(run, p2p, ...)          the on-host preflight's own all-reduce run as evidence (it outranks
                                               the rest; with it decide() may say "stuck": the GPUs stopped answering)
    sysfs_iommu_evidence(entries)              /sys/class/iommu's entries as IOMMU evidence (empty: off)
    setpci_fix(bridges) / cmdline_fix(bridges) the runtime and boot-time lines that clear ACS redirect

The decision follows shared evidence from public reports (docs/p2p.md): the hangs came from ACS request/completion
redirect on a port between the GPUs while the IOMMU translated; SrcValid alone is harmless; cross-socket (SYS) pairs
worked on AMD Genoa/Turin; a driver "P2P OK" sat beside the hangs; a functional test decides over the static state,
and only one with a data check proves the copies arrive intact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

VERDICT_P2P, VERDICT_SHM, VERDICT_UNKNOWN = "pcie_p2p", "pcie_shm", "unknown"
# Only the on-host preflight gives it (an all-reduce of its own left the GPUs not answering): the host needs a reboot.
VERDICT_STUCK = "stuck"
KINDS = ("p2p_bandwidth", "nccl", "topo_p2p", "topo_matrix", "lspci", "iommu")

# A P2P=Enabled bandwidth below this share of the P2P=Disabled one (the copy through host memory) is broken P2P:
# healthy PCIe pairs measure at or above the host path (26.3 against 22.2 GB/s on a Genoa box, SYS pairs), while a
# 5090 pair with Resizable BAR off measured 12.2 and 2.0 against 42.5 (tests/data/p2p/SOURCES.md).
BROKEN_SHARE = 0.5
# BAR1 below this is the 256 MiB window of a board without Resizable BAR (the driver then maps peers through it).
SMALL_BAR1 = 1 << 30


class Unreadable(ValueError):
    """The text (or one kind of output in it) cannot be read; the message is one sentence naming what to pass."""


# --- the evidence table ------------------------------------------------------------------------------------------

FIX_BIOS_ACS = ("turn ACS off in the BIOS (the PCIe/NBIO 'ACS Enable' setting; some boards only offer it through "
                "disabling IO virtualization / VT-d) so peer traffic is not redirected to the root complex")
FIX_IOMMU = ("or stop the IOMMU translating GPU DMA: add iommu=pt to the kernel command line (the IOMMU stays on for "
             "interrupt remapping and VMs), or amd_iommu=off / intel_iommu=off, then reboot")
FIX_SHM = ("until then serve with the pcie_shm NCCL set (NCCL_P2P_DISABLE=1), and with --disable-custom-all-reduce "
           "where SGLang's custom all-reduce would use P2P (TP groups of two GPUs)")

FIX_REBOOT = ("reboot the host (remediation): GPUs left spinning by a hung all-reduce stay so until then; after the "
              "reboot the preflight does not run P2P again in the same ACS/IOMMU state and serves pcie_shm. To serve "
              "with P2P,")

# Each row: id, the state it reads, the verdict it gives, the fix it names, and where the rule comes from. The
# allreduce-* rows and gpus-stuck read the on-host preflight's own all-reduce (allreduce_evidence), which outranks
# everything pasted.
RULES: tuple[dict[str, str], ...] = (
    {"id": "gpus-stuck", "state": "after the preflight's all-reduce hung and was killed, the GPUs do not answer "
     "(nvidia-smi fails or times out, or shows them busy with no process)", "verdict": VERDICT_STUCK,
     "fix": FIX_REBOOT, "source": "local-inference-lab/rtx6kpro#15 (GPUs stay at 100 % after the hang until a "
     "reboot); vllm-project/vllm#33041, NVIDIA/nccl#1999 (every GPU at 100 %, ~140 W, no progress)"},
    {"id": "allreduce-control-failed", "state": "the preflight's control all-reduce with NCCL_P2P_DISABLE=1 did not "
     "pass (hang, error or wrong values)", "verdict": VERDICT_UNKNOWN, "fix": "",
     "source": "moefleet's preflight: a host whose NCCL fails without P2P has another problem than P2P"},
    {"id": "allreduce-p2p-hang", "state": "the preflight's all-reduce with P2P did not finish within its timeout (or "
     "hung on an earlier boot in the same hardware and ACS/IOMMU state) while the control passed",
     "verdict": VERDICT_SHM, "fix": "the ACS/IOMMU fix of acs-redirect-iommu-translating; " + FIX_SHM,
     "source": "NVIDIA/nccl#1999, #2079, vllm-project/vllm#33041, rtx6kpro#15: the P2P all-reduce hangs, "
     "NCCL_P2P_DISABLE=1 works"},
    {"id": "allreduce-p2p-data-check-failed", "state": "the preflight's all-reduce with P2P finished with wrong "
     "values", "verdict": VERDICT_SHM, "fix": "the ACS/IOMMU fix of acs-redirect-iommu-translating; " + FIX_SHM,
     "source": "tinygrad/open-gpu-kernel-modules#18 (peer copies arrive zeroed under a translating IOMMU)"},
    {"id": "allreduce-p2p-error", "state": "the preflight's all-reduce with P2P failed with an error while the "
     "control passed", "verdict": VERDICT_SHM, "fix": "the ACS/IOMMU fix of acs-redirect-iommu-translating; "
     + FIX_SHM, "source": "moefleet's preflight: NCCL fails only when P2P is allowed"},
    {"id": "allreduce-p2p-slower", "state": "the preflight's all-reduce with P2P passed at below half the control's "
     "bus bandwidth", "verdict": VERDICT_SHM,
     "fix": "P2P is slower than going through host memory: check Resizable BAR (BAR1 size) and ACS redirect; "
     + FIX_SHM, "source": "the share bandwidth-broken uses (aikitoria/open-gpu-kernel-modules#9)"},
    {"id": "allreduce-p2p-ok", "state": "the preflight's all-reduce with P2P passed its data check at least at half "
     "the control's bus bandwidth", "verdict": VERDICT_P2P, "fix": "",
     "source": "a functional test with a data check decides (moefleet's evidence rules, docs/p2p.md)"},
    {"id": "nccl-data-check-failed", "state": "an nccl-tests run over a P2P transport reported wrong values "
     "(Out of bounds values: N FAILED, or a non-zero #wrong)", "verdict": VERDICT_SHM,
     "fix": "the peer copies corrupt data: " + FIX_BIOS_ACS + "; " + FIX_IOMMU + "; " + FIX_SHM,
     "source": "nccl-tests' data check (validation: 1, its #wrong column); NVIDIA NCCL troubleshooting, GPU Direct"},
    {"id": "nccl-data-check-ok", "state": "an nccl-tests run over a P2P transport completed with its data check "
     "(Out of bounds values: 0 OK)", "verdict": VERDICT_P2P, "fix": "",
     "source": "a functional test with a data check decides (moefleet's evidence rules, docs/p2p.md)"},
    {"id": "bandwidth-broken", "state": "p2pBandwidthLatencyTest: a pair's P2P=Enabled bandwidth is 0 or below "
     "half its P2P=Disabled bandwidth", "verdict": VERDICT_SHM,
     "fix": "P2P copies are slower than going through host memory: check Resizable BAR (BAR1 size) and ACS/IOMMU; "
     + FIX_SHM, "source": "aikitoria/open-gpu-kernel-modules#9 (RTX 5090, Resizable BAR off: 12.19 and 2.01 GB/s "
     "against 42.47 GB/s)"},
    {"id": "driver-no-p2p", "state": "the driver reports no peer access between the GPUs (topo -p2p NS, CNS, GNS, "
     "TNS, DR or U; p2pBandwidthLatencyTest 'CANNOT Access Peer')", "verdict": VERDICT_SHM,
     "fix": "the driver will not do P2P between these GPUs (a GeForce board or a chipset the driver does not "
     "support): serve with the pcie_shm NCCL set", "source": "noonghunna/club-3090#1124 (2x RTX 5090: GNS); "
     "nvidia-smi topo -p2p legend"},
    {"id": "iommu-faults", "state": "kernel messages show IOMMU page faults from an NVIDIA device (AMD-Vi "
     "IO_PAGE_FAULT, DMAR fault)", "verdict": VERDICT_SHM,
     "fix": "the IOMMU drops the GPU's peer DMA: " + FIX_IOMMU.removeprefix("or ") + "; " + FIX_SHM,
     "source": "NVIDIA/cuda-samples#48 (AMD-Vi IO_PAGE_FAULT from nvidia devices under the p2p samples); "
     "tinygrad/open-gpu-kernel-modules#18 (IO_PAGE_FAULT, copies arrive zeroed, fixed by the IOMMU off)"},
    {"id": "acs-redirect-iommu-translating", "state": "ACS ReqRedir+ or CmpltRedir+ on a bridge above a GPU while "
     "the IOMMU translates", "verdict": VERDICT_SHM,
     "fix": FIX_BIOS_ACS + " (at runtime: the setpci line below, lost at reboot); " + FIX_IOMMU + "; " + FIX_SHM,
     "source": "NVIDIA/nccl#2079 (fixed by clearing ACS on the GPP bridges with setpci ECAP_ACS+6.w=0000); "
     "vllm-project/vllm#33041 (fixed by amd_iommu=off and ACS off in the BIOS); NVIDIA/nccl#257 (intel_iommu=off); "
     "NVIDIA NCCL troubleshooting, PCI Access Control Services"},
    {"id": "bandwidth-healthy", "state": "p2pBandwidthLatencyTest: every pair's P2P=Enabled bandwidth is at least "
     "half its P2P=Disabled bandwidth", "verdict": VERDICT_P2P, "fix": "",
     "source": "luigifcruz/stelline validated hardware (ASUS ESC8000A-E12, Genoa, SYS pairs at 26.3 GB/s over "
     "22.2 GB/s through the host); the test copies without checking the data"},
    {"id": "acs-redirect-iommu-not-translating", "state": "ACS redirect on a bridge, the IOMMU off or in "
     "passthrough", "verdict": VERDICT_P2P,
     "fix": "redirected peer traffic goes through the root complex untranslated: it works, slower than direct; "
     "clear the redirect bits for full speed", "source": "NVIDIA/nccl#257 (intel_iommu=off alone ended the hang, no "
     "ACS change reported); NVIDIA NCCL troubleshooting (redirected peer traffic goes through the root complex)"},
    {"id": "no-acs-redirect", "state": "no bridge has ReqRedir+ or CmpltRedir+ (SrcValid+ alone, or everything -)",
     "verdict": VERDICT_P2P, "fix": "", "source": "the fixed hangs all needed request/completion redirect; "
     "SrcValid only checks the requester ID (NVIDIA/nccl#606 shows SrcValid+ lines the docs' grep flags)"},
    {"id": "iommu-not-translating", "state": "the IOMMU is off or in passthrough (kernel command line, or the "
     "kernel's 'Default domain type: Passthrough')", "verdict": VERDICT_P2P, "fix": "",
     "source": "the fixed hangs all needed the IOMMU translating (gardenlinux/gardenlinux#4556: RTX PRO 6000 "
     "all-reduce over P2P with iommu=pt); 'Default domain type: Translated' alone is no evidence (the kernel prints "
     "it with the IOMMU off)"},
    {"id": "driver-ok-proves-nothing", "state": "topo -p2p OK or 'CAN Access Peer'", "verdict": VERDICT_UNKNOWN,
     "fix": "", "source": "local-inference-lab/rtx6kpro#15 (topo -p2p p/r/w all OK, the first all-reduce hangs)"},
    {"id": "topology-only", "state": "topo -m link types (PIX, PXB, PHB, NODE, SYS)", "verdict": VERDICT_UNKNOWN,
     "fix": "", "source": "SYS pairs worked on Genoa (stelline ESC8000A-E12); PHB and NODE pairs hung "
     "(rtx6kpro#15, vllm#33041): the link type alone decides nothing"},
    {"id": "incomplete", "state": "neither half of the hang state (ACS redirect, a translating IOMMU) is shown "
     "absent, and no functional result", "verdict": VERDICT_UNKNOWN, "fix": "",
     "source": "moefleet's evidence rules (docs/p2p.md): the verdict names what would decide"},
)
RULE_IDS = frozenset(rule["id"] for rule in RULES)


def _rule(rule_id: str) -> dict[str, str]:
    return next(rule for rule in RULES if rule["id"] == rule_id)


def setpci_fix(bridges: Iterable[str]) -> str:
    """The runtime line that clears ReqRedir (bit 2) and CmpltRedir (bit 3) of each bridge's ACS control register,
    leaving its other bits: NVIDIA's `setpci -s BDF ECAP_ACS+0x6.w=0000` with setpci's value:mask form."""
    return "; ".join(f"setpci -s {bdf} ECAP_ACS+0x6.w=0000:000c" for bdf in bridges)


def cmdline_fix(bridges: Iterable[str]) -> str:
    """The boot-time equivalent: the kernel clears the redirect bits of the listed bridges (semicolon-separated;
    quote it in GRUB_CMDLINE_LINUX)."""
    return "pci=disable_acs_redir=" + ";".join(bridges)


# --- cleaning a pasted text ---------------------------------------------------------------------------------------

# Colour codes as a terminal writes them (ESC [ ... m) and as they survive a paste: "^[[4m", "\x1b[4m", "\033[4m",
# "\e[4m", or the bare "[4m" left when the ESC byte was dropped in front of a GPU header.
_ANSI = re.compile(r"(?:\x1b|\^\[|\\x1b|\\033|\\e|\\u001b)\[[0-9;]*[A-Za-z]|\x1b[()][0-9A-B]"
                   r"|(?<![\w\]])\[[0-9;]*m(?=[\w\s]|$)")


def clean_lines(text: str) -> list[str]:
    """The text's lines with CRLF/CR ends, colour codes and trailing blanks removed (tabs inside kept)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    return [_ANSI.sub("", line).rstrip() for line in text.split("\n")]


# A shell prompt with its command: "$ cmd", "user@host:~/dir$ cmd", "(venv) root@box:/x# cmd", "sh-5.1# cmd",
# "$ user@host:~$ cmd" (a prompt pasted twice), "# cmd" when cmd is a command this module knows (nccl-tests' own
# lines start with "# " too), and numbered steps ("4. lspci -s c1:00.0 -vvv").
_COMMANDS = (r"(?:sudo\s+)?(?:[A-Z_]+=\S*\s+)*(?:lspci|nvidia-smi|dmesg|journalctl|cat|grep|setpci|\./\S+|"
             r"p2pBandwidthLatencyTest|all_reduce_perf|export|python3?|torchrun)\b")
_PROMPT = re.compile(r"^\s*(?:\(\S+\)\s*)?(?:\$\s+)?(?:[\w.-]+@[\w.-]+(?::\S*)?\s*[$#]|sh-[\d.]+[$#]|\$)"
                     r"\s*(?P<cmd>.*)$")
_ROOT_PROMPT = re.compile(r"^\s*#\s+(?P<cmd>" + _COMMANDS + r".*)$")
_STEP = re.compile(r"^\s*\d+\.\s+(?P<cmd>" + _COMMANDS + r".*)$")
_SUDO = re.compile(r"^\s*\[sudo\] password for ")


def prompt_command(line: str) -> str | None:
    """The command of a shell prompt line ("" for a bare prompt), or None when the line is not a prompt."""
    if _SUDO.match(line):
        return ""
    for pattern in (_PROMPT, _ROOT_PROMPT, _STEP):
        match = pattern.match(line)
        if match:
            return match.group("cmd").strip()
    return None


# --- detection ------------------------------------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^\s*GPU0(?:\s|$)")
_TOPO_CELL = re.compile(r"^(?:X|SYS|NODE|PHB|PXB|PIX|PXN|SOC|NV\d+)$")
_P2P_CELL = re.compile(r"^(?:X|OK|NS|CNS|GNS|TNS|DR|U|NC)$")
_SIGNATURES: dict[str, re.Pattern[str]] = {
    "p2p_bandwidth": re.compile(r"P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test|P2P=(?:En|Dis)abled \w* ?"
                                r"(?:Bandwidth|Latency)|P2P Connectivity Matrix|Device=\d+ CAN(?:NOT)? Access Peer"),
    "nccl": re.compile(r"NCCL (?:INFO|WARN)|\bvia (?:P2P|SHM|NET)/|# nThread \d+ nGpus|Out of bounds values\s*:|"
                       r"#\s+size\s+count\s+type"),
    "lspci": re.compile(r"^\s*(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] \S.*?: |ACSCtl:|"
                        r"^[ |\\+-]*\[[0-9a-fA-F]{4}:[0-9a-fA-F]{2}\]-|^-\[[0-9a-fA-F]{2}\]-", re.M),
    "iommu": re.compile(r"BOOT_IMAGE=|GRUB_CMDLINE_LINUX|(?:^|\s)(?:intel_|amd_)?iommu(?:\.passthrough|\.strict)?="
                        r"|DMAR[:-]|AMD-Vi|iommu: Default domain type|Adding to iommu group|IO_PAGE_FAULT", re.M),
}


def detect(text: str) -> list[str]:
    """The kinds of output the text holds (KINDS order), [] when none."""
    lines = clean_lines(text)
    joined = "\n".join(lines)
    found = [kind for kind, pattern in _SIGNATURES.items() if pattern.search(joined)]
    for kind in ("topo_matrix", "topo_p2p"):
        if _matrix_blocks(lines, kind):
            found.append(kind)
    return [kind for kind in KINDS if kind in found]


# --- nvidia-smi topo -m and topo -p2p ---------------------------------------------------------------------------

_ROW_LABEL = re.compile(r"^\s*(GPU\d+|NIC\d+|mlx\d+_\d+)(?:\s|$)")
_HEADER_WORD = re.compile(r"^(?:GPU\d+|NIC\d+|mlx\d+_\d+|CPU|NUMA|GPU|Affinity|ID)$")
_DEVICE_NAME = re.compile(r"\b(GPU\d+|NIC\d+|mlx\d+_\d+)\b")
_AFFINITY_CELL = re.compile(r"^(?:[\d,-]+|N/A)$")
_TOPO_LEGEND = re.compile(r"^\s*(?:Legend:|NIC Legend:|X\s+=\s+Self)")
_NIC_NAME = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_P2P_MEANING = {"OK": "Status Ok", "CNS": "Chipset not supported", "GNS": "GPU not supported",
                "TNS": "Topology not supported", "NS": "Not supported", "DR": "Disabled by regkey", "U": "Unknown",
                "NC": "Not connected"}


def _matrix_blocks(lines: Sequence[str], kind: str) -> list[dict[str, Any]]:
    """Each header + rows block of `nvidia-smi topo -m` (kind topo_matrix) or `topo -p2p` (topo_p2p): the command
    that printed it when a prompt line says, its columns and its rows (a wrapped row joined), and the line
    number where it starts."""
    blocks: list[dict[str, Any]] = []
    command = None
    index = 0
    while index < len(lines):
        line = lines[index]
        cmd = prompt_command(line)
        if cmd is not None:
            command = cmd or command
            index += 1
            continue
        if not _GPU_HEADER.match(line) or _ROW_LABEL.match(line) and _row_cells(line)[1:2] == ["X"]:
            index += 1
            continue
        header_lines = [line]
        start = index
        index += 1
        # A header wrapped by a narrow terminal or a mail client goes on with more column names (whole or split,
        # "NUMA" / "Affinity") before the first row.
        while index < len(lines) and lines[index].strip() and all(
                _HEADER_WORD.match(word) for word in lines[index].split()):
            header_lines.append(lines[index])
            index += 1
        header = " ".join(" ".join(header_lines).split())
        devices = _DEVICE_NAME.findall(header)
        rows: dict[str, list[str]] = {}
        order: list[str] = []
        while index < len(lines):
            row_line = lines[index]
            if not row_line.strip() or _TOPO_LEGEND.match(row_line) or prompt_command(row_line) is not None:
                break
            match = _ROW_LABEL.match(row_line)
            if match:
                label = match.group(1)
                rows[label] = _row_cells(row_line)[1:]
                order.append(label)
            elif order and all(_TOPO_CELL.match(c) or _P2P_CELL.match(c) or _AFFINITY_CELL.match(c)
                               for c in _row_cells(row_line)):
                # A row wrapped by a narrow terminal: its cells (links, then affinities) go on on the next line.
                rows[order[-1]] += _row_cells(row_line)
            else:
                break
            index += 1
        cells = [cell for label in order for cell in rows[label][:len(devices)]]
        is_p2p = bool(cells) and all(_P2P_CELL.match(cell) for cell in cells) and any(
            cell != "X" for cell in cells)
        # One GPU and no NIC: its only cell is X; the affinity columns tell topo -m from topo -p2p.
        is_topo = not is_p2p and (any(_TOPO_CELL.match(cell) and cell != "X" for cell in cells)
                                  or "CPU Affinity" in header)
        if (kind == "topo_p2p" and is_p2p) or (kind == "topo_matrix" and is_topo):
            blocks.append({"command": command, "header": header, "devices": devices, "rows": rows, "order": order,
                           "line": start + 1})
    return blocks


def _row_cells(line: str) -> list[str]:
    return [cell for cell in re.split(r"\s+", line.strip()) if cell]


def _gpu_index(label: str) -> int:
    return int(label[3:])


def parse_topo_matrix(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi topo -m`: one dict per matrix, kind topo_matrix."""
    lines = clean_lines(text)
    blocks = _matrix_blocks(lines, "topo_matrix")
    if not blocks:
        raise Unreadable("no nvidia-smi topo -m matrix in it (a header line starting GPU0 and rows GPU0 X ...); "
                         "paste the whole output of nvidia-smi topo -m.")
    nic_names = {m.group(1): m.group(2) for line in lines if (m := _NIC_NAME.match(line))}
    found = []
    for block in blocks:
        devices, rows = block["devices"], block["rows"]
        gpus = [d for d in devices if d.startswith("GPU")]
        missing = [d for d in devices if d not in rows]
        if missing:
            raise Unreadable(f"the topo -m matrix at line {block['line']} names {', '.join(devices)} but has no row "
                             f"for {', '.join(missing)}: the paste is cut; paste the whole matrix.")
        links: dict[str, dict[str, str]] = {}
        affinity: dict[str, dict[str, str]] = {}
        for label in block["order"]:
            cells = rows[label]
            if len(cells) < len(devices):
                raise Unreadable(f"row {label} of the topo -m matrix at line {block['line']} has {len(cells)} of "
                                 f"{len(devices)} link cells: the row is cut; paste the whole matrix.")
            for column, cell in zip(devices, cells, strict=False):
                if not _TOPO_CELL.match(cell):
                    raise Unreadable(f"row {label}, column {column} of the topo -m matrix reads {cell!r}, which is "
                                     "no topo -m link type (X, SYS, NODE, PHB, PXB, PIX, NV#).")
            links[label] = dict(zip(devices, cells, strict=False))
            extra = cells[len(devices):]
            if label.startswith("GPU"):
                affinity[label] = {"cpu": extra[0] if extra else None,
                                   "numa": extra[1] if len(extra) > 1 else None}
        for label in gpus:
            if links[label][label] != "X":
                raise Unreadable(f"row {label} of the topo -m matrix does not have X against itself: the columns "
                                 "are shifted; paste the output as nvidia-smi printed it.")
        pairs = [{"a": _gpu_index(a), "b": _gpu_index(b), "link": links[a][b]}
                 for i, a in enumerate(gpus) for b in gpus[i + 1:]]
        notes = []
        for pair in pairs:
            back = links[f"GPU{pair['b']}"][f"GPU{pair['a']}"]
            if back != pair["link"]:
                notes.append(f"GPU{pair['a']}->GPU{pair['b']} reads {pair['link']} but the other way reads {back}")
        found.append({"kind": "topo_matrix", "line": block["line"], "gpus": [_gpu_index(g) for g in gpus],
                      "nics": {n: nic_names.get(n) for n in devices if not n.startswith("GPU")},
                      "pairs": pairs, "affinity": {str(_gpu_index(g)): a for g, a in affinity.items()},
                      "notes": notes})
    return found


_P2P_CAPABILITY = re.compile(r"topo\s+(?:-p2p|--p2pstatus)\s+(\w+)")


def parse_topo_p2p(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi topo -p2p CAP`: one dict per matrix, kind topo_p2p (capability from the prompt line when the
    paste has it)."""
    blocks = _matrix_blocks(clean_lines(text), "topo_p2p")
    if not blocks:
        raise Unreadable("no nvidia-smi topo -p2p matrix in it (a header starting GPU0 and cells OK, NS, CNS, GNS, "
                         "TNS ...); paste the whole output of nvidia-smi topo -p2p rw.")
    found = []
    for block in blocks:
        gpus = [d for d in block["devices"] if d.startswith("GPU")]
        missing = [g for g in gpus if g not in block["rows"]]
        if missing:
            raise Unreadable(f"the topo -p2p matrix at line {block['line']} has no row for {', '.join(missing)}: "
                             "the paste is cut; paste the whole matrix.")
        status = {g: dict(zip(gpus, block["rows"][g], strict=False)) for g in gpus}
        pairs = [{"a": _gpu_index(a), "b": _gpu_index(b), "status": status[a].get(b, "U"),
                  "meaning": _P2P_MEANING.get(status[a].get(b, "U"), "Unknown")}
                 for a in gpus for b in gpus if a != b]
        match = _P2P_CAPABILITY.search(block["command"] or "")
        found.append({"kind": "topo_p2p", "line": block["line"], "capability": match.group(1) if match else None,
                      "gpus": [_gpu_index(g) for g in gpus], "pairs": pairs,
                      "not_ok": [p for p in pairs if p["status"] != "OK"]})
    return found


# --- lspci --------------------------------------------------------------------------------------------------------

_DEVICE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (?P<cls>[^:]+?)"
                     r"(?: \[[0-9a-f]{4}\])?: (?P<desc>.*)$")
_BUS = re.compile(r"Bus: primary=(?P<pri>[0-9a-f]{2}), secondary=(?P<sec>[0-9a-f]{2}), "
                  r"subordinate=(?P<sub>[0-9a-f]{2})")
_ACS = re.compile(r"(?P<which>ACSCap|ACSCtl):\s*(?P<flags>.*)$")
_ACS_FLAG = re.compile(r"(SrcValid|TransBlk|ReqRedir|CmpltRedir|UpstreamFwd|EgressCtrl|DirectTrans)([+-])")
_REGION = re.compile(r"(?:Region (?P<n>\d+): )?Memory at (?P<addr>[0-9a-f]+|<\w+>) \((?P<bits>\d+)-bit, "
                     r"(?P<pref>(?:non-)?prefetchable)\)(?: \[\w+\])*\s*\[size=(?P<size>\d+)(?P<unit>[KMGT]?)\]")
_GPU_CLASS = re.compile(r"VGA compatible controller|3D controller|Display controller")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _full_bdf(bdf: str, domain: str = "0000") -> str:
    bdf = bdf.lower()
    return bdf if bdf.count(":") == 2 else f"{domain}:{bdf}"


def _acs_flags(text: str) -> dict[str, bool]:
    return {name: sign == "+" for name, sign in _ACS_FLAG.findall(text)}


def _join_wrapped(lines: Sequence[str]) -> list[str]:
    """Lines with a mail client's or terminal's wrap undone: a line that starts at column 0 with no device address,
    no prompt and no tree branch goes on the line before it (lspci -vvv indents every line of a device block)."""
    out: list[str] = []
    for line in lines:
        if out and out[-1] and line and not line[0].isspace() and not _DEVICE.match(line) \
                and prompt_command(line) is None and not re.match(r"^[-+|\\\[]", line) and (
                _DEVICE.match(out[-1]) or out[-1][0].isspace()):
            out[-1] = out[-1] + " " + line
            continue
        out.append(line)
    return out


def parse_lspci(text: str) -> list[dict[str, Any]]:
    """`lspci -vvv` blocks, `lspci -t`/`-tv` trees and bare ACSCtl lines: one dict, kind lspci, with the bridges
    (bus range, ACS), the NVIDIA GPUs (BAR1 size, the bridges above them) and the ACS lines no device owns."""
    lines = _join_wrapped(clean_lines(text))
    devices: dict[str, dict[str, Any]] = {}
    loose_acs: list[dict[str, bool]] = []
    current: dict[str, Any] | None = None
    groups_seen = False
    tree_lines: list[str] = []
    for line in lines:
        if prompt_command(line) is not None:
            current = None
            continue
        match = _DEVICE.match(line)
        if match:
            bdf = _full_bdf(match.group("bdf"))
            current = devices.setdefault(bdf, {"bdf": bdf, "class": match.group("cls"),
                                               "name": match.group("desc").strip(), "acs_ctl": None,
                                               "acs_cap": None, "secondary": None, "subordinate": None,
                                               "regions": []})
            continue
        if re.match(r"^[ |\\+-]*(?:\[[0-9a-fA-F]{4}:[0-9a-fA-F]{2}\]|\[[0-9a-fA-F]{2}\])-|^\s*[|\\+ ]*[+\\]-"
                    r"[0-9a-f]{2}\.[0-7]", line):
            tree_lines.append(line)
            current = None
            continue
        if "IOMMU group:" in line:
            groups_seen = True
        acs = _ACS.search(line)
        if acs:
            flags = _acs_flags(acs.group("flags"))
            if current is not None:
                current["acs_ctl" if acs.group("which") == "ACSCtl" else "acs_cap"] = flags
            elif acs.group("which") == "ACSCtl":
                loose_acs.append(flags)
            continue
        if current is None:
            continue
        bus = _BUS.search(line)
        if bus:
            current["secondary"], current["subordinate"] = int(bus.group("sec"), 16), int(bus.group("sub"), 16)
            continue
        region = _REGION.search(line)
        if region:
            current["regions"].append({"region": int(region.group("n")) if region.group("n") else None,
                                       "prefetchable": region.group("pref") == "prefetchable",
                                       "bytes": int(region.group("size")) * _UNITS[region.group("unit")]})
    tree = _parse_tree(tree_lines)
    if not devices and not loose_acs and not tree["devices"]:
        raise Unreadable("no lspci device block (a line like '41:00.0 VGA compatible controller: NVIDIA ...'), "
                         "no lspci -t tree and no ACSCtl line in it; paste sudo lspci -vvv (run as root: without it "
                         "lspci prints no ACS lines).")
    # The tree knows which bridge each device hangs from; -vvv blocks give the bus ranges. Use both.
    for bdf, info in tree["devices"].items():
        devices.setdefault(bdf, {"bdf": bdf, "class": "", "name": info["name"], "acs_ctl": None, "acs_cap": None,
                                 "secondary": None, "subordinate": None, "regions": []})
        if info.get("secondary") is not None and devices[bdf]["secondary"] is None:
            devices[bdf]["secondary"], devices[bdf]["subordinate"] = info["secondary"], info["subordinate"]
    bridges = [d for d in devices.values() if d["secondary"] is not None or d["class"] == "PCI bridge"
               or d["acs_ctl"] is not None and d["class"] != "" and "bridge" in d["class"].lower()]
    gpus = []
    for dev in devices.values():
        is_gpu = "NVIDIA" in dev["name"] and (_GPU_CLASS.search(dev["class"]) or not dev["class"] and not re.search(
            r"Audio|USB|UCSI|Serial|Bridge|Switch", dev["name"], re.I))
        if not is_gpu:
            continue
        prefetchable = [r for r in dev["regions"] if r["prefetchable"]]
        bar1 = max(prefetchable, key=lambda r: r["bytes"]) if prefetchable else None
        domain, bus = dev["bdf"][:4], int(dev["bdf"][5:7], 16)
        above = sorted({b["bdf"] for b in bridges if b["bdf"][:4] == domain and b["secondary"] is not None
                        and b["secondary"] <= bus <= b["subordinate"]}
                       | set(tree["devices"].get(dev["bdf"], {}).get("above", ())))
        gpus.append({"bdf": dev["bdf"], "name": dev["name"], "bar1_bytes": bar1["bytes"] if bar1 else None,
                     "bar1_region": bar1["region"] if bar1 else None, "bridges_above": above})
    bridge_rows = [{"bdf": b["bdf"], "name": b["name"], "secondary": b["secondary"],
                    "subordinate": b["subordinate"], "acs_ctl": b["acs_ctl"],
                    "redirect": _redirect(b["acs_ctl"])} for b in bridges]
    acs_rows = [d for d in devices.values() if d["acs_ctl"] is not None and d not in bridges]
    notes = []
    for gpu in gpus:
        if gpu["bar1_bytes"] is not None and gpu["bar1_bytes"] < SMALL_BAR1:
            notes.append(f"GPU {gpu['bdf']} has a {_size_text(gpu['bar1_bytes'])} BAR1: Resizable BAR looks off "
                         "(enable Above 4G Decoding and Re-Size BAR in the BIOS)")
    return [{"kind": "lspci", "form": "+".join(f for f, present in (("vvv", bool(devices) and any(
        d["class"] for d in devices.values())), ("tree", bool(tree["devices"])), ("grep", bool(loose_acs)))
        if present), "bridges": bridge_rows, "gpus": gpus,
        "acs_devices": [{"bdf": d["bdf"], "acs_ctl": d["acs_ctl"], "redirect": _redirect(d["acs_ctl"])}
                        for d in acs_rows],
        "loose_acs": [{"acs_ctl": flags, "redirect": _redirect(flags)} for flags in loose_acs],
        "iommu_groups_seen": groups_seen, "notes": notes}]


def _redirect(flags: dict[str, bool] | None) -> bool | None:
    if flags is None:
        return None
    return bool(flags.get("ReqRedir") or flags.get("CmpltRedir"))


def _size_text(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} B"


_TREE_ROOT = re.compile(r"\[(?:(?P<dom>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2})\]-")
_TREE_DEV = re.compile(r"(?<![0-9a-fA-F:.])(?P<dev>[0-9a-fA-F]{2}\.[0-7])(?:-\[(?P<sec>[0-9a-fA-F]{2})"
                       r"(?:-(?P<sub>[0-9a-fA-F]{2}))?\])?")


def _parse_tree(lines: Sequence[str]) -> dict[str, Any]:
    """An `lspci -t`/`-tv` tree: each device's address, name (with -v) and, for a bridge, its bus range. A device
    belongs to the nearest bracket to its left on its own line or on the open branches above it."""
    devices: dict[str, dict[str, Any]] = {}
    # (column of the bracket, domain, bus behind it, the bridge that opens it: None for a root bus)
    stack: list[tuple[int, str, int, str | None]] = []
    for line in lines:
        # -tv prints a device's name after two spaces; cut it so brackets in names ("[AMD]") are not read.
        structure, name = line, ""
        named = re.search(r"([0-9a-fA-F]{2}\.[0-7])  (\S.*)$", line)
        if named:
            structure, name = line[:named.end(1)], named.group(2).strip()
        position = 0
        while position < len(structure):
            root = _TREE_ROOT.match(structure, position) if structure[position] == "[" else None
            if root and (position == 0 or structure[position - 1] in "-+\\ "):
                column = position
                stack = [entry for entry in stack if entry[0] < column]
                stack.append((column, (root.group("dom") or "0000").lower(), int(root.group("bus"), 16), None))
                position = root.end()
                continue
            dev = _TREE_DEV.match(structure, position)
            if dev and (position == 0 or structure[position - 1] in "-+\\ "):
                column = position
                stack = [entry for entry in stack if entry[0] < column]
                if stack:
                    _, domain, bus, _ = stack[-1]
                    bdf = f"{domain}:{bus:02x}:{dev.group('dev').lower()}"
                    info = devices.setdefault(bdf, {"name": ""})
                    # The tree says which bridges a device hangs from even where the bus numbers do not nest.
                    info["above"] = [entry[3] for entry in stack if entry[3]]
                    if dev.group("sec"):
                        sec = int(dev.group("sec"), 16)
                        info["secondary"] = sec
                        info["subordinate"] = int(dev.group("sub"), 16) if dev.group("sub") else sec
                        stack.append((column + len(dev.group("dev")) + 1, domain, sec, bdf))
                    if named and dev.end("dev") == named.end(1):
                        info["name"] = name
                position = dev.end()
                continue
            position += 1
    return {"devices": devices}


# --- IOMMU: kernel command line and kernel messages ----------------------------------------------------------------

_CMDLINE = re.compile(r"(?:^|\s)(?:BOOT_IMAGE=|root=|GRUB_CMDLINE_LINUX(?:_DEFAULT)?=|initrd=\S*\s.*root=)")
_PARAM = re.compile(r"(?:^|[\s\"'])(?P<key>intel_iommu|amd_iommu|iommu|iommu\.passthrough|iommu\.strict|pci)"
                    r"=(?P<value>[^\s\"']+)")
_DOMAIN = re.compile(r"iommu: Default domain type: (?P<type>Translated|Passthrough|Lazy|DMA\S*|Identity)"
                     r"(?P<rest>.*)$")
_HW_ON = re.compile(r"DMAR: IOMMU enabled|DMAR: Intel\(R\) Virtualization Technology for Directed I/O|"
                    r"AMD-Vi: Found IOMMU|AMD-Vi: Interrupt remapping enabled|Adding to iommu group|"
                    r"AMD-Vi: AMD IOMMUv2|iommu: Adding device")
_HW_OFF = re.compile(r"DMAR: IOMMU disabled|AMD-Vi: AMD IOMMU disabled|AMD-Vi: Disabling|iommu=off")
_FAULT = re.compile(r"(?:(?P<drv>\w+) (?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): )?AMD-Vi: Event logged "
                    r"\[IO_PAGE_FAULT(?: device=(?P<dev2>[0-9a-f:.]+))?|DMAR: \[DMA (?:Read|Write)[^\]]*\] "
                    r"Request device \[(?P<dev3>[0-9a-f:.]+)\]|DMAR: DRHD: handling fault")


_CMDLINE_TOKEN = re.compile(r"^[\w.,:/\\~+-]+(?:=\S*)?$")


def _looks_like_cmdline(line: str) -> bool:
    """A kernel command line: one with BOOT_IMAGE=, root= or a GRUB_CMDLINE_LINUX setting, or a line of bare
    kernel parameters that sets an IOMMU option (a pasted "amd_iommu=off iommu=pt")."""
    if _CMDLINE.search(line):
        return True
    tokens = line.split()
    return bool(tokens) and bool(_PARAM.search(line)) and all(_CMDLINE_TOKEN.match(t) for t in tokens) \
        and not line.lstrip().startswith("[")


def parse_iommu(text: str) -> list[dict[str, Any]]:
    """The IOMMU state a kernel command line and kernel messages show: mode off, passthrough, translated, on (mode
    not shown) or None, with what showed it, and any IOMMU fault from an NVIDIA device."""
    lines = clean_lines(text)
    cmdline, params, source = None, {}, []
    hardware, domain, hw_off = None, None, False
    faults = []
    for line in lines:
        if prompt_command(line) is not None and not _CMDLINE.search(line):
            continue
        if _looks_like_cmdline(line):
            # A GRUB file has two settings; keep the one with parameters (an empty GRUB_CMDLINE_LINUX="" says
            # nothing).
            if cmdline is None or _PARAM.search(line) and not _PARAM.search(cmdline):
                cmdline = line.strip()
            for match in _PARAM.finditer(line):
                params.setdefault(match.group("key"), []).append(match.group("value"))
            continue
        if _HW_ON.search(line):
            hardware = "intel" if "DMAR" in line else "amd" if "AMD-Vi" in line else hardware or "on"
        if _HW_OFF.search(line):
            hw_off = True
        match = _DOMAIN.search(line)
        if match:
            domain = match.group("type")
        fault = _FAULT.search(line)
        if fault:
            device = fault.group("dev") or fault.group("dev2") or fault.group("dev3")
            faults.append({"device": device, "nvidia": (fault.group("drv") == "nvidia") or "nvidia" in line.lower(),
                           "line": line.strip()[:300]})
    if cmdline is None and hardware is None and domain is None and not faults and not hw_off:
        raise Unreadable("no kernel command line (BOOT_IMAGE=... or a GRUB_CMDLINE_LINUX line) and no IOMMU kernel "
                         "message (DMAR, AMD-Vi, 'iommu: Default domain type', IOMMU group) in it; paste "
                         "cat /proc/cmdline and journalctl -k -b | grep -i -e iommu -e dmar -e amd-vi.")
    mode, notes = None, []

    def last(key: str) -> str | None:
        return params.get(key, [None])[-1]

    intel, amd, generic, passthrough = last("intel_iommu"), last("amd_iommu"), last("iommu"), last(
        "iommu.passthrough")
    if intel == "off" or amd == "off" or generic == "off" or hw_off:
        mode = "off"
        source.append("command line" if (intel == "off" or amd == "off" or generic == "off") else "kernel messages")
    elif generic == "pt" or passthrough in ("1", "on", "y", "Y"):
        mode = "passthrough"
        source.append("command line")
    elif domain in ("Passthrough", "Identity"):
        mode = "passthrough"
        source.append("kernel messages")
    elif faults:
        mode = "translated"
        source.append("IOMMU faults")
    elif (hardware or intel in ("on", "force") or amd in ("on", "force_enable")) and (
            domain in ("Translated", "Lazy") or (domain or "").startswith("DMA") or passthrough in ("0", "off", "n")):
        mode = "translated"
        source.append("kernel messages" if domain else "command line")
    elif hardware or intel in ("on", "force") or amd in ("on", "force_enable"):
        mode = "on"
        notes.append("the IOMMU is on but the mode is not shown: add the 'iommu: Default domain type' line "
                     "(journalctl -k -b) or /proc/cmdline")
    elif domain == "Translated":
        notes.append("'iommu: Default domain type: Translated' alone is no evidence: the kernel prints it with the "
                     "IOMMU off too; the command line and the DMAR/AMD-Vi lines decide")
    elif cmdline is not None:
        notes.append("the command line sets no IOMMU option: the BIOS and the kernel's default decide (AMD and "
                     "recent Intel kernels translate when the IOMMU is on in the BIOS)")
    acs_params = params.get("pci", [])
    for value in acs_params:
        if value.startswith("disable_acs_redir=") or value == "noacs":
            notes.append(f"the command line has pci={value}: the kernel clears or skips ACS on those bridges")
    if cmdline and cmdline.lstrip().startswith("GRUB_CMDLINE"):
        notes.append("this is the GRUB configuration, not the running kernel's /proc/cmdline")
    nvidia_faults = [f for f in faults if f["nvidia"]]
    return [{"kind": "iommu", "mode": mode, "translating": {"translated": True, "off": False, "passthrough": False}
             .get(mode), "hardware": hardware, "default_domain": domain, "cmdline": cmdline,
             "params": {k: v[-1] for k, v in params.items()}, "source": source, "faults": faults,
             "nvidia_faults": nvidia_faults, "notes": notes}]


# --- NCCL debug output and nccl-tests ---------------------------------------------------------------------------

_NCCL_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)|using nccl==(?P<v2>\d+\.\d+\.\d+)")
_CHANNEL = re.compile(r"(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fx]+\])? -> "
                      r"(?P<dst>\d+)(?:\[[0-9a-fx]+\])?(?: \[(?:send|receive)\])? via (?P<via>.+?)\s*$")
_NCCL_WARN = re.compile(r"NCCL WARN (?P<msg>.*)$")
_NCCL_ENV = re.compile(r"(?P<var>NCCL_\w+) set by environment to (?P<value>\S+)")
_RESULT = re.compile(r"^\s*(?:\[\d+,\d+\]<stdout>:)?\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>[a-z0-9_]+)\s+"
                     r"(?P<rest>(?:\S+\s+){2,}\S+)\s*$")
_OOB = re.compile(r"Out of bounds values\s*:\s*(?P<n>\d+)\s+(?P<state>OK|FAILED)")
_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*(?P<bw>[\d.]+)")


def parse_nccl(text: str) -> list[dict[str, Any]]:
    """NCCL_DEBUG=INFO output and nccl-tests results: one dict, kind nccl."""
    lines = clean_lines(text)
    version, transports, warnings, env = None, {}, [], {}
    init_complete, rows, wrong, oob, busbw = False, 0, 0, None, None
    p2p_disabled_pairs = 0
    header = False
    for line in lines:
        if re.search(r"# nThread \d+ nGpus|#\s+size\s+count\s+type", line):
            header = True
        match = _NCCL_VERSION.search(line)
        if match and version is None:
            version = match.group("v") or match.group("v2")
        channel = _CHANNEL.search(line)
        if channel:
            via = channel.group("via")
            transports[via] = transports.get(via, 0) + 1
            continue
        warn = _NCCL_WARN.search(line)
        if warn:
            warnings.append(warn.group("msg").strip()[:300])
        setting = _NCCL_ENV.search(line)
        if setting:
            env[setting.group("var")] = setting.group("value")
        if "Init COMPLETE" in line:
            init_complete = True
        if "P2P is disabled between connected GPUs" in line:
            p2p_disabled_pairs += 1
        match = _OOB.search(line)
        if match:
            oob = {"count": int(match.group("n")), "ok": match.group("state") == "OK"}
        match = _BUSBW.search(line)
        if match:
            busbw = float(match.group("bw"))
        result = _RESULT.match(line)
        if result and "NCCL" not in line:
            cells = result.group("rest").split()
            # Out-of-place and in-place each end with their error or #wrong cell (a count, a float such as 0e+00,
            # N/A): the last cell and the one four before it (time, algbw, busbw, error of the in-place half).
            errors = [cells[i] for i in (len(cells) - 5, len(cells) - 1) if 0 <= i < len(cells)]
            rows += 1
            if any(re.match(r"^-?[\d.]+(?:e[+-]?\d+)?$", cell) and float(cell) != 0 for cell in errors):
                wrong += 1
    families = sorted({via.split("/")[0].split()[0] for via in transports})
    if not (transports or warnings or rows or oob or init_complete or version or header):
        raise Unreadable("no NCCL INFO/WARN line, channel line ('Channel 00/0 : 0[0] -> 1[1] via ...') or "
                         "nccl-tests result in it; run with NCCL_DEBUG=INFO and paste the whole output.")
    notes = []
    if header and not rows and oob is None:
        notes.append("nccl-tests printed its header but no result row: the run hung at its first size, or the paste "
                     "is cut")
    data_check = None
    if oob is not None:
        data_check = oob["ok"] and wrong == 0
    elif rows:
        data_check = wrong == 0
    return [{"kind": "nccl", "version": version, "transports": transports, "families": families,
             "p2p_used": "P2P" in families, "init_complete": init_complete, "warnings": warnings, "env": env,
             "p2p_disabled_pairs": p2p_disabled_pairs,
             "results": {"rows": rows, "wrong_rows": wrong, "out_of_bounds": oob, "avg_busbw_gbps": busbw},
             "data_check_ok": data_check, "notes": notes}]


# --- p2pBandwidthLatencyTest -----------------------------------------------------------------------------------------

_MATRIX_TITLE = re.compile(r"^(?P<title>P2P Connectivity Matrix|(?:Unidirectional|Bidirectional) P2P=(?:Enabled|"
                           r"Disabled) Bandwidth.*Matrix.*|P2P=(?:Enabled|Disabled) Latency.*Matrix.*)$")
_BW_DEVICE = re.compile(r"^Device: (?P<n>\d+), (?P<name>.+?), pciBusID: (?P<bus>[0-9a-f]+)")
_ACCESS = re.compile(r"Device=(?P<a>\d+) (?P<can>CAN|CANNOT) Access Peer Device=(?P<b>\d+)")


def _matrix_key(title: str) -> str | None:
    if title.startswith("P2P Connectivity"):
        return "connectivity"
    if "Latency" in title:
        return None
    direction = "uni" if title.startswith("Uni") else "bi"
    return f"{direction}_{'enabled' if 'P2P=Enabled' in title else 'disabled'}"


def parse_p2p_bandwidth(text: str) -> list[dict[str, Any]]:
    """CUDA samples' p2pBandwidthLatencyTest: the devices, the driver's CAN/CANNOT Access lines, the connectivity
    and bandwidth matrices, and each pair's P2P=Enabled against P2P=Disabled bandwidth."""
    lines = clean_lines(text)
    devices, access, matrices = {}, {}, {}
    key, rows_of = None, None
    for line in lines:
        stripped = line.strip()
        match = _BW_DEVICE.match(stripped)
        if match:
            devices[int(match.group("n"))] = match.group("name")
            continue
        match = _ACCESS.search(stripped)
        if match:
            access[(int(match.group("a")), int(match.group("b")))] = match.group("can") == "CAN"
            continue
        match = _MATRIX_TITLE.match(stripped)
        if match:
            key = _matrix_key(match.group("title"))
            rows_of = matrices.setdefault(key, {}) if key else None
            continue
        if rows_of is None:
            continue
        cells = stripped.split()
        if cells and cells[0] in ("D\\D", "GPU", "CPU"):
            if cells[0] == "CPU":
                rows_of = None  # the latency test's CPU half follows its GPU half
            continue
        try:
            values = [float(c) for c in cells]
        except ValueError:
            rows_of = None
            continue
        if len(values) >= 2 and values[0].is_integer():
            rows_of[int(values[0])] = values[1:]
        else:
            rows_of = None
    if not devices and not access and not any(matrices.values()):
        raise Unreadable("no p2pBandwidthLatencyTest output in it (its 'Device=0 CAN Access Peer Device=1' lines "
                         "and bandwidth matrices); paste the whole output of ./p2pBandwidthLatencyTest.")
    highest_peer = max(max(p) for p in access) + 1 if access else 0
    n = max([len(devices)] + [len(m) for m in matrices.values()] + [highest_peer])
    pairs = []
    uni_on, uni_off = matrices.get("uni_enabled", {}), matrices.get("uni_disabled", {})
    bi_on, bi_off = matrices.get("bi_enabled", {}), matrices.get("bi_disabled", {})
    connectivity = matrices.get("connectivity", {})
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            can = access.get((a, b))
            if can is None and a in connectivity and b < len(connectivity[a]):
                can = connectivity[a][b] == 1
            pair = {"a": a, "b": b, "can_access": can, "enabled": None, "disabled": None, "state": None}
            for on, off in ((uni_on, uni_off), (bi_on, bi_off)):
                if a in on and a in off and b < len(on[a]) and b < len(off[a]):
                    pair["enabled"], pair["disabled"] = on[a][b], off[a][b]
                    break
            if can is False:
                pair["state"] = "no_p2p"
            elif pair["enabled"] is not None and pair["disabled"]:
                ratio = pair["enabled"] / pair["disabled"]
                pair["ratio"] = round(ratio, 3)
                pair["state"] = "broken" if ratio < BROKEN_SHARE or pair["enabled"] <= 0.01 else "ok"
            pairs.append(pair)
    return [{"kind": "p2p_bandwidth", "devices": {str(k): v for k, v in devices.items()}, "gpus": list(range(n)),
             "measured": bool(uni_on or bi_on), "pairs": pairs,
             "broken": [p for p in pairs if p["state"] == "broken"],
             "no_p2p": [p for p in pairs if p["state"] == "no_p2p"]}]


# --- reading a whole paste -----------------------------------------------------------------------------------------

_PARSERS = {"topo_matrix": parse_topo_matrix, "topo_p2p": parse_topo_p2p, "lspci": parse_lspci,
            "iommu": parse_iommu, "nccl": parse_nccl, "p2p_bandwidth": parse_p2p_bandwidth}


def read(text: str) -> list[dict[str, Any]]:
    """Every piece of evidence in a pasted text. Unreadable when it holds none, or when a kind is there but cut
    (its sentence names the kind and what to paste)."""
    if "\x00" in text:
        raise Unreadable("it looks binary (it has NUL bytes), not a pasted command output.")
    if not text.strip():
        raise Unreadable("it is empty.")
    kinds = detect(text)
    if not kinds:
        raise Unreadable("no nvidia-smi topo, lspci, kernel command line or IOMMU message, NCCL debug output or "
                         "p2pBandwidthLatencyTest output in it; see docs/p2p.md for what to paste.")
    evidence = []
    for kind in kinds:
        evidence += _PARSERS[kind](text)
    return evidence


# --- deciding ---------------------------------------------------------------------------------------------------------


def _pairs_in(pairs: Iterable[dict[str, Any]], gpus: set[int] | None) -> list[dict[str, Any]]:
    return [p for p in pairs if gpus is None or (p["a"] in gpus and p["b"] in gpus)]


def decide(evidence: Sequence[dict[str, Any]], gpus: Iterable[int] | None = None) -> dict[str, Any]:
    """The NCCL set the evidence supports: a dict with verdict (pcie_p2p, pcie_shm or unknown; "stuck" only from the
    preflight's allreduce evidence), reason, fix, missing (what would decide an unknown), rules (ids of RULES that
    fired, the deciding one first),
    contradictions, notes, and the IOMMU and ACS state it read. `gpus` (nvidia-smi indices) limits the pairs of
    topo -p2p and p2pBandwidthLatencyTest judged; lspci names GPUs by PCI address, so its bridges are judged for
    every GPU it shows."""
    wanted = set(gpus) if gpus is not None else None
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for item in evidence:
        by_kind.setdefault(item["kind"], []).append(item)
    fired: list[str] = []
    notes: list[str] = []
    contradictions: list[str] = []

    # Functional evidence first: what NCCL and the bandwidth test saw outranks the static state.
    nccl = by_kind.get("nccl", [])
    nccl_p2p_checked = [n for n in nccl if n["p2p_used"] and n["data_check_ok"] is not None]
    nccl_failed = [n for n in nccl_p2p_checked if not n["data_check_ok"]]
    nccl_ok = [n for n in nccl_p2p_checked if n["data_check_ok"]]
    bandwidth = by_kind.get("p2p_bandwidth", [])
    bw_pairs = [p for b in bandwidth for p in _pairs_in(b["pairs"], wanted)]
    bw_broken = [p for p in bw_pairs if p["state"] == "broken"]
    bw_no_p2p = [p for p in bw_pairs if p["state"] == "no_p2p"]
    bw_ok = bool(bw_pairs) and all(p["state"] == "ok" for p in bw_pairs)
    topo_p2p = by_kind.get("topo_p2p", [])
    driver_no = [p for t in topo_p2p for p in _pairs_in(t["not_ok"], wanted)]
    iommu = _merge_iommu(by_kind.get("iommu", []), by_kind.get("lspci", []))
    acs = _acs_state(by_kind.get("lspci", []))

    for item in by_kind.get("lspci", []):
        notes += item["notes"]
    notes += iommu["notes"]
    for item in nccl:
        if item["env"].get("NCCL_P2P_DISABLE") == "1":
            notes.append("the NCCL log ran with NCCL_P2P_DISABLE=1: its transports say nothing about P2P")
        if item["families"] == ["SHM"]:
            notes.append("NCCL chose SHM for these GPUs (beyond its P2P level, or P2P disabled): that is its "
                         "choice, not a symptom")

    hang_state = acs["redirect_on_path"] and iommu["translating"] is True

    def result(verdict: str, rule_id: str, reason: str, fix: str = "", missing: Sequence[str] = ()) -> dict:
        fired.insert(0, rule_id)
        return {"verdict": verdict, "reason": reason, "fix": fix, "missing": list(missing),
                "rules": list(dict.fromkeys(fired)), "contradictions": contradictions, "notes": notes,
                "iommu": {k: iommu[k] for k in ("mode", "translating", "shown_by")},
                "acs": {k: acs[k] for k in ("known", "redirect_on_path", "redirect_bridges", "path_known")}}

    if hang_state:
        fired.append("acs-redirect-iommu-translating")
    runs = by_kind.get("allreduce", [])
    if runs:
        decided = _decide_allreduce(runs, hang_state, acs, result, notes, contradictions)
        if decided is not None:
            return decided
    if nccl_failed:
        if nccl_ok:
            contradictions.append("one nccl-tests run over P2P passed its data check and another failed it")
        return result(VERDICT_SHM, "nccl-data-check-failed",
                      "an nccl-tests run over P2P reported wrong values: the peer copies corrupt data.",
                      _rule("nccl-data-check-failed")["fix"] + _bridge_fix(acs))
    if nccl_ok:
        if hang_state:
            contradictions.append("the static state is the one that hung elsewhere (ACS redirect with the IOMMU "
                                  "translating), yet an all-reduce over P2P passed its data check here; the "
                                  "functional test decides")
        if bw_broken:
            contradictions.append("p2pBandwidthLatencyTest shows broken P2P bandwidth while the all-reduce passed")
        return result(VERDICT_P2P, "nccl-data-check-ok",
                      "an all-reduce over P2P completed and passed nccl-tests' data check.")
    if bw_broken:
        worst = min(bw_broken, key=lambda p: p["ratio"])
        return result(VERDICT_SHM, "bandwidth-broken",
                      f"p2pBandwidthLatencyTest: GPU{worst['a']}->GPU{worst['b']} moves {worst['enabled']:g} GB/s "
                      f"with P2P against {worst['disabled']:g} GB/s through host memory "
                      f"({len(bw_broken)} pair(s) below half).",
                      _rule("bandwidth-broken")["fix"])
    if driver_no or bw_no_p2p:
        pair = (driver_no or bw_no_p2p)[0]
        said = f"topo -p2p says {pair['status']} ({pair['meaning']})" if driver_no else "'CANNOT Access Peer'"
        return result(VERDICT_SHM, "driver-no-p2p", f"the driver reports no peer access between GPU{pair['a']} "
                      f"and GPU{pair['b']}: {said}.", _rule("driver-no-p2p")["fix"])
    faults = ""
    if iommu["nvidia_faults"]:
        fired.append("iommu-faults")
        faults = (f"the kernel logged {len(iommu['nvidia_faults'])} IOMMU fault(s) from NVIDIA device(s), first "
                  f"{iommu['nvidia_faults'][0]['device'] or 'unknown'}: the IOMMU translates and drops GPU DMA")
    if faults and not hang_state:
        return result(VERDICT_SHM, "iommu-faults", faults + ".", _rule("iommu-faults")["fix"])
    if hang_state:
        where = ", ".join(acs["redirect_bridges"]) or "bridges whose place the paste does not show"
        if bw_ok and not faults:
            contradictions.append("p2pBandwidthLatencyTest moved data at P2P speed in the state that hung "
                                  "elsewhere; that test does not check the data")
            return result(VERDICT_UNKNOWN, "bandwidth-healthy",
                          "ACS redirect with the IOMMU translating (the state of the public hangs), but the "
                          "bandwidth test ran at P2P speed; only a data-checked all-reduce decides.",
                          missing=["a data-checked all-reduce over P2P (nccl-tests all_reduce_perf -g N with "
                                   "NCCL_DEBUG=INFO: its #wrong column and the 'Out of bounds values' line)"])
        return result(VERDICT_SHM, "acs-redirect-iommu-translating",
                      f"ACS request/completion redirect on {where} while the IOMMU translates "
                      f"({iommu['shown_by']}): the state of the public P2P all-reduce hangs"
                      + (f"; {faults}." if faults else "."),
                      _rule("acs-redirect-iommu-translating")["fix"] + _bridge_fix(acs))
    if bw_ok:
        return result(VERDICT_P2P, "bandwidth-healthy",
                      "p2pBandwidthLatencyTest: every pair moves at least half its host-path bandwidth with P2P "
                      "(the test does not check the data).")
    # Static evidence: the hang needs both halves; one half shown absent is enough for P2P.
    if acs["known"] and acs["redirect_on_path"] and iommu["translating"] is False:
        return result(VERDICT_P2P, "acs-redirect-iommu-not-translating",
                      f"ACS redirect on {', '.join(acs['redirect_bridges']) or 'some bridges'}, but the IOMMU is "
                      f"{iommu['mode']} ({iommu['shown_by']}): peer traffic is redirected, not dropped. Not proven "
                      "by a functional test.", _rule("acs-redirect-iommu-not-translating")["fix"]
                      + _bridge_fix(acs))
    if acs["known"] and not acs["redirect_on_path"]:
        what = "SrcValid+ only" if acs["srcvalid_only"] else "no redirect bit set"
        return result(VERDICT_P2P, "no-acs-redirect",
                      f"no bridge {'above the GPUs ' if acs['path_known'] else ''}has ACS request/completion "
                      f"redirect ({what}): the cause of the public hangs is absent. Not proven by a functional test.")
    if iommu["translating"] is False:
        return result(VERDICT_P2P, "iommu-not-translating",
                      f"the IOMMU is {iommu['mode']} ({iommu['shown_by']}): redirected peer traffic is not "
                      "translated, the cause of the public hangs is absent. Not proven by a functional test.")
    missing = []
    if not acs["known"]:
        missing.append("the ACS state of the bridges above the GPUs (sudo lspci -vvv, as root)")
    if iommu["translating"] is None:
        missing.append("the IOMMU mode (cat /proc/cmdline, and journalctl -k -b | grep -i -e iommu -e dmar "
                       "-e amd-vi)")
    missing.append("or a functional test: nccl-tests all_reduce_perf with NCCL_DEBUG=INFO (data-checked), or "
                   "p2pBandwidthLatencyTest")
    if topo_p2p:
        fired.append("driver-ok-proves-nothing")
        notes.append("the driver's topo -p2p OK is no proof: it sat beside the hangs")
    if any(b.get("can_access") for b in bw_pairs) and not any(b["measured"] for b in bandwidth):
        fired.append("driver-ok-proves-nothing")
    if by_kind.get("topo_matrix"):
        fired.append("topology-only")
    for item in nccl:
        if item["p2p_used"] and item["data_check_ok"] is None:
            notes.append("NCCL connected over P2P, but the log has no completed, data-checked collective: a hang "
                         "cannot be told from a log that stops")
        notes += item["notes"]
    if acs["redirect_on_path"]:
        reason = (f"ACS redirect on {', '.join(acs['redirect_bridges']) or 'some bridges'}; whether the IOMMU "
                  "translates decides if that is the state of the public hangs.")
    elif iommu["translating"]:
        reason = "the IOMMU translates; whether a bridge above the GPUs redirects peer traffic (ACS) decides."
    elif by_kind.get("topo_matrix") and len(by_kind) == 1:
        reason = "the topology alone decides nothing: SYS pairs worked and PHB/NODE pairs hung in public reports."
    else:
        reason = "nothing in it shows the ACS or IOMMU state, or a functional result."
    return result(VERDICT_UNKNOWN, "incomplete", reason, missing=missing)


def _run_outcome(run: dict[str, Any]) -> str:
    if run["result"] == "ok":
        return "wrong values" if run.get("data_check") is False else "passed"
    return f"{'hung' if run['result'] == 'hang' else 'failed'}: {run.get('error') or 'no message'}"


def _decide_allreduce(runs: Sequence[dict[str, Any]], hang_state: bool, acs: dict[str, Any], result,
                      notes: list[str], contradictions: list[str]) -> dict[str, Any] | None:
    """The verdict of the preflight's own all-reduce runs (kind allreduce), or None when they decide nothing (the P2P
    run skipped): then the pasted and static evidence decides as without them."""
    p2p_runs = [r for r in runs if r["p2p"] and r["result"] != "skipped"]
    shm_runs = [r for r in runs if not r["p2p"] and r["result"] != "skipped"]
    fix_hang = (_rule("acs-redirect-iommu-translating")["fix"] + _bridge_fix(acs)) if hang_state else \
        f"{FIX_BIOS_ACS}; {FIX_IOMMU}; {FIX_SHM}"
    where = (f"; the host is in the state of the public hangs (ACS redirect on "
             f"{', '.join(acs['redirect_bridges']) or 'a bridge'} while the IOMMU translates)") if hang_state else ""
    stuck = [r for r in runs if r.get("gpus_answer") is False]
    if stuck:
        run = stuck[0]
        ended = "hung" if run["result"] == "hang" else "failed"
        when = "before any all-reduce ran" if run["result"] == "skipped" else \
            f"after the {'P2P' if run['p2p'] else 'control'} all-reduce {ended}"
        return result(VERDICT_STUCK, "gpus-stuck", f"the GPUs do not answer {when} "
                      f"({run.get('answer') or 'nvidia-smi fails'}){where}.", f"{FIX_REBOOT} {fix_hang}")
    control_ok = [r for r in shm_runs if r["result"] == "ok" and r.get("data_check")]
    p2p_ok = [r for r in p2p_runs if r["result"] == "ok" and r.get("data_check")]
    if shm_runs and not control_ok and not p2p_ok:
        return result(VERDICT_UNKNOWN, "allreduce-control-failed",
                      f"the control all-reduce without P2P did not pass either ({_run_outcome(shm_runs[0])}): NCCL or "
                      "the GPUs fail without P2P too, which no NCCL set fixes.",
                      missing=["an all-reduce that passes with NCCL_P2P_DISABLE=1: look at the GPUs, the driver and "
                               "NCCL (nvidia-smi, journalctl -k -b, NCCL_DEBUG=INFO)"])
    base = control_ok[0].get("busbw_gbps") if control_ok else None
    control = f"; without P2P it passed at {base:g} GB/s" if base else ""
    hung = [r for r in p2p_runs if r["result"] == "hang"]
    if hung:
        run = hung[0]
        how = (f"hung on an earlier boot on this hardware in this ACS/IOMMU state ({run['recorded']}) and was not "
               "run again") if run.get("recorded") else \
            f"did not finish and was killed ({run.get('error') or 'no progress'})"
        return result(VERDICT_SHM, "allreduce-p2p-hang", f"the all-reduce over P2P {how}{control}{where}.", fix_hang)
    wrong = [r for r in p2p_runs if r["result"] == "ok" and r.get("data_check") is False]
    if wrong:
        return result(VERDICT_SHM, "allreduce-p2p-data-check-failed",
                      f"the all-reduce over P2P finished with wrong values: the peer copies corrupt data{control}"
                      f"{where}.", fix_hang)
    errors = [r for r in p2p_runs if r["result"] == "error"]
    if errors:
        return result(VERDICT_SHM, "allreduce-p2p-error",
                      f"the all-reduce over P2P failed ({errors[0].get('error') or 'no message'}){control}{where}.",
                      fix_hang)
    if not p2p_ok:
        return None
    run = p2p_ok[0]
    bw = run.get("busbw_gbps")
    if bw is not None and base and bw < BROKEN_SHARE * base:
        return result(VERDICT_SHM, "allreduce-p2p-slower",
                      f"the all-reduce over P2P moved {bw:g} GB/s, below half of the {base:g} GB/s it moved without "
                      "P2P: P2P is broken here, not merely slower.", _rule("allreduce-p2p-slower")["fix"]
                      + _bridge_fix(acs))
    if hang_state:
        contradictions.append("the static state is the one that hung elsewhere (ACS redirect with the IOMMU "
                              "translating), yet the all-reduce over P2P passed its data check here; the functional "
                              "test decides")
    if bw is not None and base and bw < base:
        notes.append(f"P2P moved {bw:g} GB/s, less than the {base:g} GB/s without P2P (still more than half)")
    if acs["redirect_on_path"] and not hang_state:
        notes.append("ACS redirect sends peer traffic through the root complex: "
                     + _rule("acs-redirect-iommu-not-translating")["fix"] + _bridge_fix(acs))
    if run.get("transports") and "P2P" not in run["transports"]:
        notes.append(f"NCCL took {', '.join(run['transports'])} for every ring step although P2P was allowed (its "
                     "P2P level or the topology): the run shows what serving with this set does, not P2P")
    return result(VERDICT_P2P, "allreduce-p2p-ok",
                  f"the all-reduce over P2P passed its data check"
                  f"{f' at {bw:g} GB/s bus bandwidth' if bw is not None else ''}{control}.")


def allreduce_evidence(run: dict[str, Any], p2p: bool, gpus_answer: bool | None = None, answer: str | None = None,
                       recorded: str | None = None, transports: Sequence[str] | None = None) -> dict[str, Any]:
    """One run of the preflight's all-reduce (p2p-allreduce-check's JSON line, roles/sglang_service/files) as evidence
    for decide(), kind allreduce: with P2P allowed or not, its result (ok, hang, error, or skipped), data check, bus
    bandwidth, whether the GPUs answered after it (False: stuck) and why, a hang recorded on an earlier boot instead
    of a run, and the NCCL transport families its log showed."""
    return {"kind": "allreduce", "p2p": p2p, "label": run.get("label"), "result": run.get("result") or "error",
            "phase": run.get("phase"), "data_check": run.get("data_check"), "busbw_gbps": run.get("busbw_gbps"),
            "seconds": run.get("seconds"), "error": run.get("error"), "gpus": run.get("gpus"),
            "gpus_answer": gpus_answer, "answer": answer, "recorded": recorded,
            "transports": list(transports) if transports else None}


def sysfs_iommu_evidence(entries: Sequence[str], where: str = "/sys/class/iommu") -> dict[str, Any]:
    """/sys/class/iommu as evidence (kind iommu): no entry means the kernel set up no IOMMU (off, whatever its 'Default
    domain type' line says); entries (ivhd0, dmar0) mean one is on, its mode shown by the command line and messages."""
    names = sorted(entries)
    return {"kind": "iommu", "mode": None if names else "off", "translating": None if names else False,
            "hardware": "on" if names else None, "default_domain": None, "cmdline": None, "params": {},
            "source": [f"{where} {'lists ' + ', '.join(names[:4]) if names else 'is empty'}"], "faults": [],
            "nvidia_faults": [], "notes": []}


def _bridge_fix(acs: dict[str, Any]) -> str:
    if not acs["redirect_bridges"]:
        return ""
    return (f". Runtime: {setpci_fix(acs['redirect_bridges'])} (as root, after each boot); "
            f"boot-time: {cmdline_fix(acs['redirect_bridges'])}")


def _merge_iommu(items: Sequence[dict[str, Any]], lspci: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One IOMMU state from every kernel command line and message pasted (and lspci's IOMMU group lines)."""
    modes = [i["mode"] for i in items if i["mode"]]
    faults = [f for i in items for f in i["nvidia_faults"]]
    notes = [note for i in items for note in i["notes"]]
    shown_by = ", ".join(dict.fromkeys(s for i in items for s in i["source"])) or None
    mode = None
    for candidate in ("off", "passthrough", "translated", "on"):
        if candidate in modes:
            mode = candidate
            break
    if "translated" in modes and ("off" in modes or "passthrough" in modes):
        notes.append("the pasted kernel lines disagree on the IOMMU mode (two boots?); the command line's off or "
                     "passthrough is taken")
    if mode is None and any(item["iommu_groups_seen"] for item in lspci):
        mode = "on"
        shown_by = "lspci's IOMMU group lines"
        notes.append("lspci shows IOMMU groups, so the IOMMU is on; its mode is not shown")
    translating = {"translated": True, "off": False, "passthrough": False}.get(mode or "")
    return {"mode": mode, "translating": translating, "shown_by": shown_by, "nvidia_faults": faults,
            "notes": list(dict.fromkeys(notes))}


def _acs_state(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether ACS redirect is on a bridge that matters: above a GPU when the paste shows which bridges those are
    (with its -vvv bus ranges or a tree), otherwise any bridge (a grep of ACSCtl says nothing about where)."""
    known = False
    redirect_bridges: list[str] = []
    loose_redirect = False
    path_known = False
    all_flags: list[dict[str, bool]] = []
    for item in items:
        with_acs = [b for b in item["bridges"] if b["acs_ctl"] is not None]
        above = {bdf for gpu in item["gpus"] for bdf in gpu["bridges_above"]}
        # Which bridges sit above the GPUs is known only when the paste shows the GPUs and their bus ranges;
        # otherwise every redirecting bridge counts.
        item_path_known = bool(above) and bool(with_acs)
        path_known = path_known or item_path_known
        for bridge in with_acs:
            known = True
            all_flags.append(bridge["acs_ctl"])
            if bridge["redirect"] and (not item_path_known or bridge["bdf"] in above):
                redirect_bridges.append(bridge["bdf"])
        for device in item["acs_devices"]:
            known = True
            all_flags.append(device["acs_ctl"])
        for loose in item["loose_acs"]:
            known = True
            all_flags.append(loose["acs_ctl"])
            loose_redirect = loose_redirect or bool(loose["redirect"])
    srcvalid_only = bool(all_flags) and any(f.get("SrcValid") for f in all_flags) and not any(
        _redirect(f) for f in all_flags)
    return {"known": known, "redirect_on_path": bool(redirect_bridges) or loose_redirect,
            "redirect_bridges": sorted(set(redirect_bridges)), "path_known": path_known,
            "srcvalid_only": srcvalid_only}


# --- one line per piece of evidence -------------------------------------------------------------------------------


def describe(item: dict[str, Any]) -> str:
    """One line saying what a piece of evidence holds (the CLI prints it per file; the preflight can record it)."""
    kind = item["kind"]
    if kind == "topo_matrix":
        links = ", ".join(f"GPU{p['a']}-GPU{p['b']} {p['link']}" for p in item["pairs"][:12])
        more = f" (+{len(item['pairs']) - 12} pairs)" if len(item["pairs"]) > 12 else ""
        nics = f"; NICs: {', '.join(f'{n} ({v})' if v else n for n, v in item['nics'].items())}" if item["nics"] \
            else ""
        return f"nvidia-smi topo -m: {len(item['gpus'])} GPU(s){': ' + links + more if links else ''}{nics}"
    if kind == "topo_p2p":
        cap = f" {item['capability']}" if item["capability"] else ""
        bad = sorted({f"{p['status']} ({p['meaning']})" for p in item["not_ok"]})
        return (f"nvidia-smi topo -p2p{cap}: {len(item['gpus'])} GPUs, "
                + (f"not OK: {', '.join(bad)}" if bad else "OK between every pair"))
    if kind == "lspci":
        parts = []
        with_acs = [b for b in item["bridges"] if b["acs_ctl"] is not None]
        redirect = [b["bdf"] for b in with_acs if b["redirect"]]
        if with_acs:
            parts.append(f"{len(with_acs)} bridge(s) with ACS" + (f", redirect on {', '.join(redirect)}"
                                                                  if redirect else ", no redirect"))
        if item["loose_acs"]:
            on = sum(1 for a in item["loose_acs"] if a["redirect"])
            sv = sum(1 for a in item["loose_acs"] if a["acs_ctl"].get("SrcValid"))
            parts.append(f"{len(item['loose_acs'])} ACSCtl line(s) without device: {on} with redirect, "
                         f"{sv} with SrcValid+")
        for gpu in item["gpus"]:
            bar = f" BAR1 {_size_text(gpu['bar1_bytes'])}" if gpu["bar1_bytes"] else ""
            under = f" under {', '.join(gpu['bridges_above'])}" if gpu["bridges_above"] else ""
            parts.append(f"GPU {gpu['bdf']}{bar}{under}")
        if item["iommu_groups_seen"]:
            parts.append("IOMMU groups present")
        return f"lspci ({item['form'] or 'blocks'}): " + ("; ".join(parts) or "no bridge, GPU or ACS line")
    if kind == "iommu":
        mode = {"off": "off", "passthrough": "passthrough", "translated": "translating", "on": "on (mode not shown)",
                None: "not shown"}[item["mode"]]
        parts = [f"IOMMU {mode}"]
        if item["params"]:
            parts.append("command line: " + " ".join(f"{k}={v}" for k, v in item["params"].items()))
        if item["default_domain"]:
            parts.append(f"default domain {item['default_domain']}")
        if item["faults"]:
            parts.append(f"{len(item['faults'])} IOMMU fault line(s), {len(item['nvidia_faults'])} from NVIDIA")
        return "kernel: " + "; ".join(parts)
    if kind == "nccl":
        transports = ", ".join(f"{via} x{n}" for via, n in item["transports"].items()) or "no channel lines"
        version = f"NCCL {item['version']}: " if item["version"] else "NCCL: "
        result = item["results"]
        tested = ""
        if result["rows"] or result["out_of_bounds"]:
            oob = result["out_of_bounds"]
            tested = (f"; nccl-tests {result['rows']} result row(s), "
                      + (f"out of bounds {oob['count']} {'OK' if oob['ok'] else 'FAILED'}" if oob
                         else f"{result['wrong_rows']} with errors"))
        warns = f"; {len(item['warnings'])} WARN line(s)" if item["warnings"] else ""
        return version + transports + tested + warns
    if kind == "allreduce":
        what = f"all-reduce {'with P2P' if item['p2p'] else 'without P2P (control)'}"
        if item["result"] == "skipped":
            return f"{what}: not run ({item.get('error') or 'skipped'})"
        if item.get("recorded"):
            return f"{what}: hung on an earlier boot in this state ({item['recorded']}), not run again"
        parts = [item["result"]]
        if item["data_check"] is not None:
            parts.append("data check " + ("passed" if item["data_check"] else "FAILED"))
        if item["busbw_gbps"] is not None:
            parts.append(f"{item['busbw_gbps']:g} GB/s bus bandwidth")
        if item["seconds"] is not None:
            parts.append(f"{item['seconds']:g} s")
        if item["error"]:
            parts.append(item["error"])
        if item.get("transports"):
            parts.append("NCCL via " + ", ".join(item["transports"]))
        if item.get("gpus_answer") is not None:
            parts.append("GPUs answer afterwards" if item["gpus_answer"] else
                         f"GPUs do NOT answer afterwards ({item.get('answer') or 'nvidia-smi fails'})")
        return f"{what}: " + "; ".join(parts)
    if kind == "p2p_bandwidth":
        if not item["measured"]:
            return f"p2pBandwidthLatencyTest: {len(item['gpus'])} GPUs, access lines only (no bandwidth matrix)"
        ratios = [p["ratio"] for p in item["pairs"] if p.get("ratio") is not None]
        low = f", lowest P2P/host ratio {min(ratios):g}" if ratios else ""
        return (f"p2pBandwidthLatencyTest: {len(item['gpus'])} GPUs, {len(item['broken'])} broken pair(s), "
                f"{len(item['no_p2p'])} without peer access{low}")
    return kind
