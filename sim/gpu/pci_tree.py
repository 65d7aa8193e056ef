"""The lab host's PCI devices as Linux's sysfs shows them (not the kernel's: files a test or the lab writes).

A PCIe server with 8 GPUs (the bus ids sim/gpu/nvidia-smi gives them, read from it, not copied), in one of two
topologies (TOPOLOGIES): "two-sockets" (the default): two root ports, one per CPU socket, each with a PCIe switch
whose four downstream ports hold four GPUs (GPUs 0-3 on the first socket, 4-7 on the second); "one-switch": one root
port on the first socket with one switch whose eight downstream ports hold all eight GPUs. An NVMe drive and a NIC
each under a root port of its own, in both. `nvidia-smi topo -m` and the lspci stand-in (sim/gpu/pcie_sim.py) read
the links from this tree.
Each device has what sysfs gives a PCIe function: `vendor`, `device`, `class`, and the link files
`current_link_speed`, `current_link_width`, `max_link_speed`, `max_link_width` ("32.0 GT/s PCIe", "16").
`ROOT/sys/bus/pci/devices/<domain:bus:dev.fn>` is a relative symlink to the device's directory under
`ROOT/sys/devices/pci<domain>:<bus>/...`, its bridges' directories above it, as in sysfs.

The link files are written once, at the trained speed: a simulated GPU does not lower its link speed when idle as
a real one does (that case is the watcher's unit tests'). `downtrain` is the fault `sim/lab/lab.py fault HOST
pcie-downtrain` writes: the GPU's link, seen from both of its ends (the GPU and the switch port above it), trained
slower and narrower.

    python3 pci_tree.py ROOT [--topology T] [BUS ...]   write the tree under ROOT (BUS: the GPUs' pci.bus_id, in
                                                        order; T: two-sockets or one-switch), replacing any tree
    python3 pci_tree.py ROOT --downtrain BUS SPEED WIDTH   the link of the GPU at BUS trained at SPEED GT/s, xWIDTH
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from pathlib import Path

GEN5 = "32.0 GT/s PCIe"
GEN4 = "16.0 GT/s PCIe"
GPU = ("0x10de", "0x2bb5", "0x030200")  # NVIDIA, RTX PRO 6000 Blackwell Server Edition, 3D controller
SWITCH_UP = ("0x1000", "0xc030", "0x060400")  # Broadcom PEX890xx switch ports: PCI bridges
SWITCH_DOWN = SWITCH_UP
ROOT_PORT = ("0x1022", "0x14ab", "0x060400")  # AMD root port: a PCI bridge
NVME = ("0x144d", "0xa80c", "0x010802")  # NVMe controller
NIC = ("0x15b3", "0x1021", "0x020000")  # ConnectX-7, Ethernet controller
TOPOLOGIES = ("two-sockets", "one-switch")


def gpu_bus_ids() -> list[str]:
    """The 8 GPUs' pci.bus_id as the lab's nvidia-smi gives them (its table, read from the script itself)."""
    path = Path(__file__).resolve().with_name("nvidia-smi")
    loader = importlib.machinery.SourceFileLoader("sim_nvidia_smi", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return [f"00000000:{bus}:00.0" for bus in module.BUS_IDS]


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's 00000000:41:00.0 -> sysfs's 0000:41:00.0."""
    domain, rest = bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


# One device of the tree: its path of addresses from the root port down, (vendor, device, class), speed, width.
Entry = tuple[list[str], tuple[str, str, str], str, int]


def layout(bus_ids: list[str], topology: str = "two-sockets") -> list[Entry]:
    """Every device: (its path of addresses from the root port down, (vendor, device, class), speed, width)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: give one of {', '.join(TOPOLOGIES)}")
    gpus = [sysfs_address(b) for b in bus_ids]
    if topology == "one-switch":
        switches = [("0000:00:01.1", "0000:10:00.0", [f"0000:11:{d:02x}.0" for d in range(0, 64, 8)], gpus)]
    else:
        switches = [("0000:00:01.1", "0000:10:00.0", [f"0000:11:{d:02x}.0" for d in (0, 8, 16, 24)], gpus[:4]),
                    ("0000:80:01.1", "0000:90:00.0", [f"0000:91:{d:02x}.0" for d in (0, 8, 16, 24)], gpus[4:8])]
    out = []
    for root_port, up, downs, below in switches:
        out += [([root_port], ROOT_PORT, GEN5, 16), ([root_port, up], SWITCH_UP, GEN5, 16)]
        for down, gpu in zip(downs, below, strict=False):
            out += [([root_port, up, down], SWITCH_DOWN, GEN5, 16), ([root_port, up, down, gpu], GPU, GEN5, 16)]
    out += [(["0000:00:03.1"], ROOT_PORT, GEN4, 4), (["0000:00:03.1", "0000:05:00.0"], NVME, GEN4, 4),
            (["0000:80:03.1"], ROOT_PORT, GEN5, 16), (["0000:80:03.1", "0000:85:00.0"], NIC, GEN5, 16)]
    return out


def write(root: str, bus_ids: list[str], topology: str = "two-sockets") -> None:
    """The tree under ROOT/sys, replacing the one there (a topology changed by `sim/lab/lab.py p2p` leaves no device
    of the old one behind)."""
    entries = layout(bus_ids, topology)
    for old in (Path(root, "sys", "bus", "pci", "devices"), *Path(root, "sys", "devices").glob("pci[0-9a-f]*:*")):
        if old.is_dir():
            shutil.rmtree(old)
    devices = Path(root, "sys", "bus", "pci", "devices")
    devices.mkdir(parents=True, exist_ok=True)
    for chain, (vendor, device, klass), speed, width in entries:
        host_bridge = f"pci{chain[0][:7]}"  # pci0000:00
        directory = Path(root, "sys", "devices", host_bridge, *chain)
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass),
                            ("current_link_speed", speed), ("max_link_speed", speed),
                            ("current_link_width", str(width)), ("max_link_width", str(width))):
            (directory / name).write_text(value + "\n")
        link = devices / chain[-1]
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(directory, devices))


def downtrain(root: str, bus_id: str, speed: str, width: int) -> list[str]:
    """The GPU's link retrained at SPEED ("16.0 GT/s PCIe") and WIDTH, seen from the GPU and from the port above it.
    Returns the directories written."""
    gpu = Path(root, "sys", "bus", "pci", "devices", sysfs_address(bus_id)).resolve(strict=True)
    written = []
    for directory in (gpu, gpu.parent):
        (directory / "current_link_speed").write_text(speed + "\n")
        (directory / "current_link_width").write_text(f"{width}\n")
        written.append(str(directory))
    return written


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 5 and args[1] == "--downtrain":
        print("\n".join(downtrain(args[0], args[2], f"{float(args[3]):.1f} GT/s PCIe", int(args[4]))))
    elif len(args) >= 3 and args[1] == "--topology":
        write(args[0], args[3:] or gpu_bus_ids(), args[2])
    elif args:
        write(args[0], args[1:] or gpu_bus_ids())
    else:
        sys.exit(__doc__)
