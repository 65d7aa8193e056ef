#!/usr/bin/env python3
"""The simulated lab's hosts: podman containers with systemd as PID 1, reached over SSH.

    lab.py image [--os debian12,...]   build (or reuse) the host images (default: Debian 12)
    lab.py installed                   build (or reuse) the installed-base image: Debian 12 with what the install
                                       roles put on a host (driver, CUDA, SGLang; not the model), cached by the
                                       hash of that run's inputs
    lab.py up [--name L] --hosts N [--os debian12,debian13] [--router [--monitoring]] [--installed]
                                       start hosts L-1..L-N (+ the shared mirror, serving the apt mirror,
                                       the package index and the Hub stand-in), write an inventory
                                       (default inventory/sim/hosts.yml), wait until each answers Ansible;
                                       --os gives each host its release in turn (L-1 the first, ...);
                                       --router adds host L-router in group routers (the model gateway,
                                       roles/sglang_router) and binds the workers to their lab address;
                                       --monitoring puts L-router in group monitoring too (Prometheus);
                                       --installed starts the workers from the installed-base image
    lab.py reboot HOST                 reboot lab host HOST (e.g. lab-1): the container restarts, systemd boots
                                       again with a new /dev, and only the host's own units set it up again
    lab.py fault HOST xid79 [--gpu N]  GPU N (default 0) of HOST falls off the bus: the kernel's lines go to its journal
                                       and the simulated nvidia-smi and SGLang find the GPU lost until HOST reboots
    lab.py fault HOST xid79-lines [--gpu N]   the same kernel lines only (the GPU keeps answering: an old fault)
    lab.py fault HOST nvme-aer|nic-down       another device's fatal PCIe lines (an NVMe drive, a NIC's link)
    lab.py fault HOST hang             every NCCL collective on HOST hangs (until it reboots): SGLang stops making
                                       progress, with no error
    lab.py fault HOST pcie-downtrain [--gpu N]
                                       GPU N's PCIe link trains at 16 GT/s x8 instead of 32 GT/s x16 (its simulated
                                       sysfs, LAB_SYSFS); hardware: it stays after a reboot, until the next `up`
    lab.py p2p HOST [--topology two-sockets|one-switch] [--acs off|srcvalid|redirect] [--acs-bridge BDF=MODE ...]
                    [--iommu translated|passthrough|off] [--bar1 SIZE] [--after-hang recover|busy|unresponsive]
                    [--reset] [--reboot]
                                       HOST's PCIe peer-to-peer state (sim/gpu/pcie_sim.py): its PCI tree's topology,
                                       ACS control per bridge, the IOMMU mode (kernel command line, /sys/class/iommu,
                                       the kernel's messages), BAR1, and whether a hung P2P all-reduce leaves the GPUs
                                       stuck until a reboot; what is not given stays. It holds across reboots, until
                                       the next `up` (which restores the healthy default). The kernel's messages of the
                                       new state go to the journal at once, as if HOST had booted so; --reboot reboots
                                       it instead (a journal of that boot alone)
    lab.py down [--name L | --all]     remove lab L's hosts (--all: every host, the mirror, the network)
    lab.py status                      list the lab's containers and addresses
    lab.py ssh-config [--inventory P]  print the path of the ssh_config written for that inventory's hosts
                                       (`ssh -F "$(python3 sim/lab/lab.py ssh-config)" lab-1`)

Several labs can live side by side (`make demo` uses "lab"; each molecule scenario its own name).

All state lives under .lab/ (git-ignored). podman runs with the lab's own config files
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF); the machine's global podman configuration stays untouched.
This is test and demo equipment: product code never imports or names it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import devnodes  # noqa: E402  (sim/gpu: the NVIDIA driver's device nodes)
import pci_tree  # noqa: E402  (sim/gpu: the host's PCI devices as sysfs shows them)

REPO = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("MOEFLEET_LAB_DIR", REPO / ".lab"))
HERE = Path(__file__).resolve().parent
PREFIX = "moefleet"
# Podman keeps one netavark run directory per machine (/run/containers/networks: IP allocations and
# aardvark-dns records, keyed by network name) whatever configuration a checkout uses, so each checkout's
# lab network has a name of its own; otherwise two checkouts' hosts and mirrors share DNS records.
LAB_ID = hashlib.sha256(str(LAB.resolve()).encode()).hexdigest()
NETWORK = f"{PREFIX}-net-{LAB_ID[:8]}"
MIRROR = f"{PREFIX}-mirror"
MIRROR_PORT = 8080
INVENTORY = REPO / "inventory" / "sim" / "hosts.yml"
# The driver's device nodes of a lab host (8 GPUs), with the majors this machine's kernel would give the driver:
# the container may make and open nodes on those majors (host_options), and the simulated nvidia-modprobe finds
# nvidia-uvm's there (proc_devices_lines). The lab makes none of them itself: the driver role's unit does.
GPU_NODES = devnodes.nodes(8, devnodes.read_proc_devices())
SSH_KEY = LAB / "ssh" / "id_ed25519"
SSH_CONFIGS = LAB / "ssh_config"
APT_PACKAGES = [
    "podman", "runc", "conmon", "netavark", "aardvark-dns", "containernetworking-plugins",
    "slirp4netns", "uidmap", "fuse-overlayfs", "catatonit", "iptables", "nftables", "debootstrap",
]
# What a lab host has before any role runs: what Ansible needs to manage a real server, nothing more.
IMAGE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "sudo", "iproute2", "procps",
    "curl", "ca-certificates", "openssh-server", "python3-venv", "gnupg",
]
# The host releases the lab can build: its NVIDIA repository layout (sim/mirrors) -> Debian codename.
RELEASES = {"debian12": "bookworm", "debian13": "trixie"}
DEFAULT_OS = "debian12"
IMAGE_SETUP = r"""
set -e
mkdir -p -m 700 /root/.ssh
rm -f /etc/ssh/ssh_host_*
mkdir -p /etc/systemd/system/ssh.service.d
# Host keys are made at each container's first boot, so no two lab hosts share them.
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
  > /etc/systemd/system/ssh.service.d/10-hostkeys.conf
ln -sf /lib/systemd/system/ssh.service /etc/systemd/system/multi-user.target.wants/ssh.service
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
            getty@tty1.service console-getty.service systemd-logind.service; do
  ln -sf /dev/null "/etc/systemd/system/$unit"
done
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


def log(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def podman_env() -> dict[str, str]:
    conf_dir = LAB / "podman"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "networks").mkdir(exist_ok=True)
    (LAB / "run").mkdir(exist_ok=True)
    for name in ("containers.conf", "storage.conf"):
        text = (HERE / f"{name}.in").read_text().replace("@LAB@", str(LAB))
        target = conf_dir / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(conf_dir / "containers.conf")
    env["CONTAINERS_STORAGE_CONF"] = str(conf_dir / "storage.conf")
    return env


def podman(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["podman", *args], env=podman_env(), text=True,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
    )
    if check and result.returncode != 0:
        raise SystemExit(f"lab: podman {' '.join(args[:3])} failed: {(result.stderr or '').strip()}")
    return result


def remove_container(name: str) -> None:
    """podman rm -f, retried: this machine's podman sometimes fails to stop a container whose systemd is still
    shutting down ("container state improper" right after its SIGKILL); the container is gone a moment later."""
    for attempt in range(4):
        result = podman("rm", "-f", "-t", "5", name, check=False)
        if result.returncode == 0 or podman("container", "exists", name, check=False).returncode == 1:
            return
        time.sleep(2 * (attempt + 1))
    raise SystemExit(f"lab: podman rm -f {name} failed: {(result.stderr or '').strip()}")


def ensure_tools() -> None:
    missing = [p for p, exe in (("podman", "podman"), ("debootstrap", "debootstrap")) if not shutil.which(exe)]
    if not missing:
        return
    log(f"{' and '.join(missing)} missing: installing the lab's container tools with apt-get "
        "(podman, runc, netavark, debootstrap, ... without recommends).")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def parse_os(value: str) -> list[str]:
    releases = [r.strip() for r in value.split(",") if r.strip()]
    unknown = [r for r in releases if r not in RELEASES]
    if not releases or unknown:
        raise SystemExit(f"lab: --os {value!r}: give one or more of {', '.join(RELEASES)}, comma-separated")
    return releases


def image_tag(release: str = DEFAULT_OS) -> str:
    # Debian 12's recipe hash is what it was before other releases existed, so its cached image stays valid.
    recipe = [IMAGE_PACKAGES, IMAGE_SETUP] + ([] if release == DEFAULT_OS else [RELEASES[release]])
    return f"localhost/{PREFIX}-{release}:{hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]}"


def build_image(release: str = DEFAULT_OS) -> str:
    """The host image of one release, built with debootstrap once and cached by its recipe's hash."""
    ensure_tools()
    tag = image_tag(release)
    if podman("image", "exists", tag, check=False).returncode == 0:
        log(f"image {tag} is cached")
        return tag
    saved = image_cache_file(tag)
    if saved.is_file():
        started = time.monotonic()
        if podman("load", "-q", "-i", str(saved), check=False).returncode == 0 and \
                podman("image", "exists", tag, check=False).returncode == 0:
            log(f"image {tag} loaded from {saved} in {time.monotonic() - started:.0f} s")
            return tag
        log(f"{saved} did not load; building the image again")
        saved.unlink(missing_ok=True)
    rootfs = LAB / ("rootfs" if release == DEFAULT_OS else f"rootfs-{release}")
    if rootfs.exists():
        shutil.rmtree(rootfs)
    log(f"building the {release} ({RELEASES[release]}) host image with debootstrap (about a minute)")
    started = time.monotonic()
    logname = "debootstrap.log" if release == DEFAULT_OS else f"debootstrap-{release}.log"
    with open(LAB / logname, "w") as out:
        result = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}",
                                 RELEASES[release], str(rootfs)], stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"lab: debootstrap of {RELEASES[release]} failed; see {LAB / logname}")
    subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", IMAGE_SETUP], check=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "--change", 'CMD ["/sbin/init"]', "--change", "STOPSIGNAL SIGRTMIN+3",
                    "--change", "ENV container=podman", "-", tag],
                   stdin=tar.stdout, env=podman_env(), check=True, stdout=subprocess.DEVNULL)
    if tar.wait() != 0:
        raise SystemExit("lab: packing the image's root file system failed")
    shutil.rmtree(rootfs)
    for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
        if old.startswith(f"localhost/{PREFIX}-{release}:") and old != tag:
            podman("rmi", old, check=False)
    log(f"image {tag} built in {time.monotonic() - started:.0f} s")
    _save_to_cache(tag)
    return tag


def image_cache_file(tag: str) -> Path:
    """Where a host image is kept outside the clone: each clone's podman storage is its own (.lab/podman), so a
    fresh clone would run debootstrap again for an image whose recipe (its tag's hash) has not changed. Only the
    debootstrap images are kept (downloads from Debian's archive); the installed-base image is the roles' work and
    is built in each clone. Removing the directory makes the next clone build them again."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "moefleet" / "lab-images" / (tag.rsplit("/", 1)[-1].replace(":", "-") + ".tar")


def _save_to_cache(tag: str) -> None:
    saved = image_cache_file(tag)
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_suffix(".partial")
    partial.unlink(missing_ok=True)  # podman save refuses to overwrite
    if podman("save", "-q", "-o", str(partial), tag, check=False).returncode != 0:
        partial.unlink(missing_ok=True)
        log(f"could not keep {tag} in {saved.parent}; the next clone builds it again")
        return
    partial.replace(saved)  # whole or absent: a clone that loads it never sees half a file
    prefix = saved.name.rsplit("-", 1)[0] + "-"
    for old in saved.parent.glob(f"{prefix}*.tar"):  # an older recipe of the same release
        if old != saved:
            old.unlink(missing_ok=True)


# What the installed-base image holds: the install roles' work (sim/playbooks/installed_base.yml) on a Debian 12
# host. Lab jobs that test serving, rollouts and faults start from it; the install path itself runs from a bare
# host in the default and install scenarios. Its hash covers every input of that run.
INSTALLED_INPUTS = ["roles", "sim/playbooks", "sim/mirrors", "sim/model", "sim/gpu", "inventory/sim/group_vars",
                    "ansible.cfg"]


def installed_tag() -> str:
    digest = hashlib.sha256(image_tag(DEFAULT_OS).encode())
    for top in INSTALLED_INPUTS:
        paths = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return f"localhost/{PREFIX}-{DEFAULT_OS}-installed:{digest.hexdigest()[:12]}"


def build_installed() -> str:
    """The installed-base image: a host brought up from the Debian 12 image, prepared as any lab host, with the
    install roles run on it by Ansible, then shut down and committed. Built once per content hash; a second
    caller waits on the lock and reuses it."""
    tag = installed_tag()
    with open(LAB / "installed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if podman("image", "exists", tag, check=False).returncode == 0:
            log(f"image {tag} is cached")
            return tag
        started = time.monotonic()
        lab, inventory = "installed-base", LAB / "installed-base" / "hosts.yml"
        name = f"{PREFIX}-{lab}-1"
        log(f"building the installed-base image {tag}: the install roles on {name} (about 2 minutes)")
        up(lab, 1, inventory)
        playbook = REPO / ".venv" / "bin" / "ansible-playbook"
        try:
            with open(LAB / "installed-base.log", "w") as out:
                for play in ("prepare.yml", "installed_base.yml"):
                    argv = [str(playbook), "-i", str(inventory), str(HERE.parent / "playbooks" / play)]
                    result = subprocess.run(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
                    if result.returncode != 0:
                        raise SystemExit(f"lab: {play} failed on {name}; see {LAB / 'installed-base.log'}")
            # No host keys or machine id in the image: each host from it makes its own at first boot.
            podman("exec", name, "sh", "-c", "rm -f /etc/ssh/ssh_host_* && : > /etc/machine-id")
            podman("stop", "-t", "30", name)
            podman("commit", "--quiet", name, tag)
        finally:
            down(lab, inventory)
        for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
            if old.startswith(f"localhost/{PREFIX}-{DEFAULT_OS}-installed:") and old != tag:
                podman("rmi", old, check=False)
        log(f"image {tag} built in {time.monotonic() - started:.0f} s")
        return tag


def lab_containers(lab: str | None = None) -> dict[str, dict]:
    label = f"moefleet.lab={lab}" if lab else "moefleet.lab"
    out = podman("ps", "-a", "--filter", f"label={label}", "--format", "json").stdout
    return {c["Names"][0]: c for c in json.loads(out or "[]")}


def container_ip(name: str) -> str:
    data = json.loads(podman("inspect", name).stdout)[0]
    return data["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]


def ensure_ssh_key() -> None:
    if SSH_KEY.exists():
        return
    SSH_KEY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "moefleet-lab", "-f", str(SSH_KEY)],
                   check=True)
    auth = SSH_KEY.parent / "authorized_keys"
    shutil.copy(SSH_KEY.with_suffix(".pub"), auth)
    auth.chmod(0o600)


def host_options() -> list[str]:
    """What makes a container stand in for a real host's kernel-facing side.

    CAP_SYS_ADMIN lets the hosts' systemd build the mount namespaces of a unit's sandbox
    (ProtectSystem=, ReadWritePaths=, PrivateTmp=, ProtectHome=, ...); without it systemd skips them
    silently. CAP_SYS_PTRACE gives root what it has on a real host over other users' processes (nsenter
    into a service's namespace, /proc/PID/ns). The device-cgroup rules let the container make and open
    character devices on the NVIDIA driver's majors, so the /dev/nvidia* nodes the driver role's unit makes
    with the simulated nvidia-modprobe (GPU_NODES' numbers) behave as real ones up to the driver."""
    majors = sorted({major for _, major, _, _ in GPU_NODES})
    rules = [arg for major in majors for arg in ("--device-cgroup-rule", f"c {major}:* rwm")]
    return ["--cap-add", "SYS_ADMIN", "--cap-add", "SYS_PTRACE", *rules]


def host_options_label() -> str:
    # "static-ip-mac": hosts made before each got an address and a MAC of its own (run_host) are made again by `up`.
    return hashlib.sha256(json.dumps([*host_options(), "static-ip-mac"]).encode()).hexdigest()[:12]


def static_ip() -> str:
    """An address of the lab network for a new host, kept for the container's life as a real host keeps its own
    across reboots: podman hands a container a new address at each start otherwise (a `lab.py reboot` then left
    the inventory, and a unit bound to the old address, pointing nowhere). Taken from the top of the subnet down,
    away from the addresses podman hands out from the bottom (the mirror's), skipping every lab host's."""
    subnet = json.loads(podman("network", "inspect", NETWORK).stdout)[0]["subnets"][0]["subnet"]
    prefix = subnet.split("/")[0].rsplit(".", 1)[0]
    taken = set()
    for name, info in lab_containers().items():
        taken.add((info.get("Labels") or {}).get("moefleet.ip", ""))
        if info.get("State") == "running" and NETWORK in (info.get("Networks") or []):
            taken.add(container_ip(name))
    for last in range(250, 1, -1):
        if f"{prefix}.{last}" not in taken:
            return f"{prefix}.{last}"
    raise SystemExit(f"lab: no free address left in {subnet}")


def static_mac(ip: str) -> str:
    """The host's MAC, fixed as a real NIC's is (locally administered, from its address): with a new one at each
    start, the machine's neighbour cache kept the old one for the address and a rebooted host was unreachable
    for about 30 s."""
    return "02:42:" + ":".join(f"{int(part):02x}" for part in ip.split("."))


def run_host(name: str, lab: str, tag: str, release: str) -> None:
    ip = static_ip()
    podman("run", "-d", "--name", name, "--hostname", name.removeprefix(f"{PREFIX}-"),
           "--label", f"moefleet.lab={lab}", "--label", f"moefleet.host-options={host_options_label()}",
           # which job of tests/suite.py brought the host up: the suite sums each job's CPU in its hosts
           "--label", f"moefleet.suite-job={os.environ.get('MOEFLEET_SUITE_JOB', '')}",
           "--label", f"moefleet.os={release}", "--label", f"moefleet.ip={ip}",
           "--network", NETWORK, "--ip", ip, "--mac-address", static_mac(ip), "--systemd", "always", *host_options(),
           # a host that reboots itself (ansible.builtin.reboot: systemd ends the container) comes back, as machines do
           "--restart", "always",
           "-v", f"{SSH_KEY.parent / 'authorized_keys'}:/root/.ssh/authorized_keys:ro", tag)


# systemd makes the root mount shared at boot on a real host but not in a container; a lab host's own unit does
# it at each boot (a reboot included), before any service: credentials of LoadCredential= reach a sandboxed unit
# by mount propagation, and with a private root they end up in a directory only root can read.
SHARED_ROOT_UNIT = """[Unit]
Description=Make / a shared mount, as systemd does on a real host (moefleet simulated lab)
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --make-rshared /

[Install]
WantedBy=sysinit.target
"""


def proc_devices_lines() -> str:
    """The lines the NVIDIA driver's dynamic majors would add to /proc/devices (the kernel's, which a container
    cannot change): the simulated nvidia-modprobe (sim/mirrors) reads nvidia-uvm's major there, as the real one
    reads /proc/devices. The same majors as GPU_NODES, which the container's device-cgroup rules allow."""
    majors = {rel: major for rel, major, _, _ in GPU_NODES}
    return f"{majors['nvidia-caps/nvidia-cap1']} nvidia-caps\n{majors['nvidia-uvm']} nvidia-uvm\n"


# The simulated clock of every SGLang start on a lab host: a full K2.6 start, ~600 simulated seconds, takes about
# 2.5 s of wall time instead of 10. The simulator reads it from /etc/sim-gpu/time-scale (it survives `lab.py
# reboot`), never from the unit the roles write: SGLANG_SIM_TIME_SCALE in a unit's own Environment= (a test's
# sglang_service_extra_env) still wins.
LAB_TIME_SCALE = "0.25"


# The host's PCI devices as sysfs shows them (sim/gpu/pci_tree.py): LAB_SYSFS is what the inventory gives the
# fault watcher (fault_watch_sysfs_pci_devices). Under /etc/sim-gpu, as the GPUs' spec: it survives a reboot.
LAB_SYSFS_ROOT = "/etc/sim-gpu"
LAB_SYSFS = f"{LAB_SYSFS_ROOT}/sys/bus/pci/devices"
PCI_TREE_SOURCE = (Path(__file__).resolve().parents[1] / "gpu" / "pci_tree.py").read_text()
# The lab's PCIe model and the tools that read it (sim/gpu): the lspci stand-in (linked as /usr/bin/lspci, standing in
# for the base system's pciutils), the nvidia-smi stand-in's topology (it looks here), and the stand-in backend of the
# P2P preflight's all-reduce check (the lab's SGLang venv has no torch). Copied at every `up`.
SIM_LIB = "/usr/local/lib/moefleet-sim"
SIM_LIB_FILES = ("pci_tree.py", "pcie_sim.py", "p2p_backend.py", "lspci")
# Where the system's Python (every Debian release's python3) imports sim/lab/ansiballz_bytecode.py from at each start,
# through a .pth line of the same name: a lab speed-up of Ansible's module runs, not a part of any host moefleet serves.
ANSIBALLZ_BYTECODE = "/usr/lib/python3/dist-packages/moefleet_lab_ansiballz_bytecode"
# What a lab host's boot gives it that a container's does not: a boot id of its own (a container shares the machine's
# /proc/sys/kernel/random/boot_id across its restarts; the P2P preflight's cache is keyed by the boot, so the lab
# inventory points it here) and its kernel's IOMMU messages for the P2P state it booted in (pcie_sim.py writes them to
# /etc/sim-gpu/kernel-boot.log), written to the journal under the identifier "kernel" by root, as the fault watcher and
# the preflight trust them.
LAB_BOOT_ID = "/run/sim-gpu/boot_id"
LAB_BOOT_UNIT = f"""[Unit]
Description=The simulated host's boot id and kernel IOMMU messages (moefleet simulated lab)
After=systemd-journald.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mkdir -p /run/sim-gpu && cat /proc/sys/kernel/random/uuid > {LAB_BOOT_ID} && \
  if [ -f {LAB_SYSFS_ROOT}/kernel-boot.log ]; then systemd-cat -t kernel -p info < {LAB_SYSFS_ROOT}/kernel-boot.log; fi'

[Install]
WantedBy=multi-user.target
"""
WRITE_FILE = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"


def prepare_host(name: str) -> None:
    """At every `up`: what stands in for the host's hardware and boot, never for what the roles install. The
    shared-root unit (SHARED_ROOT_UNIT, enabled, and run now for this boot), the driver's /proc/devices lines
    (/etc/sim-gpu/proc-devices) and the lab's clock (LAB_TIME_SCALE). No /dev/nvidia* node: a container's /dev
    is new at each start and, as on a real host, the driver role's nvidia-uvm-devices.service makes the nodes
    (with the simulated nvidia-modprobe) when the role runs and at every boot after."""
    unit = "/etc/systemd/system/moefleet-lab-shared-root.service"
    script = (f"mkdir -p /etc/sim-gpu && printf '%s' '{proc_devices_lines()}' > /etc/sim-gpu/proc-devices && "
              f"echo {LAB_TIME_SCALE} > /etc/sim-gpu/time-scale && "
              f"printf '%s' '{SHARED_ROOT_UNIT}' > {unit} && "
              f"ln -sf {unit} /etc/systemd/system/sysinit.target.wants/ && mount --make-rshared /")
    podman("exec", name, "sh", "-c", script)
    install_sim_tools(name)
    # The PCI devices' sysfs (sim/gpu/pci_tree.py) and the P2P state (sim/gpu/pcie_sim.py), written again at each `up`:
    # a downtrained link is repaired there, and the P2P state is the healthy default (two sockets, ACS off, IOMMU
    # translated). The boot unit then gives this boot its id and the kernel's IOMMU lines.
    podman("exec", name, "python3", f"{SIM_LIB}/pcie_sim.py", "set", LAB_SYSFS_ROOT, "--reset",
           "--bus-ids", ",".join(pci_tree.gpu_bus_ids()))
    podman("exec", name, "systemctl", "restart", "moefleet-lab-boot.service")


def install_sim_tools(name: str) -> None:
    """The lab's PCIe model and its tools (SIM_LIB_FILES) into SIM_LIB, lspci linked as /usr/bin/lspci, the boot
    unit (LAB_BOOT_UNIT), enabled, and the module payloads' bytecode cache (ANSIBALLZ_BYTECODE)."""
    podman("exec", name, "mkdir", "-p", SIM_LIB)
    for file in SIM_LIB_FILES:
        podman("cp", str(Path(__file__).resolve().parents[1] / "gpu" / file), f"{name}:{SIM_LIB}/{file}")
    unit = "/etc/systemd/system/moefleet-lab-boot.service"
    podman("exec", name, "python3", "-c", WRITE_FILE, unit, LAB_BOOT_UNIT)
    podman("exec", name, "sh", "-c", f"chmod 0755 {SIM_LIB}/lspci && ln -sf {SIM_LIB}/lspci /usr/bin/lspci && "
           f"ln -sf {unit} /etc/systemd/system/multi-user.target.wants/ && systemctl daemon-reload")
    # The bytecode of Ansible's module payloads, kept across tasks (a lab speed-up only: sim/lab/ansiballz_bytecode.py)
    podman("cp", str(Path(__file__).with_name("ansiballz_bytecode.py")), f"{name}:{ANSIBALLZ_BYTECODE}.py")
    podman("exec", name, "python3", "-c", WRITE_FILE, f"{ANSIBALLZ_BYTECODE}.pth",
           f"import {Path(ANSIBALLZ_BYTECODE).name}\n")


def set_p2p(host: str, options: list[str], reboot_after: bool = False) -> None:
    """Test equipment: HOST's PCIe peer-to-peer state (sim/gpu/pcie_sim.py set, OPTIONS as `lab.py p2p` takes them).
    Its kernel's messages go to the journal now, as if HOST had booted in that state, or HOST reboots."""
    name = host if host.startswith(f"{PREFIX}-") else f"{PREFIX}-{host}"
    if name not in lab_containers():
        raise SystemExit(f"lab: no lab host {host}; `lab.py status` lists them")
    done = podman("exec", name, "python3", f"{SIM_LIB}/pcie_sim.py", "set", LAB_SYSFS_ROOT, *options, check=False)
    if done.returncode != 0:
        raise SystemExit(f"lab: {host}'s P2P state was not changed: {(done.stderr or done.stdout).strip()}")
    if reboot_after:
        reboot(host)
    else:
        podman("exec", name, "sh", "-c", f"systemd-cat -t kernel -p info < {LAB_SYSFS_ROOT}/kernel-boot.log")
    log(f"P2P state of {host}: {done.stdout.strip()}")


def reboot(host: str, timeout: float = 120) -> None:
    """Reboot one lab host: podman restart stops the container the way a shutdown does (SIGRTMIN+3 to systemd,
    which stops every unit), then starts it again: systemd boots from scratch with a new /dev and /run. Nothing of
    prepare_host runs: what the host needs after a boot, its own units must do. Returns once systemd says the boot
    finished (running or degraded), printing the host's failed units if any."""
    name = host if host.startswith(f"{PREFIX}-") else f"{PREFIX}-{host}"
    if name not in lab_containers():
        raise SystemExit(f"lab: no lab host {host}; `lab.py status` lists them")
    before = container_ip(name) if lab_containers()[name]["State"] == "running" else None
    started = time.monotonic()
    podman("restart", "-t", "30", name)
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        result = podman("exec", name, "systemctl", "is-system-running", "--wait", check=False)
        state = result.stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(1)
    else:
        raise SystemExit(f"lab: {host} did not finish booting within {timeout:.0f} s (systemd says {state!r})")
    after = container_ip(name)
    if before and after != before:
        raise SystemExit(f"lab: {host} came back on {after}, not {before}: run `lab.py up` to rewrite the inventory")
    failed = podman("exec", name, "systemctl", "--failed", "--no-legend", "--plain", check=False).stdout.strip()
    log(f"rebooted {host} in {time.monotonic() - started:.1f} s (systemd: {state})"
        + (f"; failed units:\n{failed}" if failed else ""))


# The kernel's lines for a GPU that falls off the bus, as the NVIDIA driver writes them (docs/healing.md quotes
# public logs); written to the host's journal under the identifier "kernel" by root (a container has no kernel log
# of its own; the fault watcher trusts kernel lines from the kernel or from root).
XID79_LINES = ("NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
               "NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus.")
# On the host: the GPU's PCI bus as its nvidia-smi gives it (before it is lost), then the fault, then the lines.
INJECT_XID79 = """
import json, os, subprocess, sys
bus_id = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", sys.argv[1]],
                        capture_output=True, text=True, check=True).stdout.strip()
bus = bus_id.split(":")[-2].lower()
os.makedirs("/run/sim-gpu", mode=0o755, exist_ok=True)
path = "/run/sim-gpu/lost.json"
try:
    lost = set(json.load(open(path)))
except (OSError, ValueError):
    lost = set()
lost.add(int(sys.argv[1]))
json.dump(sorted(lost), open(path, "w"))
subprocess.run(["systemd-cat", "-t", "kernel", "-p", "err"], input=sys.argv[2].format(bus=bus), text=True, check=True)
"""


# Healthy hosts' lines that look like a GPU's fault (the kernel's AER and pciehp wording, drivers/pci/pcie/aer.c and
# hotplug/pciehp_ctrl.c): an NVMe drive's fatal AER error and a NIC's surprise link down, at the addresses the lab's
# simulated PCI tree (sim/gpu/pci_tree.py) gives those devices, under root ports of their own.
OTHER_DEVICE_LINES = {
    "nvme-aer": ("pcieport 0000:00:03.1: AER: Uncorrectable (Fatal) error message received from 0000:05:00.0",
                 "nvme 0000:05:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, "
                 "(Unregistered Agent ID)",
                 "nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff"),
    "nic-down": ("pcieport 0000:80:03.1: pciehp: Slot(4): Link Down",
                 "pcieport 0000:80:03.1: AER: Uncorrected (Fatal) error received: 0000:80:03.1",
                 "pcieport 0000:80:03.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
                 "(Receiver ID)",
                 "pcieport 0000:80:03.1:    [ 5] Surprise Down Error    (First)",
                 "mlx5_core 0000:85:00.0: mlx5_pci_err_detected Device state = 1 pci_status: 1. Enter, "
                 "pci channel state = 3"),
}
KERNEL_LINES = ("import subprocess, sys; subprocess.run(['systemd-cat', '-t', 'kernel', '-p', 'err'], "
                "input=sys.argv[1], text=True, check=True)")
FAULTS = ("xid79", "xid79-lines", "hang", "pcie-downtrain", *OTHER_DEVICE_LINES)


def inject_fault(host: str, fault: str, gpu: int = 0) -> None:
    """Test equipment: a hardware fault on a lab host, cleared by its next reboot (/run/sim-gpu is on tmpfs).
    xid79-lines writes the kernel's Xid 79 lines only (the GPU keeps answering: a fault of the past, as an old boot
    log holds); nvme-aer and nic-down write other devices' PCIe lines."""
    name = host if host.startswith(f"{PREFIX}-") else f"{PREFIX}-{host}"
    if name not in lab_containers():
        raise SystemExit(f"lab: no lab host {host}; `lab.py status` lists them")
    if fault == "xid79":
        lines = "".join(line + "\n" for line in XID79_LINES)
        podman("exec", name, "python3", "-c", INJECT_XID79, str(int(gpu)), lines)
    elif fault == "xid79-lines":
        bus_id = podman("exec", name, "nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                        "-i", str(int(gpu))).stdout.strip()
        lines = "".join(line.format(bus=bus_id.split(":")[-2].lower()) + "\n" for line in XID79_LINES)
        podman("exec", name, "python3", "-c", KERNEL_LINES, lines)
    elif fault in OTHER_DEVICE_LINES:
        podman("exec", name, "python3", "-c", KERNEL_LINES, "".join(line + "\n" for line in OTHER_DEVICE_LINES[fault]))
    elif fault == "hang":
        podman("exec", name, "sh", "-c", "mkdir -p /run/sim-gpu && touch /run/sim-gpu/nccl-hang")
    elif fault == "pcie-downtrain":  # the GPU's bus as its nvidia-smi gives it, then its link in the host's sysfs
        bus_id = podman("exec", name, "nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                        "-i", str(int(gpu))).stdout.strip()
        podman("exec", name, "python3", "-c", PCI_TREE_SOURCE, LAB_SYSFS_ROOT, "--downtrain", bus_id, "16", "8")
    else:
        raise SystemExit(f"lab: unknown fault {fault!r} ({', '.join(FAULTS)})")
    log(f"injected {fault} on {host}" + (f" (GPU {gpu})" if fault in ("xid79", "xid79-lines", "pcie-downtrain")
                                         else ""))


def p2p_options(args: argparse.Namespace) -> list[str]:
    """`lab.py p2p`'s options as pcie_sim.py set takes them."""
    options = ["--reset"] if args.reset else []
    for flag in ("topology", "acs", "iommu", "bar1", "after_hang"):
        value = getattr(args, flag)
        if value is not None:
            options += [f"--{flag.replace('_', '-')}", value]
    for item in args.acs_bridge:
        options += ["--acs-bridge", item]
    return options


def ensure_mirror(tag: str) -> str:
    mirror_dir = LAB / "mirror"
    mirror_dir.mkdir(parents=True, exist_ok=True)
    mirrors = lab_containers("mirror")
    if MIRROR not in mirrors:
        podman("run", "-d", "--name", MIRROR, "--label", "moefleet.lab=mirror", "--network", NETWORK,
               "-v", f"{mirror_dir}:/srv/mirror:ro", "--entrypoint", "/usr/bin/python3", tag,
               "-m", "http.server", str(MIRROR_PORT), "--directory", "/srv/mirror")
    elif mirrors[MIRROR]["State"] != "running":
        podman("start", MIRROR)
    # Hosts reach it by name through the lab network's DNS (inventory/sim/group_vars: lab_mirror_url).
    return f"http://{MIRROR}:{MIRROR_PORT}"


def ssh_config_path(inventory: Path) -> Path:
    """The one place that says where the ssh_config for an inventory's hosts lives: in the lab's state directory,
    never in the inventory's directory (ansible-playbook -i DIR would try every file there as an inventory source
    and print a screenful of warnings). One file per inventory directory, named after it and its full path."""
    directory = Path(inventory).resolve().parent
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:8]
    return SSH_CONFIGS / f"{directory.name}-{digest}"


def write_inventory(path: Path, hosts: dict[str, str], releases: dict[str, str] | None = None,
                    router: tuple[str, str] | None = None, monitoring: bool = False) -> None:
    lines = [
        "---",
        "# Written by sim/lab/lab.py; the lab's other variables are in inventory/sim/group_vars/.",
        "all:",
        "  vars:",
        "    ansible_user: root",
        f"    lab_repo_root: {REPO}",
        f"    ansible_ssh_private_key_file: {SSH_KEY}",
        # Lab hosts get fresh host keys on every creation, at addresses that are reused.
        "    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        "  children:",
        "    blackwell:",
        "      hosts:",
    ]
    for short, ip in sorted(hosts.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1])):
        release = (releases or {}).get(short, DEFAULT_OS)
        # The host's release, and the layout of NVIDIA's repository (the lab mirror's) that serves it.
        lines += [f"        {short}:", f"          ansible_host: {ip}", f"          lab_os: {release}",
                  f"          nvidia_driver_repo_distro: {release}"]
        if router:  # behind a router the workers serve on their private (lab network) address
            lines += [f"          sglang_service_host: {ip}"]
    if router:  # keys on the workers and at the gateway, as the example inventory has them (from vault there)
        lines += ["      vars:", "        sglang_service_api_key: \"{{ lab_worker_api_key }}\""]
    everyone = dict(hosts)
    if router:
        lines += ["    routers:", "      hosts:", f"        {router[0]}:", f"          ansible_host: {router[1]}"]
        everyone[router[0]] = router[1]
    if router and monitoring:  # Prometheus and Alertmanager on the gateway host (playbooks/monitoring.yml)
        lines += ["    monitoring:", "      hosts:", f"        {router[0]}:"]
    ssh = [f"Host {short}\n  HostName {ip}\n  User root\n  IdentityFile {SSH_KEY}\n"
           "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
           for short, ip in sorted(everyone.items())]
    # The ssh_config for `ssh -F` and testinfra's ssh backend: ssh_config_path(), outside the inventory directory.
    for target, text in ((path, "\n".join(lines) + "\n"), (ssh_config_path(path), "".join(ssh))):
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            log(f"wrote {target}")
    # Where the lab wrote it before: inside the inventory directory, where Ansible tried to parse it.
    (path.parent / "ssh_config").unlink(missing_ok=True)


def wait_for_ansible(inventory: Path, names: list[str], timeout: float = 120) -> None:
    ansible = shutil.which("ansible", path=f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")
    if not ansible:
        raise SystemExit("lab: ansible not found; run `make setup` first")
    deadline = time.monotonic() + timeout
    while True:
        result = subprocess.run([ansible, "-i", str(inventory), "-m", "ansible.builtin.ping", "-o",
                                 ",".join(names)], cwd=REPO, text=True, capture_output=True)
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"lab: hosts did not answer Ansible within {timeout:.0f} s:\n{result.stdout[-2000:]}")
        time.sleep(1)


def wait_for_mirror(names: list[str], timeout: float = 60) -> None:
    """Until each host reaches the mirror by its name, or a sentence naming the fix. A mirror container killed
    without podman leaves its network's DNS record (/run/containers/networks/aardvark-dns/<network>, one per
    machine) behind: a new clone at the same path (the same network name) then had hosts for which the mirror's
    name did not resolve, and the first key download failed with "Name or service not known"."""
    deadline = time.monotonic() + timeout
    for name in names:
        while podman("exec", name, "curl", "-sf", "-o", "/dev/null", "--max-time", "3",
                     f"http://{MIRROR}:{MIRROR_PORT}/", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"lab: {name} cannot reach the mirror at http://{MIRROR}:{MIRROR_PORT}/ "
                                 f"within {timeout:.0f} s: run `lab.py down --all` (it removes the lab's network and "
                                 f"its DNS records) and `up` again")
            time.sleep(1)


def _host_bridges() -> tuple[set[str], set[str]]:
    """Names of this machine's network interfaces and the IPv4 addresses on them."""
    names = set(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else set()
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    addrs = {fields[3].split("/")[0] for fields in (line.split() for line in out.splitlines()) if len(fields) > 3}
    return names, addrs


def _lab_networks() -> list[str]:
    out = podman("network", "ls", "--format", "{{.Name}}").stdout
    return [n for n in out.split() if n.startswith(f"{PREFIX}-net")]


def ensure_network() -> None:
    """The lab's bridge network, with DNS (hosts find the mirror by name).

    Podman names a new bridge podman1 and gives it 10.89.0.0/24 whatever other podman configurations on
    the machine use; a second checkout's lab (its own .lab) would then share the first one's bridge and
    subnet. So each checkout picks a bridge name and subnet from a hash of its .lab path, stepping past
    any the machine already has, and writes podman's network file itself (podman 4.3 has no
    --interface-name). Networks of an older naming are removed with the containers on them."""
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        return
    for name, info in lab_containers().items():
        if NETWORK not in (info.get("Networks") or []):
            log(f"removing {name} (on an old lab network)")
            remove_container(name)
    for old in _lab_networks():
        podman("network", "rm", old)
    names, addrs = _host_bridges()
    seed = int(LAB_ID, 16)
    for step in range(200):
        n = (seed + step) % 200 + 20
        bridge, gateway = f"mflab{n}", f"10.89.{n}.1"
        if bridge not in names and gateway not in addrs:
            break
    else:
        raise SystemExit("lab: no free 10.89.N.0/24 subnet for the lab network; remove other labs' networks.")
    config = {
        "name": NETWORK, "id": hashlib.sha256(f"{LAB_ID}:{NETWORK}".encode()).hexdigest(), "driver": "bridge",
        "network_interface": bridge, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "subnets": [{"subnet": f"10.89.{n}.0/24", "gateway": gateway}], "ipv6_enabled": False,
        "internal": False, "dns_enabled": True, "ipam_options": {"driver": "host-local"},
    }
    (LAB / "podman" / "networks" / f"{NETWORK}.json").write_text(json.dumps(config, indent=2) + "\n")
    podman("network", "exists", NETWORK)
    log(f"network {NETWORK}: bridge {bridge}, 10.89.{n}.0/24")


def build_mirror() -> None:
    """The mirror container's content: sim/mirrors (apt, package index) and sim/hub (test models, hf wheels).
    Each is rebuilt only when its inputs changed (about 0.1 s otherwise)."""
    for script in (REPO / "sim" / "mirrors" / "build.py", REPO / "sim" / "hub" / "hub.py"):
        args = [str(LAB / "mirror")] if script.name == "build.py" else ["build", str(LAB / "mirror")]
        result = subprocess.run([sys.executable, str(script), *args], text=True, capture_output=True)
        if result.returncode != 0:
            raise SystemExit(f"lab: {script.relative_to(REPO)} failed:\n{(result.stdout + result.stderr)[-2000:]}")


def start_hub() -> None:
    """The Hub stand-in inside the mirror container (port 8081), started at every `up` (a restarted
    mirror container has lost it)."""
    sys.path.insert(0, str(REPO / "sim" / "hub"))
    import hub  # noqa: PLC0415  (sim/hub: the Hugging Face Hub stand-in)

    hub.up()


@contextlib.contextmanager
def shared_state_lock():
    """Held while a command changes what labs share (the images, the network, the mirror and its Hub, the
    addresses hosts get): `make test` brings several labs up at once (tests/suite.py), and two `podman run
    --name moefleet-mirror` or two hosts given the same free address would collide."""
    LAB.mkdir(parents=True, exist_ok=True)
    with open(LAB / "shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def up(lab: str, count: int, inventory: Path, releases: list[str] | None = None, router: bool = False,
       installed: bool = False, monitoring: bool = False) -> None:
    if monitoring and not router:
        raise SystemExit("lab: --monitoring puts Prometheus on the gateway's host; add --router")
    if count < 1:
        raise SystemExit("lab: --hosts must be 1 or more; use `make sim-down` to remove the lab")
    if installed and set(releases or [DEFAULT_OS]) != {DEFAULT_OS}:
        raise SystemExit(f"lab: --installed is built for {DEFAULT_OS} only; leave out --os or --installed")
    worker_image = build_installed() if installed else None  # before the shared lock: it brings up a lab itself
    with shared_state_lock():
        hosts, gateway, started = _start_hosts(lab, count, inventory, releases, router, worker_image, monitoring)
    names = list(hosts) + ([gateway[0]] if gateway else [])
    wait_for_ansible(inventory, names)
    wait_for_mirror([f"{PREFIX}-{name}" for name in names])
    what = f"{count} host(s)" + (" and the router" if router else "")
    log(f"lab {lab}: {what} answer Ansible ({time.monotonic() - started:.1f} s); mirror at http://{MIRROR}:{MIRROR_PORT}")


def _start_hosts(lab: str, count: int, inventory: Path, releases: list[str] | None, router: bool,
                 worker_image: str | None = None, monitoring: bool = False):
    """up's part that changes shared state: images, network, mirror, the hosts and their inventory. The workers
    start from worker_image when given (the installed base), else from their release's image."""
    releases = releases or [DEFAULT_OS]
    workers = [f"{PREFIX}-{lab}-{i}" for i in range(1, count + 1)]
    router_name = f"{PREFIX}-{lab}-router"
    wanted = workers + ([router_name] if router else [])
    os_of = {name: releases[i % len(releases)] for i, name in enumerate(workers)}
    os_of[router_name] = DEFAULT_OS
    tags = {release: build_image(release) for release in dict.fromkeys([DEFAULT_OS, *os_of.values()])}
    image_of = {name: worker_image or tags[os_of[name]] for name in workers} | {router_name: tags[DEFAULT_OS]}
    ensure_ssh_key()
    ensure_network()
    build_mirror()
    ensure_mirror(tags[DEFAULT_OS])
    start_hub()
    existing = lab_containers(lab)
    for name in sorted(set(existing) - set(wanted)):
        log(f"removing {name} (lab {lab} resized to {count})")
        remove_container(name)
    started = time.monotonic()
    for name in wanted:
        info = existing.get(name)
        labels = (info or {}).get("Labels") or {}
        if info is not None and labels.get("moefleet.host-options") != host_options_label():
            log(f"removing {name} (started without the lab's current host options)")
            remove_container(name)
            info = None
        elif info is not None and (labels.get("moefleet.os", DEFAULT_OS) != os_of[name]
                                   or info.get("Image") != image_of[name]):
            log(f"removing {name} (asked for {os_of[name]} from {image_of[name]})")
            remove_container(name)
            info = None
        if info is None:
            run_host(name, lab, image_of[name], os_of[name])
            log(f"started {name} ({os_of[name]})")
        elif info["State"] != "running":
            podman("start", name)
            log(f"restarted {name}")
        prepare_host(name)
    hosts = {name.removeprefix(f"{PREFIX}-"): container_ip(name) for name in workers}
    gateway = (router_name.removeprefix(f"{PREFIX}-"), container_ip(router_name)) if router else None
    write_inventory(inventory, hosts, {name.removeprefix(f"{PREFIX}-"): os_of[name] for name in workers}, gateway,
                    monitoring)
    group_vars = inventory.parent / "group_vars"
    if inventory.parent != INVENTORY.parent and not group_vars.exists():
        group_vars.symlink_to(INVENTORY.parent / "group_vars")  # the lab's variables, for any lab
    return hosts, gateway, started


def down(lab: str | None, inventory: Path) -> None:
    for name in lab_containers(lab):
        remove_container(name)
        log(f"removed {name}")
    if lab is None:
        for network in _lab_networks():
            podman("network", "rm", network)
    inventory.unlink(missing_ok=True)
    ssh_config_path(inventory).unlink(missing_ok=True)
    (inventory.parent / "ssh_config").unlink(missing_ok=True)  # where earlier versions wrote it


def status() -> None:
    for name, info in sorted(lab_containers().items()):
        ip = container_ip(name) if info["State"] == "running" else "-"
        print(f"{name:28} {info['Labels'].get('moefleet.lab', ''):10} {info['State']:10} {ip}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    image_p = sub.add_parser("image")
    image_p.add_argument("--os", type=parse_os, default=[DEFAULT_OS], help=f"releases: {', '.join(RELEASES)}")
    up_p = sub.add_parser("up")
    up_p.add_argument("--name", default="lab", help="lab name: hosts are NAME-1..NAME-N")
    up_p.add_argument("--hosts", type=int, default=1)
    up_p.add_argument("--os", type=parse_os, default=[DEFAULT_OS],
                      help=f"each host's release in turn, comma-separated ({', '.join(RELEASES)})")
    up_p.add_argument("--inventory", type=Path, default=INVENTORY)
    up_p.add_argument("--router", action="store_true",
                      help="add host NAME-router in group routers, in front of the workers")
    up_p.add_argument("--monitoring", action="store_true",
                      help="put the router host in group monitoring too (playbooks/monitoring.yml: Prometheus there)")
    up_p.add_argument("--installed", action="store_true",
                      help="start the workers from the installed-base image (built first if its inputs changed)")
    sub.add_parser("installed", help="build (or reuse) the installed-base image")
    down_p = sub.add_parser("down")
    down_p.add_argument("--name", default="lab")
    down_p.add_argument("--all", action="store_true", help="every lab, the mirror and the network")
    down_p.add_argument("--inventory", type=Path, default=INVENTORY)
    reboot_p = sub.add_parser("reboot", help="reboot a lab host: container restarted, systemd boots again")
    reboot_p.add_argument("host", help="the host's inventory name, e.g. lab-1")
    fault_p = sub.add_parser("fault", help="inject a hardware fault on a lab host (cleared by its next reboot)")
    fault_p.add_argument("host", help="the host's inventory name, e.g. lab-1")
    fault_p.add_argument("fault", choices=FAULTS)
    fault_p.add_argument("--gpu", type=int, default=0,
                         help="the GPU that falls off the bus (xid79) or whose link trains slower (pcie-downtrain)")
    p2p_p = sub.add_parser("p2p", help="set a lab host's PCIe peer-to-peer state (topology, ACS, IOMMU)")
    p2p_p.add_argument("host", help="the host's inventory name, e.g. lab-1")
    p2p_p.add_argument("--topology", choices=pci_tree.TOPOLOGIES)
    p2p_p.add_argument("--acs", choices=("off", "srcvalid", "redirect"),
                       help="ACS control of every root port and switch downstream port")
    p2p_p.add_argument("--acs-bridge", action="append", default=[], metavar="BDF=MODE",
                       help="one bridge's ACS control (over --acs), e.g. 0000:11:00.0=redirect")
    p2p_p.add_argument("--iommu", choices=("translated", "passthrough", "off"))
    p2p_p.add_argument("--bar1", help="the GPUs' BAR1 size as lspci prints it: 128G, or 256M (Resizable BAR off)")
    p2p_p.add_argument("--after-hang", choices=("recover", "busy", "unresponsive"),
                       help="what a hung P2P all-reduce leaves: nothing, GPUs busy at ~140 W, or GPUs nvidia-smi "
                            "cannot open (until a reboot)")
    p2p_p.add_argument("--reset", action="store_true", help="start from the healthy default")
    p2p_p.add_argument("--reboot", action="store_true", help="reboot the host after setting the state")
    sub.add_parser("status")
    ssh_p = sub.add_parser("ssh-config", help="print the path of the ssh_config for an inventory's hosts")
    ssh_p.add_argument("--inventory", type=Path, default=INVENTORY)
    args = parser.parse_args()
    if args.cmd == "ssh-config":
        print(ssh_config_path(args.inventory))
        return
    LAB.mkdir(parents=True, exist_ok=True)
    if args.cmd == "image":
        with shared_state_lock():
            for release in dict.fromkeys(args.os):
                build_image(release)
    elif args.cmd == "installed":
        build_installed()
    elif args.cmd == "up":
        up(args.name, args.hosts, args.inventory.resolve(), args.os, args.router, args.installed, args.monitoring)
    elif args.cmd == "down":
        down(None if args.all else args.name, args.inventory.resolve())
    elif args.cmd == "reboot":
        reboot(args.host)
    elif args.cmd == "fault":
        inject_fault(args.host, args.fault, args.gpu)
    elif args.cmd == "p2p":
        set_p2p(args.host, p2p_options(args), args.reboot)
    else:
        status()


if __name__ == "__main__":
    main()
