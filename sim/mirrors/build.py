#!/usr/bin/env python3
"""Build the simulated lab's local mirrors: a signed apt repository laid out like NVIDIA's CUDA repo,
holding stand-in packages named and versioned like NVIDIA's, and a PEP 503 package index serving the
SGLang simulator.

    build.py [OUT] [--inputs DIR] [--force]

OUT defaults to $MOEFLEET_LAB_DIR/mirror, else .lab/mirror under the repository root (the directory the
lab's mirror container serves on port 8080). The signing key is made once into OUT/../keys/ (its own
GNUPGHOME; the user's keyring is never touched). A second run with unchanged inputs changes nothing.
See README.md beside this file for the layout and the URLs the roles' variables take.

Test and demo equipment: product code never imports or names it, and it imports no product code.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import fcntl
import gzip
import hashlib
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(os.environ.get("MOEFLEET_LAB_DIR", REPO / ".lab")) / "mirror"

# NVIDIA's repository directories the lab serves. debian13's repository is signed by a key of its own
# (NVIDIA's 8793F200.pub; the others use 3bf863cc.pub), so the lab signs it with a second key.
DISTROS = ("debian12", "debian13", "ubuntu2204", "ubuntu2404")
OWN_KEY_DISTROS = ("debian13",)
# dpkg architecture -> directory name in NVIDIA's repo URL (.../repos/<distro>/<dir>/)
ARCH_DIRS = {"amd64": "x86_64", "arm64": "sbsa"}
MAINTAINER = "moefleet lab <lab@moefleet.invalid>"
KEY_UID = "moefleet lab archive key (simulated NVIDIA CUDA repository) <lab@moefleet.invalid>"
# The lab's mirror by the name hosts resolve on the lab network (inventory/sim's lab_mirror_url):
# the cuda-keyring stand-in writes it into the apt source it adds, as NVIDIA's writes its own URL.
LAB_MIRROR_URL = "http://moefleet-mirror:8080"
# Fixed timestamp for every file inside the .deb files, so equal inputs give equal packages.
SOURCE_DATE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z

# Driver branches side by side, as in NVIDIA's repositories (570 the Blackwell floor, 580 the long-lived
# branch, 590 the newest): upstream versions. Without a pin apt takes the newest, 590.
DRIVER_BRANCHES = {"570": "570.195.03", "580": "580.95.05", "590": "590.48.01"}
# The last branch published under branch-named packages (nvidia-open-<b>, nvidia-driver-<b>-open, ...);
# from 590 on only the unsuffixed names exist and the branch lives in the version.
LAST_SUFFIXED_BRANCH = 580
# Debian revision of NVIDIA's packages per repository family.
REVISIONS = {"debian": "1", "ubuntu": "0ubuntu1"}
# CUDA toolkits: X.Y -> full release version; packages are cuda-toolkit-X-Y.
TOOLKITS = {"12.8": "12.8.1", "12.9": "12.9.1", "13.0": "13.0.2"}
# nvcc's own version in each of those releases (what version.json's cuda_nvcc says).
NVCC_VERSIONS = {"12.8": "12.8.93", "12.9": "12.9.86", "13.0": "13.0.88"}
CUDA_KEYRING_VERSION = "1.1-1"
# The kernel a lab host of each repository layout stands in for (a container runs the build machine's kernel, whose
# name is no distribution's; inventory/sim sets nvidia_driver_kernel_release to these), with its packages' version.
# The distribution's archive has its headers, linux-headers-<kernel>, and the flavour's metapackage, which depends on
# them; the lab serves both from the layout's flat repository, which the role adds before it installs the headers.
KERNELS = {
    "debian12": ("6.1.0-31-cloud-amd64", "6.1.128-1"),
    "debian13": ("6.12.117+deb13-amd64", "6.12.117-1"),
    "ubuntu2204": ("5.15.0-1063-azure", "5.15.0-1063.72"),
    "ubuntu2404": ("6.8.0-60-generic", "6.8.0-60.63"),
}
# Lab hosts keep their release's own archive (deb.debian.org) in their sources, and its linux-headers-amd64 or
# -cloud-amd64 is newer than the lab's: apt takes the highest version among equal priorities, so without an epoch it
# would install Debian's real headers (and a compiler) instead. Debian's kernel packages carry no epoch.
KERNEL_EPOCH = "1"
# Where the lab serves those headers as a distribution archive would (sim/playbooks/prepare.yml adds it to each host).
ARCHIVE_DIR = "archive"


def say(message: str) -> None:
    print(f"build.py: {message}", flush=True)


class BuildError(Exception):
    """A build failure, phrased as a sentence for the operator."""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("text", True)
    try:
        return subprocess.run(cmd, check=True, capture_output=True, **kwargs)
    except FileNotFoundError as exc:
        raise BuildError(f"{cmd[0]} is not installed; it is needed to build the mirrors.") from exc
    except subprocess.CalledProcessError as exc:
        detail = exc.stderr or exc.stdout or ""
        detail = (detail.decode(errors="replace") if isinstance(detail, bytes) else detail).strip()
        raise BuildError(f"`{' '.join(cmd)}` failed with exit status {exc.returncode}: {detail}") from exc


# --------------------------------------------------------------------------------------------- tools

REQUIRED_TOOLS = {"dpkg-deb": "dpkg", "gpg": "gnupg", "gpg-agent": "gpg-agent", "gpgconf": "gpgconf"}


def ensure_tools() -> None:
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise BuildError(f"the Debian packages {', '.join(missing)} are missing and cannot be installed "
                         "here (needs root and apt-get); install them and run build.py again.")
    say(f"installing the missing Debian packages {', '.join(missing)} with apt-get.")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env)


# --------------------------------------------------------------------------------------------- inputs

@dataclass
class Inputs:
    nvidia_smi: Path
    nvcc: Path
    sglang: Path

    @classmethod
    def locate(cls, sim: Path) -> Inputs:
        found = cls(sim / "gpu" / "nvidia-smi", sim / "gpu" / "nvcc", sim / "sglang")
        wanted = [
            (found.nvidia_smi, "the nvidia-smi stand-in", found.nvidia_smi.is_file()),
            (found.nvcc, "the nvcc stand-in", found.nvcc.is_file()),
            (found.sglang / "pyproject.toml", "the SGLang simulator's pyproject.toml",
             (found.sglang / "pyproject.toml").is_file()),
        ]
        missing = [f"{what} ({path})" for path, what, ok in wanted if not ok]
        if missing:
            raise BuildError(f"cannot build the mirrors: {'; '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} missing.")
        return found


SKIP_PARTS = {"__pycache__", "build", "dist", ".pytest_cache", ".ruff_cache"}


def source_files(tree: Path) -> list[Path]:
    """Files of a source tree that go into a build (no build outputs, caches or egg-info)."""
    files = []
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree)
        if any(part in SKIP_PARTS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and not path.name.endswith((".pyc", ".pyo")):
            files.append(path)
    return files


def digest(*items: bytes | str | Path) -> str:
    h = hashlib.sha256()
    for item in items:
        data = item.read_bytes() if isinstance(item, Path) else item
        data = data.encode() if isinstance(data, str) else data
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- the key

@dataclass
class LabKey:
    home: Path          # GNUPGHOME holding the secret key
    fingerprint: str
    armored: Path       # lab-archive-key.asc
    binary: Path        # lab-archive-key.gpg

    def key_file(self, distro: str) -> str:
        """The key's file name in the repository, as NVIDIA names its own: the key id's last 8 hex digits,
        lower case (3bf863cc.pub) except debian13's, upper case (8793F200.pub)."""
        short = self.fingerprint[-8:]
        return f"{short.upper() if distro in OWN_KEY_DISTROS else short.lower()}.pub"

    def gpg(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run(["gpg", "--homedir", str(self.home), "--batch", "--yes", "--no-tty",
                    "--pinentry-mode", "loopback", "--passphrase", "", *args], **kwargs)

    def stop_agent(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
                       capture_output=True, check=False)


def lab_key(keys: Path) -> LabKey:
    return LabKey(keys / "gnupg", "", keys / "lab-archive-key.asc", keys / "lab-archive-key.gpg")


def key_dirs(keys: Path) -> dict[str, Path]:
    """Where each distro's signing key lives: keys/ for most, keys/<distro>/ for those with their own."""
    return {d: keys / d if d in OWN_KEY_DISTROS else keys for d in DISTROS}


def ensure_key(keys: Path) -> LabKey:
    """A lab archive signing key, made once (no passphrase) into keys/gnupg."""
    home = keys / "gnupg"
    key = lab_key(keys)
    stamp = keys / "fingerprint"
    if stamp.is_file() and key.armored.is_file() and key.binary.is_file() and home.is_dir():
        key.fingerprint = stamp.read_text().strip()
        return key
    home.mkdir(parents=True, exist_ok=True)
    keys.chmod(0o755)
    home.chmod(0o700)
    if len(str(home)) > 80 and not Path(f"/run/user/{os.getuid()}").is_dir():
        say(f"note: the key directory's path ({home}) is long; gpg-agent may refuse its socket path.")
    listing = key.gpg("--with-colons", "--list-secret-keys").stdout
    if "fpr:" not in listing:
        say(f"making the lab's archive signing key in {home} (once).")
        uid = KEY_UID if keys.name == "keys" else KEY_UID.replace("repository)", f"repository, {keys.name})")
        key.gpg("--quick-gen-key", uid, "rsa4096", "sign", "never")
        listing = key.gpg("--with-colons", "--list-secret-keys").stdout
    key.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    write_atomic(key.armored, key.gpg("--armor", "--export", key.fingerprint).stdout.encode())
    write_atomic(key.binary, key.gpg("--export", key.fingerprint, text=False).stdout)
    write_atomic(stamp, (key.fingerprint + "\n").encode())
    return key


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


# --------------------------------------------------------------------------------------------- packages

@dataclass
class Package:
    name: str
    version: str
    arch: str
    summary: str
    details: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)   # path -> (content, mode)
    symlinks: dict[str, str] = field(default_factory=dict)              # path -> target
    scripts: dict[str, str] = field(default_factory=dict)               # postinst, prerm, ...
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    section: str = "multiverse/devel"
    homepage: str = "https://developer.nvidia.com/cuda-zone"

    @property
    def filename(self) -> str:
        # As in Debian's archive, the epoch is not part of the file's name.
        return f"{self.name}_{self.version.split(':', 1)[-1]}_{self.arch}.deb"

    def control(self) -> str:
        installed_kib = sum((len(data) + 1023) // 1024 for data, _ in self.files.values()) or 1
        fields = [
            ("Package", self.name), ("Version", self.version), ("Architecture", self.arch),
            ("Maintainer", MAINTAINER), ("Installed-Size", str(installed_kib)),
            ("Depends", ", ".join(self.depends)), ("Conflicts", ", ".join(self.conflicts)),
            ("Replaces", ", ".join(self.replaces)), ("Provides", ", ".join(self.provides)),
            ("Section", self.section), ("Priority", "optional"), ("Homepage", self.homepage),
        ]
        lines = [f"{name}: {value}" for name, value in fields if value]
        lines.append(f"Description: {self.summary} [simulated lab stand-in]")
        body = (f"{self.details}\n.\nSimulated stand-in built by moefleet's lab (sim/mirrors/build.py)\n"
                "for hosts without GPUs. It is not NVIDIA software and touches no kernel module.")
        lines += [" ." if not line.strip() or line == "." else f" {line}" for line in body.splitlines()]
        return "\n".join(lines) + "\n"


def simulated_note(what: str) -> bytes:
    return (f"{what}\n\nThis package is a stand-in from the moefleet simulated lab (sim/mirrors/build.py).\n"
            "It installs scripts that answer like NVIDIA's tools; there is no GPU, no kernel module and\n"
            "no NVIDIA software in it. Never install it on a real host.\n").encode()


PERSISTENCED = """#!/bin/sh
# nvidia-persistenced stand-in (moefleet simulated lab): there is no GPU to keep initialised,
# so it only stays up, logs that it started, and stops cleanly on SIGTERM.
case "$1" in
  -v|--version) echo "nvidia-persistenced:  version {version} (simulated)"; exit 0 ;;
  -h|--help) echo "Usage: nvidia-persistenced [options] (simulated stand-in; options ignored)"; exit 0 ;;
esac
echo "nvidia-persistenced: Started (sim)"
trap 'echo "nvidia-persistenced: Shutdown (sim)"; exit 0' TERM INT
while :; do
  sleep 3600 &
  wait $!
done
"""

PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (simulated lab stand-in)
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

# The simulated GPUs' shared state (the nvidia-smi stand-in reads what simulated CUDA processes write):
# under /dev/shm, which stays writable under the service's ProtectSystem=strict, as NCCL's files do.
SIM_GPU_TMPFILES = "d /dev/shm/sim-gpu 0755 root root -\nd /dev/shm/sim-gpu/procs 1777 root root -\n"
DRIVER_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemd-tmpfiles --create sim-gpu.conf || true
fi
exit 0
"""

CUDA_POSTINST = """#!/bin/sh
# Like NVIDIA's toolkit packages: /usr/local/cuda and /usr/local/cuda-{major} are alternatives,
# the newest installed toolkit wins in auto mode.
set -e
if [ "$1" = configure ]; then
    update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{xy} {priority}
    update-alternatives --install /usr/local/cuda-{major} cuda-{major} /usr/local/cuda-{xy} {priority}
fi
exit 0
"""

CUDA_PRERM = """#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
    update-alternatives --remove cuda /usr/local/cuda-{xy} || true
    update-alternatives --remove cuda-{major} /usr/local/cuda-{xy} || true
fi
exit 0
"""


def cuda_version_json(release: str) -> bytes:
    """A version.json shaped like the toolkit's own (the keys a script would look for)."""
    nvcc = NVCC_VERSIONS[release.rsplit(".", 1)[0]]
    doc = {
        "cuda": {"name": "CUDA SDK", "version": release},
        "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": nvcc},
        "cuda_nvcc": {"name": "CUDA NVCC", "version": nvcc},
        "moefleet_sim": {"name": "moefleet simulated lab stand-in", "version": release},
    }
    return (json.dumps(doc, indent=3) + "\n").encode()


def family(distro: str) -> str:
    return "ubuntu" if distro.startswith("ubuntu") else "debian"


# nvidia-modprobe stand-in. The real one is setuid root: it loads nvidia / nvidia-uvm / nvidia-modeset and creates
# their device nodes on behalf of CUDA programs, and at boot for the driver role's nvidia-uvm-devices.service. As
# in NVIDIA's source (nvidia-modprobe.c): -c=N makes /dev/nvidiaN (N=255: /dev/nvidiactl) on major 195; with -u
# the minors are nvidia-uvm's instead (-u -c=0: /dev/nvidia-uvm and /dev/nvidia-uvm-tools, minors 0 and 1 of
# the major /proc/devices gives nvidia-uvm); -m makes /dev/nvidia-modeset (195:254). An existing node of the
# right type and number is kept, anything else there is replaced; a node it cannot make fails it (exit 1), as
# does everything it does not simulate (NVSwitch, NVLink, MIG capabilities, IMEX). Under NoNewPrivileges= (or
# nosuid) the setuid bit is ignored, so a process without CAP_SYS_MODULE / CAP_MKNOD gets nothing and it exits
# 1 without a word, as here. The lab's kernel has no nvidia-uvm in /proc/devices: the major comes from the
# lab's stand-in of the driver's lines there, /etc/sim-gpu/proc-devices (sim/lab/lab.py writes it).
NVIDIA_MODPROBE = r"""#!/bin/sh
# nvidia-modprobe stand-in (moefleet simulated lab): no kernel module exists in a container.
uvm=0; modeset=0; minors=""
while [ $# -gt 0 ]; do
  case "$1" in
    -u|--unified-memory) uvm=1 ;;
    -m|--modeset) modeset=1 ;;
    -c=*|--create-nvidia-device-file=*) minors="$minors ${1#*=}" ;;
    -c|--create-nvidia-device-file) shift; minors="$minors ${1:-x}" ;;
    -c*) minors="$minors ${1#-c}" ;;
    --version|-v) echo "nvidia-modprobe:  version {version} (simulated)"; exit 0 ;;
    *) exit 1 ;;
  esac
  shift
done
for m in $minors; do
  case "$m" in ''|*[!0-9]*) exit 1 ;; esac
  [ "$m" -le 255 ] || exit 1
done
# The real tool needs root (its setuid bit, which NoNewPrivileges= voids) to load modules and mknod.
[ "$(id -u)" = 0 ] || exit 1
dev=${SIM_GPU_DEV_DIR:-/dev}
run=${SIM_GPU_RUN_DIR:-/run/sim-gpu}
loaded() {  # the module the real tool would load, for tests to see
  mkdir -p "$run" || exit 1
  grep -qx "$1" "$run/modules" 2>/dev/null || echo "$1" >> "$run/modules"
}
node() {  # PATH MAJOR MINOR: a character device, mode 0666 (NVreg_DeviceFileMode), owned by root
  if [ ! -c "$1" ] || [ "$(stat -c %t:%T "$1")" != "$(printf %x:%x "$2" "$3")" ]; then
    rm -f "$1" && mknod -m 666 "$1" c "$2" "$3" || exit 1
  fi
  chmod 666 "$1" && chown 0:0 "$1" || exit 1
}
if [ "$uvm" = 1 ]; then
  loaded nvidia_uvm
  major=$(cat /proc/devices "${SIM_GPU_PROC_DEVICES:-/etc/sim-gpu/proc-devices}" 2>/dev/null \
          | awk '$2 == "nvidia-uvm" { print $1; exit }')
  [ -n "$major" ] || exit 1
  for m in $minors; do node "$dev/nvidia-uvm" "$major" "$m"; node "$dev/nvidia-uvm-tools" "$major" $((m + 1)); done
else
  loaded nvidia
  for m in $minors; do
    if [ "$m" = 255 ]; then node "$dev/nvidiactl" 195 255; else node "$dev/nvidia$m" 195 "$m"; fi
  done
fi
if [ "$modeset" = 1 ]; then
  loaded nvidia_modeset
  node "$dev/nvidia-modeset" 195 254
fi
exit 0
"""


def pinning_file(branch: str) -> bytes:
    """The preference a nvidia-driver-pinning-<branch> package installs: priority 1000 on the branch's
    versions of NVIDIA's driver packages, so apt prefers them to any newer branch and downgrades to them."""
    return (f"# Installed by nvidia-driver-pinning-{branch}: track driver branch {branch}.\n"
            "Package: *nvidia* cuda-drivers*\n"
            f"Pin: version {branch}.*\n"
            "Pin-Priority: 1000\n").encode()


def smi_for(smi: bytes, upstream: str) -> bytes:
    """The nvidia-smi stand-in reporting this package's driver version (a real host, once rebooted, runs
    the driver it installed); a host's simulated GPU spec may still override it."""
    pattern = re.compile(rb'"driver_version": "[0-9.]+"')
    if not pattern.search(smi):
        raise BuildError('the nvidia-smi stand-in has no default "driver_version": "X.Y.Z" to set per driver '
                         "package; keep that key in its DEFAULT_SPEC.")
    return pattern.sub(f'"driver_version": "{upstream}"'.encode(), smi, count=1)


@dataclass
class Driver:
    """One driver release in one repository family."""
    branch: str
    upstream: str
    flavour: str

    @property
    def version(self) -> str:
        return f"{self.upstream}-{REVISIONS[self.flavour]}"

    @property
    def suffixed(self) -> bool:
        return int(self.branch) <= LAST_SUFFIXED_BRANCH


def doc(name: str, text: str) -> dict[str, tuple[bytes, int]]:
    return {f"usr/share/doc/{name}/SIMULATED": (simulated_note(text), 0o644)}


def driver_packages(drv: Driver, smi: bytes, arch: str) -> list[Package]:
    """NVIDIA's driver packages of one release, named as its repositories name them. Debian (NVIDIA's
    debian12/debian13): unsuffixed packages whose versions carry the branch; the metapackages, also the
    branch-named nvidia-open-<b>, depend open-ended (>= version), so alone they pull the newest branch.
    Ubuntu (ubuntu2204/ubuntu2404): up to 580 branch-named packages tied to each other by exact versions,
    plus an unsuffixed nvidia-open per release; from 590 on the unsuffixed names only."""
    b, v, up = drv.branch, drv.version, drv.upstream
    pkgs: list[Package] = []
    smi_files = {"usr/bin/nvidia-smi": (smi_for(smi, up), 0o755),
                 "usr/lib/tmpfiles.d/sim-gpu.conf": (SIM_GPU_TMPFILES.encode(), 0o644)}
    daemon_files = {
        "usr/bin/nvidia-persistenced": (PERSISTENCED.replace("{version}", up).encode(), 0o755),
        "lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT.encode(), 0o644),
    }
    daemon_details = ("A daemon that only stays up and logs \"Started (sim)\", with its systemd unit\n"
                      "nvidia-persistenced.service (not enabled by the package: the role enables it).")
    pkgs.append(Package(
        name="nvidia-modprobe", version=v, arch=arch, summary="Load the NVIDIA kernel modules and create device nodes",
        details="Stand-in of the setuid helper: as root -c=N makes /dev/nvidiaN (255: nvidiactl), -u -c=0\n"
                "/dev/nvidia-uvm*, -m /dev/nvidia-modeset; without root (NoNewPrivileges voids setuid) it exits 1.",
        files={"usr/bin/nvidia-modprobe": (NVIDIA_MODPROBE.replace("{version}", up).encode(), 0o755),
               **doc("nvidia-modprobe", f"nvidia-modprobe {v} (simulated).")},
        section="NVIDIA"))
    pkgs.append(Package(
        name=f"nvidia-driver-pinning-{b}", version=f"{b}-{REVISIONS[drv.flavour]}", arch="all",
        summary=f"APT driver pinning file for driver branch {b}.",
        details=f"Installs /etc/apt/preferences.d/nvidia-driver-pinning-{b}: priority 1000 for version {b}.*\n"
                "of NVIDIA's driver packages. One pinning package at a time.",
        files={f"etc/apt/preferences.d/nvidia-driver-pinning-{b}": (pinning_file(b), 0o644),
               **doc(f"nvidia-driver-pinning-{b}", f"nvidia-driver-pinning-{b} (simulated).")},
        provides=["nvidia-driver-pinning"], conflicts=["nvidia-driver-pinning"], replaces=["nvidia-driver-pinning"],
        section="NVIDIA"))
    if drv.flavour == "debian":
        ge = f"(>= {up})"
        pkgs += [
            Package(name="nvidia-driver-cuda", version=v, arch=arch,
                    summary="NVIDIA driver CUDA integration components",
                    details="Installs the nvidia-smi stand-in as /usr/bin/nvidia-smi.",
                    files={**smi_files, **doc("nvidia-driver-cuda", f"nvidia-driver-cuda {v} (simulated).")},
                    depends=["python3"], scripts={"postinst": DRIVER_POSTINST}, section="NVIDIA"),
            Package(name="nvidia-kernel-open-dkms", version=v, arch=arch,
                    summary="NVIDIA open GPU kernel module (DKMS source)",
                    details="Documentation only: no kernel module is built in the lab.",
                    files=doc("nvidia-kernel-open-dkms", f"nvidia-kernel-open-dkms {v} (simulated)."),
                    section="NVIDIA"),
            Package(name="nvidia-persistenced", version=v, arch=arch, summary="NVIDIA persistence daemon",
                    details=daemon_details,
                    files={**daemon_files, **doc("nvidia-persistenced", f"nvidia-persistenced {v} (simulated).")},
                    section="NVIDIA"),
        ]
        meta_depends = [f"nvidia-driver-cuda {ge}", f"nvidia-kernel-open-dkms {ge}", f"nvidia-persistenced {ge}",
                        f"nvidia-modprobe {ge}"]
        for name in ["nvidia-open", *([f"nvidia-open-{b}"] if drv.suffixed else [])]:
            pkgs.append(Package(
                name=name, version=v, arch=arch, summary="NVIDIA driver with open kernel modules (metapackage)",
                details=f"Release {up}. Depends open-ended on the driver's packages, as NVIDIA's do.",
                files=doc(name, f"{name} {v}: open kernel module driver metapackage (simulated)."),
                depends=meta_depends, conflicts=["cuda-drivers"], section="NVIDIA"))
        return pkgs
    # Ubuntu
    sfx = f"-{b}" if drv.suffixed else ""
    utils, compute, dkms = f"nvidia-utils{sfx}", f"nvidia-compute-utils{sfx}", f"nvidia-dkms{sfx}-open"
    driver = f"nvidia-driver{sfx}-open"
    exact = f"(= {v})"
    pkgs += [
        # Every flavour of a file-carrying package excludes the others through one virtual name.
        Package(name=utils, version=v, arch=arch, summary="NVIDIA driver support binaries",
                details="Installs the nvidia-smi stand-in as /usr/bin/nvidia-smi.",
                files={**smi_files, **doc(utils, f"{utils} {v} (simulated).")}, depends=["python3"],
                provides=["nvidia-utils-any"], conflicts=["nvidia-utils-any"], replaces=["nvidia-utils-any"],
                scripts={"postinst": DRIVER_POSTINST}, section="multiverse/utils"),
        Package(name=compute, version=v, arch=arch, summary="NVIDIA compute utilities",
                details=daemon_details + "\nOn NVIDIA's Ubuntu repositories the daemon ships here.",
                files={**daemon_files, **doc(compute, f"{compute} {v}: nvidia-persistenced (simulated).")},
                provides=["nvidia-persistenced"], conflicts=["nvidia-persistenced"], replaces=["nvidia-persistenced"],
                section="multiverse/utils"),
        Package(name=dkms, version=v, arch=arch, summary="NVIDIA open kernel module, DKMS",
                details="Documentation only: no kernel module is built in the lab.",
                files=doc(dkms, f"{dkms} {v} (simulated)."),
                provides=["nvidia-dkms-any"], conflicts=["nvidia-dkms-any"], replaces=["nvidia-dkms-any"],
                section="multiverse/kernel"),
        Package(name=driver, version=v, arch=arch, summary="NVIDIA driver metapackage, open kernel modules",
                details=f"Release {up}: the branch's utilities, compute utilities and DKMS module.",
                files=doc(driver, f"{driver} {v} (simulated)."),
                depends=[f"{utils} {exact}", f"{compute} {exact}", f"{dkms} {exact}", f"nvidia-modprobe (>= {up})"],
                section="multiverse/libs"),
    ]
    if drv.suffixed:
        pkgs.append(Package(
            name=f"nvidia-open-{b}", version=v, arch=arch, summary=f"NVIDIA open kernel module driver, branch {b}",
            details=f"Release {up}.", files=doc(f"nvidia-open-{b}", f"nvidia-open-{b} {v} (simulated)."),
            depends=[f"{driver} {exact}"], conflicts=["cuda-drivers"], section="multiverse/libs"))
    pkgs.append(Package(
        name="nvidia-open", version=v, arch=arch, summary="NVIDIA driver with open kernel modules (metapackage)",
        details=f"Release {up}.", files=doc("nvidia-open", f"nvidia-open {v} (simulated)."),
        depends=[f"nvidia-open-{b} {exact}" if drv.suffixed else f"{driver} {exact}"], conflicts=["cuda-drivers"],
        section="multiverse/libs"))
    return pkgs


def packages(inputs: Inputs, arch: str, flavour: str) -> list[Package]:
    """The stand-in packages of one repository family for one architecture, cuda-keyring aside (its key
    and source differ per distro: keyring_package)."""
    smi = inputs.nvidia_smi.read_bytes()
    nvcc = inputs.nvcc.read_bytes()
    pkgs: list[Package] = []
    for branch, upstream in DRIVER_BRANCHES.items():
        pkgs += driver_packages(Driver(branch, upstream, flavour), smi, arch)
    newest = Driver(*max(DRIVER_BRANCHES.items(), key=lambda kv: int(kv[0])), flavour)
    pkgs.append(Package(
        name="cuda-drivers", version=newest.version, arch=arch,
        summary="NVIDIA driver, proprietary kernel module flavour (metapackage)",
        details="The proprietary flavour, which Blackwell GPUs refuse. It conflicts with nvidia-open:\n"
                "a host uses one or the other.",
        files=doc("cuda-drivers", f"cuda-drivers {newest.version}: proprietary driver flavour (simulated)."),
        conflicts=["nvidia-open", *(f"nvidia-open-{b}" for b in DRIVER_BRANCHES
                                    if int(b) <= LAST_SUFFIXED_BRANCH)],
    ))
    for xy, release in TOOLKITS.items():
        major, minor = xy.split(".")
        root = f"usr/local/cuda-{xy}"
        fmt = {"xy": xy, "major": major, "priority": f"{major}{minor}"}
        pkgs.append(Package(
            name=f"cuda-toolkit-{major}-{minor}", version=f"{release}-1", arch=arch,
            summary=f"CUDA Toolkit {xy} meta-package",
            details=f"CUDA Toolkit {release} layout under /usr/local/cuda-{xy}: bin/nvcc (stand-in),\n"
                    f"lib64/libcudart.so.{major} (empty) and version.json. /usr/local/cuda and\n"
                    f"/usr/local/cuda-{major} are kept by update-alternatives.",
            files={
                f"{root}/bin/nvcc": (nvcc, 0o755),
                f"{root}/lib64/libcudart.so.{release}": (b"", 0o644),
                f"{root}/version.json": (cuda_version_json(release), 0o644),
                f"usr/share/doc/cuda-toolkit-{major}-{minor}/SIMULATED": (simulated_note(
                    f"cuda-toolkit-{major}-{minor} {release}-1: CUDA Toolkit {xy} (simulated)."), 0o644),
            },
            symlinks={
                f"{root}/lib64/libcudart.so.{major}": f"libcudart.so.{release}",
                f"{root}/lib64/libcudart.so": f"libcudart.so.{major}",
            },
            scripts={"postinst": CUDA_POSTINST.format(**fmt), "prerm": CUDA_PRERM.format(**fmt)},
            depends=["python3"],
        ))
    return pkgs


def kernel_headers_packages(distro: str, arch: str) -> list[Package]:
    """The headers of the kernel the layout's lab hosts stand in for, and its flavour's metapackage depending on
    them, as Debian's archive has them (linux-headers-cloud-amd64 6.1.176-1 Depends linux-headers-6.1.0-50-cloud-amd64
    (= 6.1.176-1)); Ubuntu's are given the same shape. The headers are a directory with a Makefile saying what it is
    and the modules directory's build link to it, where DKMS looks: no compiler, nothing to build against."""
    if arch != "amd64":
        return []
    kernel, version = KERNELS[distro]
    version = f"{KERNEL_EPOCH}:{version}"
    flavour = re.sub(r"^[0-9.]+(?:-[0-9]+|[+]deb[0-9]+)-", "", kernel)
    # Debian 12 and Ubuntu 22.04 ship /lib/modules; Debian 13 and Ubuntu 24.04 /usr/lib/modules.
    modules = "lib/modules" if distro in ("debian12", "ubuntu2204") else "usr/lib/modules"
    headers, meta = f"linux-headers-{kernel}", f"linux-headers-{flavour}"
    home = "https://www.kernel.org/"
    makefile = (f"# linux-headers-{kernel} (simulated lab stand-in, sim/mirrors/build.py): no kernel sources here.\n"
                "all:\n\t@echo 'simulated kernel headers: nothing to build' >&2; exit 1\n").encode()
    return [
        Package(name=headers, version=version, arch=arch, summary=f"Header files for Linux {kernel}",
                details=f"The kernel {kernel}'s headers directory /usr/src/{headers} (a Makefile only) and\n"
                        f"/{modules}/{kernel}/build linking to it, where DKMS looks for them.",
                files={f"usr/src/{headers}/Makefile": (makefile, 0o644),
                       **doc(headers, f"{headers} {version} (simulated).")},
                symlinks={f"{modules}/{kernel}/build": f"/usr/src/{headers}"},
                section="kernel", homepage=home),
        Package(name=meta, version=version, arch=arch,
                summary=f"Header files for Linux {flavour} configuration (meta-package)",
                details=f"Depends on the headers of the {flavour} flavour's newest kernel, {kernel}.",
                files=doc(meta, f"{meta} {version}: the {flavour} flavour's headers metapackage (simulated)."),
                depends=[f"{headers} (= {version})"], section="kernel", homepage=home),
    ]


def keyring_package(distro: str, arch: str, key: LabKey) -> Package:
    """cuda-keyring as NVIDIA ships it: the repository's key in /usr/share/keyrings and an apt source for
    the repository, signed-by that keyring (so a second source with another Signed-By breaks apt)."""
    url = f"{LAB_MIRROR_URL}/apt/{distro}/{ARCH_DIRS[arch]}/"
    source = f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {url} /\n"
    return Package(
        name="cuda-keyring", version=CUDA_KEYRING_VERSION, arch="all",
        summary="GPG keyring for the CUDA repository",
        details="Installs the lab's archive key as /usr/share/keyrings/cuda-archive-keyring.gpg and the\n"
                f"apt source /etc/apt/sources.list.d/cuda-{distro}-{ARCH_DIRS[arch]}.list, as NVIDIA's does.",
        files={
            "usr/share/keyrings/cuda-archive-keyring.gpg": (key.binary.read_bytes(), 0o644),
            f"etc/apt/sources.list.d/cuda-{distro}-{ARCH_DIRS[arch]}.list": (source.encode(), 0o644),
            **doc("cuda-keyring", f"cuda-keyring {CUDA_KEYRING_VERSION}: the lab archive key {key.fingerprint}."),
        },
        section="multiverse/misc",
    )


def build_deb(pkg: Package, work: Path, out_dir: Path) -> Path:
    tree = work / f"{pkg.name}_{pkg.version}_{pkg.arch}"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(pkg.control())
    for name, text in pkg.scripts.items():
        script = tree / "DEBIAN" / name
        script.write_text(text)
        script.chmod(0o755)
    for rel, (data, mode) in pkg.files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    for rel, target in pkg.symlinks.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    for path in [tree, *tree.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    deb = out_dir / pkg.filename
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)], env=env)
    return deb


def packages_stanza(pkg: Package, deb: Path) -> str:
    data = deb.read_bytes()
    sums = [("MD5sum", hashlib.md5(data).hexdigest()), ("SHA1", hashlib.sha1(data).hexdigest()),
            ("SHA256", hashlib.sha256(data).hexdigest()), ("SHA512", hashlib.sha512(data).hexdigest())]
    control = pkg.control()
    head, _, description = control.partition("Description:")
    extra = [f"Filename: ./{deb.name}", f"Size: {len(data)}", *(f"{k}: {v}" for k, v in sums)]
    return head + "\n".join(extra) + "\nDescription:" + description


def release_text(repo: Path, arch: str, names: list[str]) -> str:
    lines = [
        "Origin: moefleet lab",
        "Label: NVIDIA CUDA (simulated lab stand-in)",
        f"Architectures: {arch}",
        f"Date: {email.utils.formatdate(usegmt=True).replace('GMT', 'UTC')}",
        "Description: Stand-in for NVIDIA's CUDA repository, for moefleet's simulated lab only",
    ]
    for title, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"), ("SHA512", "sha512")):
        lines.append(f"{title}:")
        for name in names:
            data = (repo / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {name}")
    return "\n".join(lines) + "\n"


def build_apt(inputs: Inputs, keys: dict[str, LabKey], out: Path, arches: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="moefleet-apt-") as tmp:
        work = Path(tmp)
        stage = staging(out / "apt")
        built: dict[tuple[str, str], list[tuple[Path, str]]] = {}
        for arch in arches:
            archive_entries: list[tuple[Path, str]] = []
            for flavour in sorted({family(d) for d in DISTROS}):
                pool = work / f"pool-{flavour}-{arch}"
                pool.mkdir()
                built[flavour, arch] = [(build_deb(pkg, work / "trees", pool), packages_stanza_of(pkg, work, pool))
                                        for pkg in packages(inputs, arch, flavour)]
            for distro in DISTROS:
                key = keys[distro]
                repo = stage / distro / ARCH_DIRS[arch]
                repo.mkdir(parents=True)
                own = work / f"pool-{distro}-{arch}"
                own.mkdir()
                entries = [*built[family(distro), arch],
                           *((build_deb(pkg, work / "trees", own), packages_stanza_of(pkg, work, own))
                             for pkg in [keyring_package(distro, arch, key), *kernel_headers_packages(distro, arch)])]
                for deb, _ in entries:
                    link_or_copy(deb, repo / deb.name)
                entries.sort(key=lambda e: e[0].name)
                packages_bytes = "\n".join(stanza for _, stanza in entries).encode()
                (repo / "Packages").write_bytes(packages_bytes)
                with gzip.GzipFile(repo / "Packages.gz", "wb", compresslevel=9, mtime=0) as gz:
                    gz.write(packages_bytes)
                (repo / "Release").write_text(release_text(repo, arch, ["Packages", "Packages.gz"]))
                release = str(repo / "Release")
                key.gpg("--local-user", key.fingerprint, "--digest-algo", "SHA512", "--clearsign",
                        "--output", str(repo / "InRelease"), release)
                key.gpg("--local-user", key.fingerprint, "--digest-algo", "SHA512", "--armor",
                        "--detach-sign", "--output", str(repo / "Release.gpg"), release)
                shutil.copyfile(key.armored, repo / "lab-archive-key.asc")
                shutil.copyfile(key.binary, repo / "lab-archive-key.gpg")
                shutil.copyfile(key.armored, repo / key.key_file(distro))
                archive_entries += [e for e in entries if e[0].name.startswith("linux-headers-")]
            # The distribution archives' part a lab host needs from them: its kernel's headers, which a real host
            # finds in the sources it already has (prepare.yml adds this one) before NVIDIA's repository is added.
            # One repository for every layout's kernel (their package names differ); unsigned, as a local archive
            # copy often is ([trusted=yes] in the source line).
            archive = stage / ARCHIVE_DIR / ARCH_DIRS[arch]
            archive.mkdir(parents=True)
            archive_entries.sort(key=lambda e: e[0].name)
            for deb, _ in archive_entries:
                link_or_copy(deb, archive / deb.name)
            (archive / "Packages").write_bytes("\n".join(stanza for _, stanza in archive_entries).encode())
            (archive / "Release").write_text(release_text(archive, arch, ["Packages"]))
        swap_in(stage, out / "apt")


def packages_stanza_of(pkg: Package, work: Path, pool: Path) -> str:
    return packages_stanza(pkg, pool / pkg.filename)


def link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def make_readable(tree: Path) -> None:
    """The mirror container serves these files; make them world-readable whatever the umask."""
    for path in [tree, *tree.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod(0o755 if path.is_dir() else 0o644)


def staging(target: Path) -> Path:
    """A fresh directory beside target (same filesystem), to be swapped in when complete."""
    stage = target.with_name(f".{target.name}.new")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    return stage


def swap_in(stage: Path, target: Path) -> None:
    """Replace target by stage with two renames, so a server never sees a half-built tree."""
    make_readable(stage)
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    stage.rename(target)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------- pypi

def sglang_versions(sglang: Path) -> list[str]:
    """The versions the index serves the simulator as: one per release its pyproject.toml lists under
    [tool.moefleet-sim] releases, each with the local label of its own version ("0.5.23+moefleetsim"), so that
    ``pip install sglang==0.5.23`` takes that one (PEP 440 ignores a local label against a specifier without one);
    without that list, the one version pyproject.toml names."""
    data = tomllib.loads((sglang / "pyproject.toml").read_text())
    version = str(data.get("project", {}).get("version", ""))
    releases = data.get("tool", {}).get("moefleet-sim", {}).get("releases")
    if releases is None:
        return [version]
    if not (isinstance(releases, list) and releases and all(isinstance(r, str) and r for r in releases)):
        raise BuildError(f"{sglang / 'pyproject.toml'}: [tool.moefleet-sim] releases must be a list of SGLang "
                         f"versions such as [\"0.5.10\", \"0.5.23\"], not {releases!r}.")
    _, plus, label = version.partition("+")
    return [f"{release}{plus}{label}" for release in releases]


def build_wheel(sglang: Path, work: Path, version: str | None = None) -> Path:
    """Build the simulator's wheel from a copy of its tree (no build/ or egg-info left in sim/), as ``version`` when
    given: the copy's pyproject.toml names it, so the wheel's metadata says which release the simulator is."""
    src = work / "src"
    for path in source_files(sglang):
        dst = src / path.relative_to(sglang)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst)
    if version is not None:
        pyproject = src / "pyproject.toml"
        text, count = re.subn(r'^version\s*=\s*"[^"]*"\s*$', f'version = "{version}"', pyproject.read_text(),
                              count=1, flags=re.M)
        if count != 1:
            raise BuildError(f"{sglang / 'pyproject.toml'} has no version = \"...\" line in [project] to set "
                             f"to {version}; write the version there as a plain string.")
        pyproject.write_text(text)
    wheels = work / "wheels"
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), PIP_DISABLE_PIP_VERSION_CHECK="1")
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels)]
    if can_build_offline():
        cmd = [*base, "--no-build-isolation", "--no-index", str(src)]
        hint = ""
    else:
        say(f"{sys.executable} lacks setuptools with bdist_wheel (setuptools >= 70.1, or setuptools and "
            "wheel); pip fetches them from the package index for this build.")
        cmd = [*base, str(src)]
        hint = (" Without access to a package index, install setuptools>=70.1 (or setuptools and wheel) "
                f"for {sys.executable} and run build.py again.")
    as_version = f" as {version}" if version is not None else ""
    try:
        run(cmd, env=env)
    except BuildError as exc:
        raise BuildError(f"could not build the SGLang simulator's wheel{as_version} from {sglang}: {exc}{hint}"
                         ) from exc
    built = sorted(wheels.glob("*.whl"))
    if len(built) != 1:
        raise BuildError(f"building {sglang}{as_version} gave {len(built)} wheels instead of one.")
    return built[0]


def can_build_offline() -> bool:
    """Whether this Python can build a wheel without fetching a build backend."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    from importlib.metadata import version
    major, minor, *_ = (int(p) if p.isdigit() else 0 for p in version("setuptools").split(".")[:2] + ["0"])
    return (major, minor) >= (70, 1)


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def simple_page(title: str, links: list[tuple[str, str, dict[str, str]]]) -> str:
    rows = []
    for href, text, attrs in links:
        extra = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
        rows.append(f'    <a href="{html.escape(href)}"{extra}>{html.escape(text)}</a><br/>')
    return ("<!DOCTYPE html>\n<html>\n  <head>\n"
            '    <meta name="pypi:repository-version" content="1.0">\n'
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
            f"    <h1>{html.escape(title)}</h1>\n" + "\n".join(rows) + "\n  </body>\n</html>\n")


# The model gateway the sglang_router role installs (its sglang_router_package_spec) and its dependencies:
# the real wheels from PyPI, fetched once into .lab/router-wheels (the lab directory's, whatever OUT is), and
# served beside the simulator by the same index.
ROUTER_SPEC = "smg==1.13.0"
# The lab hosts' Pythons: Debian 12 has 3.11, Debian 13 3.13 (compiled wheels are per version).
LAB_HOST_PYTHONS = ("3.11", "3.13")


def fetch_wheels(spec: str, dest: Path, pythons: tuple[str, ...] = LAB_HOST_PYTHONS) -> list[Path]:
    """SPEC and its dependencies, PyPI's CPython x86_64 wheels for each of PYTHONS, fetched once into DEST.

    Also the Hub stand-in's build (sim/hub/hub.py) fetches the real hf client with it."""
    dest.mkdir(parents=True, exist_ok=True)
    for python in pythons:
        stamp = dest / f".fetched-{python}"
        if stamp.is_file() and stamp.read_text() == spec:
            continue
        say(f"fetching {spec} and its dependencies for Python {python} into {dest} (once)")
        cmd = [sys.executable, "-m", "pip", "download", spec, "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform",
               "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", str(dest), "-q"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"pip could not fetch {spec} ({result.stderr.strip()[-400:]}); put its "
                             f"wheels into {dest} by hand, or give pip a reachable index (PIP_INDEX_URL).")
        stamp.write_text(spec)
    return sorted(dest.glob("*.whl"))


def write_index(root: Path, wheels: list[Path], attrs: dict[str, dict[str, str]] | None = None) -> None:
    """A PEP 503 index of WHEELS at ROOT/simple/, the files under ROOT/packages/<project>/; ATTRS adds link
    attributes (data-requires-python) by file name. Also the Hub stand-in's client index (sim/hub/hub.py)."""
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        projects.setdefault(normalize(wheel.name.split("-")[0]), []).append(wheel)
    for project, files in sorted(projects.items()):
        (root / "packages" / project).mkdir(parents=True)
        links = []
        for wheel in files:
            shutil.copy2(wheel, root / "packages" / project / wheel.name)
            sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append((f"../../packages/{project}/{urllib.parse.quote(wheel.name)}#sha256={sha}",
                          wheel.name, (attrs or {}).get(wheel.name, {})))
        (root / "simple" / project).mkdir(parents=True)
        (root / "simple" / project / "index.html").write_text(simple_page(f"Links for {project}", links))
    (root / "simple" / "index.html").write_text(simple_page(
        "Simple index", [(f"{n}/", n, {}) for n in sorted(projects)]))


def build_pypi(inputs: Inputs, out: Path, extra_wheels: list[Path] = ()) -> list[str]:
    """The index at out/pypi: a wheel of the simulator per version sglang_versions names, and extra_wheels.
    Returns the simulator's versions."""
    meta = tomllib.loads((inputs.sglang / "pyproject.toml").read_text()).get("project", {})
    name = normalize(meta.get("name", ""))
    if name != "sglang":
        raise BuildError(f"{inputs.sglang / 'pyproject.toml'} names the distribution {meta.get('name')!r}, "
                         "not 'sglang'; the role installs sglang from this index.")
    if meta.get("dependencies"):
        say(f"note: the simulator declares dependencies {meta['dependencies']}; this index serves only "
            "sglang: lab hosts get them from the Hub stand-in's index (sim/hub; sglang_pip_extra_index_url).")
    versions = sglang_versions(inputs.sglang)
    with tempfile.TemporaryDirectory(prefix="moefleet-pypi-") as tmp:
        # each version from its own copy of the tree, so that no build sees another's files
        wheels = [build_wheel(inputs.sglang, Path(tmp) / version, version) for version in versions]
        stage = staging(out / "pypi")
        requires = {"data-requires-python": meta["requires-python"]} if meta.get("requires-python") else {}
        write_index(stage, [*wheels, *extra_wheels], {wheel.name: requires for wheel in wheels})
        swap_in(stage, out / "pypi")
    return versions


# --------------------------------------------------------------------------------------------- main

def host_arches() -> list[str]:
    try:
        native = run(["dpkg", "--print-architecture"]).stdout.strip()
    except BuildError:
        native = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64")
    return ["amd64"] if native not in ARCH_DIRS or native == "amd64" else ["amd64", native]


def apt_complete(out: Path, arches: list[str]) -> bool:
    signed = all((out / "apt" / d / ARCH_DIRS[a] / "InRelease").is_file() for d in DISTROS for a in arches)
    return signed and all((out / "apt" / ARCHIVE_DIR / ARCH_DIRS[a] / "Release").is_file() for a in arches)


def pypi_complete(out: Path, versions: list[str]) -> bool:
    """Whether the index lists the simulator at every one of ``versions`` and the model gateway."""
    page = out / "pypi" / "simple" / "sglang" / "index.html"
    if not page.is_file() or not (out / "pypi" / "simple" / "smg" / "index.html").is_file():
        return False
    listed = page.read_text()
    return all(f"sglang-{v}-py3-none-any.whl" in listed and
               (out / "pypi" / "packages" / "sglang" / f"sglang-{v}-py3-none-any.whl").is_file() for v in versions)


def build(out: Path, sim: Path, force: bool = False) -> dict[str, bool]:
    """Build what is out of date under out; returns which parts were rebuilt."""
    started = time.monotonic()
    inputs = Inputs.locate(sim)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp_path = out / ".build-stamp.json"
        try:
            stamp = json.loads(stamp_path.read_text())
        except (OSError, ValueError):
            stamp = {}
        me = Path(__file__).resolve()
        arches = host_arches()
        sglang_files = source_files(inputs.sglang)
        router_wheels = fetch_wheels(ROUTER_SPEC, DEFAULT_OUT.parent / "router-wheels")
        pypi_hash = digest(me, *(str(p.relative_to(inputs.sglang)) for p in sglang_files), *sglang_files,
                           *(w.name for w in router_wheels))
        versions = sglang_versions(inputs.sglang)
        want_pypi = force or stamp.get("pypi") != pypi_hash or not pypi_complete(out, versions)
        keys = out.parent / "keys"
        dirs = key_dirs(keys)
        fingerprints = [(d / "fingerprint").read_text().strip() if (d / "fingerprint").is_file() else "none"
                        for d in sorted(set(dirs.values()))]
        apt_hash = digest(me, inputs.nvidia_smi, inputs.nvcc, *fingerprints, ",".join(arches))
        want_apt = force or stamp.get("apt") != apt_hash or not apt_complete(out, arches)
        if want_apt:
            ensure_tools()
            made = {d: lab_key(d) for d in set(dirs.values())}
            try:
                made = {d: ensure_key(d) for d in made}
                fingerprints = [made[d].fingerprint for d in sorted(made)]
                apt_hash = digest(me, inputs.nvidia_smi, inputs.nvcc, *fingerprints, ",".join(arches))
                build_apt(inputs, {distro: made[d] for distro, d in dirs.items()}, out, arches)
            finally:
                for key in made.values():
                    key.stop_agent()
            stamp["apt"] = apt_hash
            write_atomic(stamp_path, json.dumps(stamp, indent=2).encode())
            say(f"apt repository built for {', '.join(DISTROS)} ({', '.join(arches)}), "
                f"signed by {', '.join(fingerprints)}.")
        else:
            say("apt repository is up to date (inputs unchanged).")
        if want_pypi:
            build_pypi(inputs, out, router_wheels)
            stamp["pypi"] = pypi_hash
            write_atomic(stamp_path, json.dumps(stamp, indent=2).encode())
            say(f"package index built (pypi/simple/sglang/: {', '.join(versions)}; and smg with its "
                "dependencies).")
        else:
            say("package index is up to date (inputs unchanged).")
    say(f"mirrors ready in {out} ({time.monotonic() - started:.1f} s).")
    return {"apt": want_apt, "pypi": want_pypi}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT,
                        help=f"output root (default: {DEFAULT_OUT})")
    parser.add_argument("--inputs", type=Path, default=REPO / "sim",
                        help="directory holding gpu/nvidia-smi, gpu/nvcc and sglang/ "
                             "(default: the repository's sim/)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    args = parser.parse_args(argv)
    try:
        build(args.out.resolve(), args.inputs.resolve(), force=args.force)
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
