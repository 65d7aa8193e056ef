#!/usr/bin/env python3
"""Device nodes standing in for the NVIDIA driver's /dev/nvidia*, with the driver's own numbers.

    devnodes.py DIR [--gpus N]     create them under DIR (as root), print what was made

The open driver registers `nvidia` (minors 0..N-1 = /dev/nvidiaN) and `nvidiactl` (minor 255) on the fixed
major 195, /dev/nvidia-modeset is 195:254; `nvidia-caps` (MIG capabilities, /dev/nvidia-caps/nvidia-capN)
and `nvidia-uvm` (minor 0, nvidia-uvm-tools minor 1) get dynamic majors from register_chrdev(0, ...),
caps first (nvidia.ko) and uvm after (nvidia-uvm.ko). The kernel hands out dynamic majors from 254 down
to 234, then from 511 down to 384 (fs/char_dev.c find_dynamic_major); `dynamic_majors` does the same
against this kernel's /proc/devices, so a stand-in node never shares a major with a real driver here
and opening it ends in the kernel's driver lookup (ENXIO): every check before that — the node's mode,
the mount, the device cgroup — is the real one. Modes as the driver makes them (NVreg_DeviceFileMode
0666; nvidia-cap1 = mig/config 0400, nvidia-cap2 = mig/monitor 0444).
"""

from __future__ import annotations

import argparse
import os
import stat

NVIDIA_MAJOR = 195


def used_char_majors(proc_devices: str) -> set[int]:
    used, char = set(), False
    for line in proc_devices.splitlines():
        if line.strip() == "Character devices:":
            char = True
        elif line.strip() == "Block devices:" or not line.strip():
            char = False
        elif char and line.split()[0].isdigit():
            used.add(int(line.split()[0]))
    return used


def dynamic_majors(proc_devices: str, count: int) -> list[int]:
    """The next `count` majors register_chrdev(0, ...) would hand out, in order."""
    used = used_char_majors(proc_devices) | {NVIDIA_MAJOR}
    out = []
    for major in [*range(254, 233, -1), *range(511, 383, -1)]:
        if major not in used:
            out.append(major)
            used.add(major)
            if len(out) == count:
                return out
    raise RuntimeError("no free dynamic character-device major left")


def nodes(gpus: int, proc_devices: str) -> list[tuple[str, int, int, int]]:
    """(path relative to /dev, major, minor, mode) for every node the driver makes."""
    caps, uvm = dynamic_majors(proc_devices, 2)
    out = [(f"nvidia{i}", NVIDIA_MAJOR, i, 0o666) for i in range(gpus)]
    out += [("nvidiactl", NVIDIA_MAJOR, 255, 0o666), ("nvidia-modeset", NVIDIA_MAJOR, 254, 0o666),
            ("nvidia-uvm", uvm, 0, 0o666), ("nvidia-uvm-tools", uvm, 1, 0o666),
            ("nvidia-caps/nvidia-cap1", caps, 1, 0o400), ("nvidia-caps/nvidia-cap2", caps, 2, 0o444)]
    return out


def read_proc_devices() -> str:
    with open("/proc/devices", encoding="ascii") as fh:
        return fh.read()


def create(root: str, gpus: int, proc_devices: str | None = None) -> list[str]:
    made = []
    for rel, major, minor, mode in nodes(gpus, proc_devices if proc_devices is not None else read_proc_devices()):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(path, mode)
            made.append(f"{path} c {major}:{minor} {mode:04o}")
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    for made in create(args.dir, args.gpus):
        print(made)


if __name__ == "__main__":
    main()
