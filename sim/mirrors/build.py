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

DISTROS = ("debian12", "ubuntu2204", "ubuntu2404")
# dpkg architecture -> directory name in NVIDIA's repo URL (.../repos/<distro>/<dir>/)
ARCH_DIRS = {"amd64": "x86_64", "arm64": "sbsa"}
MAINTAINER = "moefleet lab <lab@moefleet.invalid>"
KEY_UID = "moefleet lab archive key (simulated NVIDIA CUDA repository) <lab@moefleet.invalid>"
# Fixed timestamp for every file inside the .deb files, so equal inputs give equal packages.
SOURCE_DATE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z

# Driver branches and their versions as NVIDIA's repo names them (580 is the default, 570 the floor).
DRIVER_BRANCHES = {"580": "580.95.05-1", "570": "570.195.03-1"}
# CUDA toolkits: X.Y -> full release version; packages are cuda-toolkit-X-Y.
TOOLKITS = {"12.8": "12.8.1", "12.9": "12.9.1", "13.0": "13.0.2"}
# nvcc's own version in each of those releases (what version.json's cuda_nvcc says).
NVCC_VERSIONS = {"12.8": "12.8.93", "12.9": "12.9.86", "13.0": "13.0.88"}
CUDA_KEYRING_VERSION = "1.1-1"


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

    @property
    def short_id(self) -> str:
        """Last 8 hex digits of the key id, lower case: NVIDIA names its key file 3bf863cc.pub so."""
        return self.fingerprint[-8:].lower()

    def gpg(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run(["gpg", "--homedir", str(self.home), "--batch", "--yes", "--no-tty",
                    "--pinentry-mode", "loopback", "--passphrase", "", *args], **kwargs)

    def stop_agent(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
                       capture_output=True, check=False)


def ensure_key(keys: Path) -> LabKey:
    """The lab's archive signing key, made once (no passphrase) into keys/gnupg."""
    home = keys / "gnupg"
    key = LabKey(home, "", keys / "lab-archive-key.asc", keys / "lab-archive-key.gpg")
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
        key.gpg("--quick-gen-key", KEY_UID, "rsa4096", "sign", "never")
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
        return f"{self.name}_{self.version}_{self.arch}.deb"

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


def packages(inputs: Inputs, arch: str, key: LabKey, flavour: str = "debian") -> list[Package]:
    """The stand-in packages for one architecture. flavour "ubuntu" follows NVIDIA's Ubuntu repos, where
    the persistence daemon comes with the driver (nvidia-compute-utils-<branch>); "debian" follows the
    Debian repo, where it is its own package, nvidia-persistenced."""
    smi = inputs.nvidia_smi.read_bytes()
    nvcc = inputs.nvcc.read_bytes()
    pkgs: list[Package] = []
    branches = list(DRIVER_BRANCHES)
    for branch, version in DRIVER_BRANCHES.items():
        others = [f"nvidia-open-{b}" for b in branches if b != branch]
        utils = f"nvidia-compute-utils-{branch}"
        pkgs.append(Package(
            name=f"nvidia-open-{branch}", version=version, arch=arch,
            summary=f"NVIDIA driver with open kernel modules, branch {branch}",
            details=f"Driver branch {branch} ({version.split('-')[0]}), open kernel module flavour.\n"
                    "Installs the nvidia-smi stand-in as /usr/bin/nvidia-smi.",
            files={
                "usr/bin/nvidia-smi": (smi, 0o755),
                "usr/lib/tmpfiles.d/sim-gpu.conf": (SIM_GPU_TMPFILES.encode(), 0o644),
                f"usr/share/doc/nvidia-open-{branch}/SIMULATED": (simulated_note(
                    f"nvidia-open-{branch} {version}: NVIDIA open kernel module driver, branch {branch} "
                    "(simulated)."), 0o644),
            },
            depends=["python3", *([f"{utils} (= {version})"] if flavour == "ubuntu" else [])],
            conflicts=[*others, "cuda-drivers"], replaces=others, provides=["nvidia-smi"],
            scripts={"postinst": DRIVER_POSTINST},
        ))
        pkgs.append(Package(
            name="nvidia-open", version=version, arch=arch,
            summary="NVIDIA driver with open kernel modules (metapackage)",
            details=f"Pulls in nvidia-open-{branch}, the open kernel module driver of branch {branch}.",
            files={"usr/share/doc/nvidia-open/SIMULATED": (simulated_note(
                f"nvidia-open {version}: metapackage for nvidia-open-{branch} (simulated)."), 0o644)},
            depends=[f"nvidia-open-{branch} (= {version})"], conflicts=["cuda-drivers"],
        ))
        daemon_files = {
            "usr/bin/nvidia-persistenced": (
                PERSISTENCED.replace("{version}", version.split("-")[0]).encode(), 0o755),
            "lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT.encode(), 0o644),
        }
        daemon_details = ("A daemon that only stays up and logs \"Started (sim)\", with its systemd unit\n"
                          "nvidia-persistenced.service (not enabled by the package: the role enables it).")
        if flavour == "ubuntu":
            other_utils = [f"nvidia-compute-utils-{b}" for b in branches if b != branch]
            pkgs.append(Package(
                name=utils, version=version, arch=arch,
                summary=f"NVIDIA compute utilities, branch {branch}",
                details=daemon_details,
                files={**daemon_files, f"usr/share/doc/{utils}/SIMULATED": (simulated_note(
                    f"{utils} {version}: nvidia-persistenced of branch {branch} (simulated)."), 0o644)},
                conflicts=[*other_utils, "nvidia-persistenced"], replaces=[*other_utils, "nvidia-persistenced"],
                provides=["nvidia-persistenced"], section="multiverse/utils",
            ))
        else:
            pkgs.append(Package(
                name="nvidia-persistenced", version=version, arch=arch,
                summary="NVIDIA persistence daemon",
                details=daemon_details,
                files={**daemon_files, "usr/share/doc/nvidia-persistenced/SIMULATED": (simulated_note(
                    f"nvidia-persistenced {version} (simulated)."), 0o644)},
                section="multiverse/utils",
            ))
    newest = max(DRIVER_BRANCHES.values())
    pkgs.append(Package(
        name="cuda-drivers", version=newest, arch=arch,
        summary="NVIDIA driver, proprietary kernel module flavour (metapackage)",
        details="The proprietary flavour, which Blackwell GPUs refuse. It conflicts with nvidia-open:\n"
                "a host uses one or the other.",
        files={"usr/share/doc/cuda-drivers/SIMULATED": (simulated_note(
            f"cuda-drivers {newest}: proprietary driver flavour (simulated)."), 0o644)},
        conflicts=["nvidia-open", *(f"nvidia-open-{b}" for b in branches)],
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
    pkgs.append(Package(
        name="cuda-keyring", version=CUDA_KEYRING_VERSION, arch="all",
        summary="GPG keyring for the CUDA repository",
        details="Installs the lab's archive key as /usr/share/keyrings/cuda-archive-keyring.gpg, where\n"
                "NVIDIA's cuda-keyring puts NVIDIA's key. No apt source is added: the role adds its own.",
        files={
            "usr/share/keyrings/cuda-archive-keyring.gpg": (key.binary.read_bytes(), 0o644),
            "usr/share/doc/cuda-keyring/SIMULATED": (simulated_note(
                f"cuda-keyring {CUDA_KEYRING_VERSION}: the lab archive key {key.fingerprint}."), 0o644),
        },
        section="multiverse/misc",
    ))
    return pkgs


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


def build_apt(inputs: Inputs, key: LabKey, out: Path, arches: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="moefleet-apt-") as tmp:
        work = Path(tmp)
        stage = staging(out / "apt")
        indexes: dict[tuple[str, str], tuple[Path, bytes]] = {}
        for arch in arches:
            for flavour in sorted({family(d) for d in DISTROS}):
                pool = work / f"pool-{flavour}-{arch}"
                pool.mkdir()
                stanzas = []
                pkgs = packages(inputs, arch, key, flavour)
                for pkg in sorted(pkgs, key=lambda p: (p.name, p.version)):
                    deb = build_deb(pkg, work / "trees", pool)
                    stanzas.append(packages_stanza(pkg, deb))
                indexes[flavour, arch] = pool, "\n".join(stanzas).encode()
            for distro in DISTROS:
                pool, packages_bytes = indexes[family(distro), arch]
                repo = stage / distro / ARCH_DIRS[arch]
                repo.mkdir(parents=True)
                for deb in sorted(pool.iterdir()):
                    link_or_copy(deb, repo / deb.name)
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
                shutil.copyfile(key.armored, repo / f"{key.short_id}.pub")
        swap_in(stage, out / "apt")


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

def build_wheel(sglang: Path, work: Path) -> Path:
    """Build the simulator's wheel from a copy of its tree (no build/ or egg-info left in sim/)."""
    src = work / "src"
    for path in source_files(sglang):
        dst = src / path.relative_to(sglang)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst)
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
    try:
        run(cmd, env=env)
    except BuildError as exc:
        raise BuildError(f"could not build the SGLang simulator's wheel from {sglang}: {exc}{hint}") from exc
    built = sorted(wheels.glob("*.whl"))
    if len(built) != 1:
        raise BuildError(f"building {sglang} gave {len(built)} wheels instead of one.")
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


def build_pypi(inputs: Inputs, out: Path) -> None:
    meta = tomllib.loads((inputs.sglang / "pyproject.toml").read_text()).get("project", {})
    name = normalize(meta.get("name", ""))
    if name != "sglang":
        raise BuildError(f"{inputs.sglang / 'pyproject.toml'} names the distribution {meta.get('name')!r}, "
                         "not 'sglang'; the role installs sglang from this index.")
    if meta.get("dependencies"):
        say(f"warning: the simulator declares dependencies {meta['dependencies']}; this index serves only "
            "sglang, so `pip install --index-url` on a lab host will not find them.")
    with tempfile.TemporaryDirectory(prefix="moefleet-pypi-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(inputs.sglang, work)
        stage = staging(out / "pypi")
        pkg_dir = stage / "packages" / name
        pkg_dir.mkdir(parents=True)
        shutil.copy2(wheel, pkg_dir / wheel.name)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        attrs = {}
        if meta.get("requires-python"):
            attrs["data-requires-python"] = meta["requires-python"]
        href = f"../../packages/{name}/{urllib.parse.quote(wheel.name)}#sha256={sha}"
        (stage / "simple" / name).mkdir(parents=True)
        (stage / "simple" / name / "index.html").write_text(
            simple_page(f"Links for {name}", [(href, wheel.name, attrs)]))
        (stage / "simple" / "index.html").write_text(simple_page("Simple index", [(f"{name}/", name, {})]))
        swap_in(stage, out / "pypi")


# --------------------------------------------------------------------------------------------- main

def host_arches() -> list[str]:
    try:
        native = run(["dpkg", "--print-architecture"]).stdout.strip()
    except BuildError:
        native = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64")
    return ["amd64"] if native not in ARCH_DIRS or native == "amd64" else ["amd64", native]


def apt_complete(out: Path, arches: list[str]) -> bool:
    return all((out / "apt" / d / ARCH_DIRS[a] / "InRelease").is_file() for d in DISTROS for a in arches)


def pypi_complete(out: Path) -> bool:
    page = out / "pypi" / "simple" / "sglang" / "index.html"
    return page.is_file() and any((out / "pypi" / "packages" / "sglang").glob("*.whl"))


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
        pypi_hash = digest(me, *(str(p.relative_to(inputs.sglang)) for p in sglang_files), *sglang_files)
        want_pypi = force or stamp.get("pypi") != pypi_hash or not pypi_complete(out)
        keys = out.parent / "keys"
        fingerprint_file = keys / "fingerprint"
        key_id = fingerprint_file.read_text().strip() if fingerprint_file.is_file() else "none"
        apt_hash = digest(me, inputs.nvidia_smi, inputs.nvcc, key_id, ",".join(arches))
        want_apt = force or stamp.get("apt") != apt_hash or not apt_complete(out, arches)
        if want_apt:
            ensure_tools()
            key = LabKey(keys / "gnupg", "", keys / "lab-archive-key.asc", keys / "lab-archive-key.gpg")
            try:
                key = ensure_key(keys)
                apt_hash = digest(me, inputs.nvidia_smi, inputs.nvcc, key.fingerprint, ",".join(arches))
                build_apt(inputs, key, out, arches)
            finally:
                key.stop_agent()
            stamp["apt"] = apt_hash
            write_atomic(stamp_path, json.dumps(stamp, indent=2).encode())
            say(f"apt repository built for {', '.join(DISTROS)} ({', '.join(arches)}), "
                f"signed by {key.fingerprint}.")
        else:
            say("apt repository is up to date (inputs unchanged).")
        if want_pypi:
            build_pypi(inputs, out)
            stamp["pypi"] = pypi_hash
            write_atomic(stamp_path, json.dumps(stamp, indent=2).encode())
            say("package index built (pypi/simple/sglang/).")
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
