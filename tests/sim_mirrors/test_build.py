"""The lab's local mirrors (sim/mirrors/build.py): a signed apt repository shaped like NVIDIA's CUDA
repository and a PEP 503 index serving the SGLang simulator.

Most tests build from small stand-in inputs made here, so they check the mirror machinery on its own;
test_real_inputs builds from the repository's sim/ when those inputs exist. Nothing from the stand-in
repository is ever installed on this machine: apt only updates, downloads and simulates against a
private state directory.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "sim" / "mirrors" / "build.py"
DISTROS = ("debian12", "debian13", "ubuntu2204", "ubuntu2404")
# The package names of NVIDIA's repositories that the lab reproduces (sim/mirrors/README.md has the table).
DEBIAN_DRIVER = {"nvidia-open", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced",
                 "nvidia-modprobe"}
UBUNTU_DRIVER = {"nvidia-open", "nvidia-modprobe"}
BRANCHES = {"570": "570.195.03", "580": "580.95.05", "590": "590.48.01"}
# The kernel each layout's lab hosts stand in for, its flavour's headers metapackage and their version (epoch 1: the
# lab's wins over the release's own archive, which lab hosts also have as a source).
KERNELS = {
    "debian12": ("6.1.0-31-cloud-amd64", "linux-headers-cloud-amd64", "1:6.1.128-1"),
    "debian13": ("6.12.117+deb13-amd64", "linux-headers-amd64", "1:6.12.117-1"),
    "ubuntu2204": ("5.15.0-1063-azure", "linux-headers-azure", "1:5.15.0-1063.72"),
    "ubuntu2404": ("6.8.0-60-generic", "linux-headers-generic", "1:6.8.0-60.63"),
}


def expected(distro: str) -> set[tuple[str, str]]:
    ubuntu = distro.startswith("ubuntu")
    rev = "0ubuntu1" if ubuntu else "1"
    names: set[tuple[str, str]] = {("cuda-keyring", "1.1-1"), ("cuda-drivers", f"590.48.01-{rev}"),
                                   ("cuda-toolkit-12-8", "12.8.1-1"), ("cuda-toolkit-12-9", "12.9.1-1"),
                                   ("cuda-toolkit-13-0", "13.0.2-1")}
    for b, up in BRANCHES.items():
        v = f"{up}-{rev}"
        names.add((f"nvidia-driver-pinning-{b}", f"{b}-{rev}"))
        if not ubuntu:
            names |= {(n, v) for n in DEBIAN_DRIVER} | ({(f"nvidia-open-{b}", v)} if b != "590" else set())
        elif b != "590":  # Ubuntu: branch-named packages up to 580 only
            names |= {(n, v) for n in UBUNTU_DRIVER | {f"nvidia-open-{b}", f"nvidia-driver-{b}-open",
                                                        f"nvidia-utils-{b}", f"nvidia-compute-utils-{b}",
                                                        f"nvidia-dkms-{b}-open"}}
        else:
            names |= {(n, v) for n in UBUNTU_DRIVER | {"nvidia-driver-open", "nvidia-utils",
                                                        "nvidia-compute-utils", "nvidia-dkms-open"}}
    kernel, metapackage, version = KERNELS[distro]
    names |= {(f"linux-headers-{kernel}", version), (metapackage, version)}
    return names


EXPECTED = {d: expected(d) for d in DISTROS}
FAKE_SMI = (b'#!/usr/bin/env python3\nDEFAULT_SPEC = {"driver_version": "1.2.3"}\n'
            b'print("GPU 0: fake nvidia-smi for the mirror tests", DEFAULT_SPEC)\n')
FAKE_NVCC = b'#!/usr/bin/env python3\nprint("fake nvcc for the mirror tests")\n'
FAKE_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "0.5.10+moefleetsim"
requires-python = ">=3.9"

[tool.setuptools]
packages = ["sglang"]

[tool.moefleet-sim]
releases = ["0.5.10", "0.5.23"]
"""
WHEELS = ["sglang-0.5.10+moefleetsim-py3-none-any.whl", "sglang-0.5.23+moefleetsim-py3-none-any.whl"]


def make_fake_inputs(root: Path) -> Path:
    (root / "gpu").mkdir(parents=True)
    (root / "gpu" / "nvidia-smi").write_bytes(FAKE_SMI)
    (root / "gpu" / "nvcc").write_bytes(FAKE_NVCC)
    (root / "sglang" / "sglang").mkdir(parents=True)
    (root / "sglang" / "pyproject.toml").write_text(FAKE_PYPROJECT)
    (root / "sglang" / "sglang" / "__init__.py").write_text('__version__ = "0.5.10"\n')
    return root


def build(out: Path, inputs: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD), str(out), "--inputs", str(inputs), *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One cold build from stand-in inputs: (mirror root, inputs dir, cold build seconds)."""
    base = tmp_path_factory.mktemp("mirror")
    inputs = make_fake_inputs(base / "sim")
    out = base / "lab" / "mirror"
    started = time.monotonic()
    result = build(out, inputs)
    assert result.returncode == 0, result.stderr
    return out, inputs, time.monotonic() - started


def repo_dir(out: Path, distro: str = "debian12") -> Path:
    return out / "apt" / distro / "x86_64"


def stanzas(text: str) -> list[dict[str, str]]:
    result = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line.startswith(" "):
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        result.append(fields)
    return result


# --------------------------------------------------------------------------------------------- layout

def test_layout_matches_nvidias_repository_paths(lab):
    out, _, _ = lab
    keys = out.parent / "keys"
    fingerprint = (keys / "fingerprint").read_text().strip()
    own = (keys / "debian13" / "fingerprint").read_text().strip()
    assert own != fingerprint, "debian13's repository must be signed by a key of its own, as NVIDIA's is"
    assert (keys / "gnupg").is_dir() and (keys / "gnupg").stat().st_mode & 0o077 == 0
    for distro in DISTROS:
        repo = repo_dir(out, distro)
        # NVIDIA's key file names: 3bf863cc.pub (lower case), debian13's 8793F200.pub (upper case).
        key_file = f"{own[-8:].upper()}.pub" if distro == "debian13" else f"{fingerprint[-8:].lower()}.pub"
        for name in ("Packages", "Packages.gz", "Release", "InRelease", "Release.gpg",
                     "lab-archive-key.asc", "lab-archive-key.gpg", key_file):
            assert (repo / name).is_file(), f"{repo / name} is missing"
        signer = keys / "debian13" if distro == "debian13" else keys
        assert (repo / "lab-archive-key.gpg").read_bytes() == (signer / "lab-archive-key.gpg").read_bytes()
        assert (repo / "lab-archive-key.asc").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    # Served by a container: everything world-readable.
    for path in out.rglob("*"):
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"


def test_debian13_is_not_signed_by_the_other_repositories_key(lab):
    out, _, _ = lab
    other = repo_dir(out, "debian12") / "lab-archive-key.gpg"
    result = subprocess.run(["gpgv", "--keyring", str(other), str(repo_dir(out, "debian13") / "InRelease")],
                            capture_output=True)
    assert result.returncode != 0


def test_release_is_signed_and_lists_the_indexes(lab):
    out, _, _ = lab
    for distro in DISTROS:
        repo = repo_dir(out, distro)
        keyring = str(repo / "lab-archive-key.gpg")
        subprocess.run(["gpgv", "--keyring", keyring, str(repo / "InRelease")], check=True,
                       capture_output=True)
        subprocess.run(["gpgv", "--keyring", keyring, str(repo / "Release.gpg"), str(repo / "Release")],
                       check=True, capture_output=True)
        release = (repo / "Release").read_text()
        assert release in (repo / "InRelease").read_text()
        sha256 = release.split("SHA256:\n")[1].split("SHA512:")[0]
        for name in ("Packages", "Packages.gz"):
            data = (repo / name).read_bytes()
            assert f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {name}" in sha256


def test_a_release_signed_by_another_key_is_refused(lab, tmp_path):
    out, _, _ = lab
    repo = repo_dir(out)
    other = tmp_path / "other.gpg"
    other.write_bytes(b"")
    result = subprocess.run(["gpgv", "--keyring", str(other), str(repo / "InRelease")], capture_output=True)
    assert result.returncode != 0


def test_packages_lists_every_deb_with_its_size_and_hashes(lab):
    out, _, _ = lab
    for distro in DISTROS:
        repo = repo_dir(out, distro)
        text = (repo / "Packages").read_text()
        assert gzip.decompress((repo / "Packages.gz").read_bytes()).decode() == text
        entries = stanzas(text)
        assert {(e["Package"], e["Version"]) for e in entries} == EXPECTED[distro]
        listed = set()
        for entry in entries:
            deb = repo / entry["Filename"]
            data = deb.read_bytes()
            assert entry["Filename"].startswith("./")
            assert int(entry["Size"]) == len(data)
            assert entry["SHA256"] == hashlib.sha256(data).hexdigest()
            assert entry["MD5sum"] == hashlib.md5(data).hexdigest()
            assert entry["Maintainer"] == "moefleet lab <lab@moefleet.invalid>"
            assert "simulated" in entry["Description"]
            all_arch = entry["Package"] == "cuda-keyring" or entry["Package"].startswith("nvidia-driver-pinning-")
            assert entry["Architecture"] == ("all" if all_arch else "amd64")
            listed.add(deb.name)
        assert listed == {p.name for p in repo.glob("*.deb")}


def deb_field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb), name], check=True, capture_output=True,
                          text=True).stdout.strip()


def deb_files(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout


def test_driver_packages(lab, tmp_path):
    out, _, _ = lab
    repo = repo_dir(out)
    # Debian: the branch-named metapackage depends open-ended, like NVIDIA's cuda-drivers-580 / nvidia-open-580.
    depends = deb_field(repo / "nvidia-open-580_580.95.05-1_amd64.deb", "Depends")
    assert "nvidia-driver-cuda (>= 580.95.05)" in depends and "nvidia-kernel-open-dkms (>= 580.95.05)" in depends
    cuda = repo / "nvidia-driver-cuda_580.95.05-1_amd64.deb"
    listing = deb_files(cuda)
    assert " ./usr/bin/nvidia-smi\n" in listing
    assert "/lib/modules" not in listing
    subprocess.run(["dpkg-deb", "-x", str(cuda), str(tmp_path)], check=True)
    # The nvidia-smi stand-in reports the driver release of the package that installed it.
    assert b'"driver_version": "580.95.05"' in (tmp_path / "usr/bin/nvidia-smi").read_bytes()
    assert os.access(tmp_path / "usr/bin/nvidia-smi", os.X_OK)
    assert "nvidia-open" in deb_field(repo / "cuda-drivers_590.48.01-1_amd64.deb", "Conflicts")
    # Ubuntu: branch-named packages tie each other by exact versions; from 590 the unsuffixed names.
    ubuntu = repo_dir(out, "ubuntu2404")
    assert deb_field(ubuntu / "nvidia-open_580.95.05-0ubuntu1_amd64.deb", "Depends") == \
        "nvidia-open-580 (= 580.95.05-0ubuntu1)"
    assert deb_field(ubuntu / "nvidia-open_590.48.01-0ubuntu1_amd64.deb", "Depends") == \
        "nvidia-driver-open (= 590.48.01-0ubuntu1)"
    assert "nvidia-compute-utils-580 (= 580.95.05-0ubuntu1)" in \
        deb_field(ubuntu / "nvidia-driver-580-open_580.95.05-0ubuntu1_amd64.deb", "Depends")
    for persistenced in (repo / "nvidia-persistenced_580.95.05-1_amd64.deb",
                         ubuntu / "nvidia-compute-utils-580_580.95.05-0ubuntu1_amd64.deb",
                         ubuntu / "nvidia-compute-utils_590.48.01-0ubuntu1_amd64.deb"):
        listing = deb_files(persistenced)
        assert "./usr/bin/nvidia-persistenced" in listing
        assert "./lib/systemd/system/nvidia-persistenced.service" in listing
        # The role enables the daemon; the package has no maintainer script doing it.
        control = subprocess.run(["dpkg-deb", "-I", str(persistenced)], check=True, capture_output=True,
                                 text=True).stdout
        assert "postinst" not in control


def test_kernel_headers_are_shaped_like_the_distributions(lab, tmp_path):
    """The flavour's metapackage depends on the kernel's headers at its own version, as Debian's does
    (linux-headers-cloud-amd64 6.1.176-1 Depends linux-headers-6.1.0-50-cloud-amd64 (= 6.1.176-1)); the headers are
    where DKMS looks for them, /lib/modules/<kernel>/build (Debian 13 and Ubuntu 24.04: under /usr)."""
    out, _, _ = lab
    for distro, (kernel, metapackage, version) in KERNELS.items():
        entries = {e["Package"]: e for e in stanzas((repo_dir(out, distro) / "Packages").read_text())}
        meta, headers = entries[metapackage], entries[f"linux-headers-{kernel}"]
        assert meta["Depends"] == f"linux-headers-{kernel} (= {version})"
        assert meta["Version"] == headers["Version"] == version
        assert meta["Section"] == headers["Section"] == "kernel"
        # Named without the epoch, as in Debian's archive.
        assert headers["Filename"] == f"./linux-headers-{kernel}_{version.split(':')[-1]}_amd64.deb"
        root = tmp_path / distro
        subprocess.run(["dpkg-deb", "-x", str(repo_dir(out, distro) / headers["Filename"]), str(root)], check=True)
        modules = "lib/modules" if distro in ("debian12", "ubuntu2204") else "usr/lib/modules"
        assert os.readlink(root / modules / kernel / "build") == f"/usr/src/linux-headers-{kernel}"
        assert (root / "usr/src" / f"linux-headers-{kernel}" / "Makefile").is_file()


def test_the_lab_inventory_asks_for_the_headers_the_mirror_serves(lab):
    """inventory/sim gives each layout's hosts a kernel name; the nvidia_driver role's own expressions turn it into
    the packages it installs, and each layout's repository holds them."""
    pytest.importorskip("ansible")
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    out, _, _ = lab
    role = REPO / "roles" / "nvidia_driver"
    lab_vars = yaml_load(REPO / "inventory" / "sim" / "group_vars" / "all.yml")
    role_vars = {**yaml_load(REPO / "roles" / "moefleet_defaults" / "defaults" / "main.yml"),
                 **yaml_load(role / "defaults" / "main.yml"), **yaml_load(role / "vars" / "main.yml")}
    assert lab_vars.get("nvidia_driver_kernel_headers", True) is True, "the lab installs the kernel headers"
    for distro, (kernel, metapackage, _) in KERNELS.items():
        variables = {name: trust_as_template(value) if isinstance(value, str) else value
                     for name, value in {**role_vars, **lab_vars}.items()}
        variables |= {"nvidia_driver_repo_distro": distro, "ansible_facts": {"kernel": "6.18.44-fc-v657"}}
        templar = Templar(loader=DataLoader(), variables=variables)
        wanted = templar.template(trust_as_template("{{ _nvidia_driver_kernel_headers_packages }}"))
        assert wanted == [f"linux-headers-{kernel}", metapackage], distro
        served = {e["Package"] for e in stanzas((repo_dir(out, distro) / "Packages").read_text())}
        assert set(wanted) <= served, distro


def yaml_load(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_pinning_packages_exclude_each_other_and_pin_their_branch(lab, tmp_path):
    out, _, _ = lab
    deb = repo_dir(out) / "nvidia-driver-pinning-580_580-1_all.deb"
    for field in ("Provides", "Conflicts", "Replaces"):
        assert deb_field(deb, field) == "nvidia-driver-pinning"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    pin = (tmp_path / "etc/apt/preferences.d/nvidia-driver-pinning-580").read_text()
    assert "Pin: version 580.*" in pin and "Pin-Priority: 1000" in pin


def test_cuda_keyring_adds_a_source_signed_by_its_keyring(lab, tmp_path):
    out, _, _ = lab
    for distro in ("debian12", "debian13"):
        deb = repo_dir(out, distro) / "cuda-keyring_1.1-1_all.deb"
        root = tmp_path / distro
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        source = (root / f"etc/apt/sources.list.d/cuda-{distro}-x86_64.list").read_text()
        assert source == ("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                          f"http://moefleet-mirror:8080/apt/{distro}/x86_64/ /\n")
        keyring = (root / "usr/share/keyrings/cuda-archive-keyring.gpg").read_bytes()
        assert keyring == (repo_dir(out, distro) / "lab-archive-key.gpg").read_bytes()


def test_nvidia_modprobe_does_nothing_without_root(lab, tmp_path):
    """Under NoNewPrivileges= the setuid helper runs as the caller: it cannot load nvidia-uvm."""
    out, _, _ = lab
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the stand-in as another user")
    subprocess.run(["dpkg-deb", "-x", str(repo_dir(out) / "nvidia-modprobe_580.95.05-1_amd64.deb"),
                    str(tmp_path)], check=True)
    script = (tmp_path / "usr/bin/nvidia-modprobe").read_text()
    # Fed on stdin: the unprivileged user cannot traverse pytest's private temporary directory.
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-s", "--",
                             "-u", "-c=0"], input=script, capture_output=True, text=True, cwd="/")
    assert result.returncode == 1 and result.stdout == "" and result.stderr == ""
    assert not Path("/run/sim-gpu/modules").exists() or "nvidia_uvm" not in Path("/run/sim-gpu/modules").read_text()


def test_persistence_daemon_stand_in_logs_and_stops(lab, tmp_path):
    out, _, _ = lab
    subprocess.run(["dpkg-deb", "-x", str(repo_dir(out) / "nvidia-persistenced_580.95.05-1_amd64.deb"),
                    str(tmp_path)], check=True)
    daemon = subprocess.Popen([str(tmp_path / "usr/bin/nvidia-persistenced"), "--verbose"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert "Started (sim)" in daemon.stdout.readline()
        time.sleep(0.2)
        assert daemon.poll() is None
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    assert daemon.returncode == 0


@pytest.mark.parametrize("xy", ["12.8", "12.9", "13.0"])
def test_cuda_toolkit_packages(lab, tmp_path, xy):
    out, _, _ = lab
    major, minor = xy.split(".")
    deb = next(repo_dir(out).glob(f"cuda-toolkit-{major}-{minor}_*_amd64.deb"))
    listing = deb_files(deb)
    for path in ("bin/nvcc", f"lib64/libcudart.so.{major} ", "version.json"):
        assert f"./usr/local/cuda-{xy}/{path}" in listing
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")], check=True)
    postinst = (tmp_path / "DEBIAN" / "postinst").read_text()
    alternative = f"update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{xy} {major}{minor}"
    assert alternative in postinst
    assert f"/usr/local/cuda-{xy}" in (tmp_path / "DEBIAN" / "prerm").read_text()


# --------------------------------------------------------------------------------------------- pypi

def test_pypi_index_serves_a_wheel_per_release_with_its_hash(lab):
    out, _, _ = lab
    simple = out / "pypi" / "simple"
    assert 'href="sglang/"' in (simple / "index.html").read_text()
    page = (simple / "sglang" / "index.html").read_text()
    links = re.findall(r'href="([^"]+)"', page)
    wheels = []
    for link in links:
        url, _, fragment = link.partition("#sha256=")
        wheel = (simple / "sglang" / urllib.parse.unquote(url)).resolve()
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == fragment
        wheels.append(wheel)
    assert [w.name for w in wheels] == WHEELS
    for wheel, release in zip(wheels, ("0.5.10", "0.5.23"), strict=True):  # the metadata names the release
        with zipfile.ZipFile(wheel) as zf:
            metadata = zf.read(f"sglang-{release}+moefleetsim.dist-info/METADATA").decode()
        assert f"\nVersion: {release}+moefleetsim\n" in metadata
    assert page.count('data-requires-python="&gt;=3.9"') == 2


def test_a_releases_list_that_is_not_a_list_of_versions_is_refused(tmp_path):
    inputs = make_fake_inputs(tmp_path / "sim")
    pyproject = inputs / "sglang" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('releases = ["0.5.10", "0.5.23"]', 'releases = "0.5.23"'))
    result = build(tmp_path / "lab" / "mirror", inputs)
    assert result.returncode == 1
    assert "[tool.moefleet-sim] releases must be a list of SGLang versions" in result.stderr


# --------------------------------------------------------------------------------------------- rebuilds

def snapshot(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".build.lock"}


def test_second_build_is_a_fast_no_op(lab):
    out, inputs, cold = lab
    before = snapshot(out)
    started = time.monotonic()
    result = build(out, inputs)
    warm = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "apt repository is up to date" in result.stdout
    assert "package index is up to date" in result.stdout
    assert snapshot(out) == before
    assert warm < 2.0, f"a no-change build took {warm:.1f} s (cold: {cold:.1f} s)"


def test_changed_input_rebuilds_only_its_part_with_the_same_key(lab, tmp_path_factory):
    out, inputs, _ = lab
    # a short directory: gpg-agent's sockets live in the key directory, and a socket's path has at most 107
    # characters (this test's own tmp_path, under pytest-xdist's popen-gwN/, left the agent one too few)
    tmp_path = tmp_path_factory.mktemp("re")
    copy = tmp_path / "lab" / "mirror"
    shutil.copytree(out.parent, copy.parent, symlinks=True)
    changed = tmp_path / "sim"
    shutil.copytree(inputs, changed)
    (changed / "gpu" / "nvidia-smi").write_bytes(FAKE_SMI + b"# changed\n")
    fingerprint = (copy.parent / "keys" / "fingerprint").read_text()
    wheel_page = (copy / "pypi" / "simple" / "sglang" / "index.html").stat().st_mtime_ns
    result = build(copy, changed)
    assert result.returncode == 0, result.stderr
    assert "apt repository built" in result.stdout
    assert "package index is up to date" in result.stdout
    assert (copy.parent / "keys" / "fingerprint").read_text() == fingerprint
    assert (copy / "pypi" / "simple" / "sglang" / "index.html").stat().st_mtime_ns == wheel_page
    repo = repo_dir(copy)
    subprocess.run(["gpgv", "--keyring", str(repo / "lab-archive-key.gpg"), str(repo / "InRelease")],
                   check=True, capture_output=True)
    assert not list(copy.glob(".apt.*")), "staging directories were left behind"


def test_missing_inputs_fail_with_a_sentence(tmp_path):
    (tmp_path / "sim" / "gpu").mkdir(parents=True)
    (tmp_path / "sim" / "gpu" / "nvidia-smi").write_bytes(FAKE_SMI)
    result = build(tmp_path / "mirror", tmp_path / "sim")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "the nvcc stand-in" in result.stderr and "pyproject.toml" in result.stderr
    assert "are missing." in result.stderr
    assert not (tmp_path / "keys").exists()


# --------------------------------------------------------------------------------------------- apt itself

needs_apt = pytest.mark.skipif(shutil.which("apt-get") is None or os.geteuid() != 0,
                               reason="needs apt-get, run as root (apt only reads a private state dir)")


class PrivateApt:
    """apt-get and apt-cache confined to a private state, cache and source list: nothing on this
    machine's apt configuration is read or changed, and nothing is installed (-s only simulates)."""

    def __init__(self, root: Path):
        self.root = root
        for sub in ("etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d", "etc/apt.conf.d",
                    "state/lists/partial", "cache/archives/partial", "downloads"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "etc" / "sources.list").write_text("")
        shutil.copyfile("/var/lib/dpkg/status", root / "status")
        etc = root / "etc"
        self.options = [
            f"Dir::Etc={etc}", f"Dir::Etc::SourceList={etc}/sources.list",
            f"Dir::Etc::SourceParts={etc}/sources.list.d", f"Dir::Etc::Parts={etc}/apt.conf.d",
            f"Dir::Etc::Preferences={etc}/preferences", f"Dir::Etc::PreferencesParts={etc}/preferences.d",
            f"Dir::Etc::Trusted={etc}/trusted.gpg", f"Dir::Etc::TrustedParts={etc}/trusted.gpg.d",
            f"Dir::State={root}/state", f"Dir::State::status={root}/status", f"Dir::Cache={root}/cache",
            "Debug::NoLocking=1", "APT::Sandbox::User=root", "Acquire::Languages=none",
            "APT::Architecture=amd64", "APT::Architectures::=amd64", "Acquire::http::Proxy=DIRECT",
        ]

    def add_source(self, name: str, text: str) -> None:
        (self.root / "etc" / "sources.list.d" / name).write_text(text)

    def __call__(self, *args: str, tool: str = "apt-get") -> subprocess.CompletedProcess:
        opts = [part for option in self.options for part in ("-o", option)]
        return subprocess.run([tool, *opts, *args], capture_output=True, text=True, timeout=120,
                              cwd=self.root / "downloads", env=dict(os.environ, LC_ALL="C"))


def deb822(uri: str, keyring: Path) -> str:
    return f"Types: deb\nURIs: {uri}\nSuites: /\nSigned-By: {keyring}\n"


def apt_with_repo(out: Path, root: Path, distro: str) -> PrivateApt:
    repo = repo_dir(out, distro)
    apt = PrivateApt(root)
    keyring = repo / "lab-archive-key.gpg"
    if distro == "debian12":  # what ansible.builtin.deb822_repository writes
        apt.add_source("cuda.sources", deb822(f"file:{repo}/", keyring))
    else:  # NVIDIA's documented one-line form
        apt.add_source("cuda.list", f"deb [signed-by={keyring}] file:{repo}/ /\n")
    update = apt("update")
    assert update.returncode == 0 and "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    return apt


def pin(apt: PrivateApt, out: Path, distro: str, branch: str) -> None:
    """What installing nvidia-driver-pinning-<branch> does to apt: its preferences file."""
    deb = next(repo_dir(out, distro).glob(f"nvidia-driver-pinning-{branch}_*_all.deb"))
    extracted = apt.root / "pinning"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(extracted)], check=True)
    for path in (extracted / "etc/apt/preferences.d").iterdir():
        shutil.copyfile(path, apt.root / "etc" / "preferences.d" / path.name)


def installs(plan: subprocess.CompletedProcess) -> dict[str, str]:
    assert plan.returncode == 0, plan.stdout + plan.stderr
    return dict(re.findall(r"^Inst (\S+) \((\S+)", plan.stdout, re.MULTILINE))


@needs_apt
@pytest.mark.parametrize("distro", DISTROS)
def test_without_a_pin_apt_takes_the_newest_branch(lab, tmp_path, distro):
    out, _, _ = lab
    apt = apt_with_repo(out, tmp_path, distro)
    ubuntu = distro.startswith("ubuntu")
    rev = "0ubuntu1" if ubuntu else "1"
    assert f"Candidate: 590.48.01-{rev}" in apt("policy", "nvidia-open", tool="apt-cache").stdout
    got = installs(apt("-s", "install", "nvidia-open"))
    smi_package = "nvidia-utils" if ubuntu else "nvidia-driver-cuda"
    assert got["nvidia-open"] == got[smi_package] == f"590.48.01-{rev}"
    if ubuntu:
        # Branch-named packages exist up to 580 only, and they hold their branch.
        assert installs(apt("-s", "install", "nvidia-open-580"))["nvidia-utils-580"] == "580.95.05-0ubuntu1"
        missing = apt("-s", "install", "nvidia-open-590")
        assert missing.returncode != 0 and "Unable to locate package nvidia-open-590" in missing.stderr
    else:
        # The branch-named metapackage still pulls the newest branch's driver: its Depends are open-ended.
        got = installs(apt("-s", "install", "nvidia-open-580"))
        assert got["nvidia-open-580"] == "580.95.05-1" and got["nvidia-driver-cuda"] == "590.48.01-1"


@needs_apt
@pytest.mark.parametrize("distro", DISTROS)
@pytest.mark.parametrize("branch", ["570", "580", "590"])
def test_a_pinning_package_holds_apt_on_its_branch(lab, tmp_path, distro, branch):
    out, _, _ = lab
    apt = apt_with_repo(out, tmp_path, distro)
    pin(apt, out, distro, branch)
    rev = "0ubuntu1" if distro.startswith("ubuntu") else "1"
    daemon = "nvidia-persistenced" if not distro.startswith("ubuntu") else (
        f"nvidia-compute-utils-{branch}" if branch != "590" else "nvidia-compute-utils")
    got = installs(apt("-s", "install", "nvidia-open", "nvidia-modprobe", "cuda-toolkit-12-9"))
    version = f"{BRANCHES[branch]}-{rev}"
    assert got["nvidia-open"] == got[daemon] == got["nvidia-modprobe"] == version, got
    assert got["cuda-toolkit-12-9"] == "12.9.1-1"
    clash = apt("-s", "install", "nvidia-open", "cuda-drivers")
    assert clash.returncode != 0


def flat_repo(root: Path, stanzas_text: str) -> Path:
    """An unsigned flat repository of package stanzas only (enough for apt's simulation), trusted by its source."""
    root.mkdir(parents=True)
    (root / "Packages").write_text(stanzas_text)
    data = (root / "Packages").read_bytes()
    (root / "Release").write_text(f"SHA256:\n {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n")
    return root


@needs_apt
@pytest.mark.parametrize("distro", DISTROS)
def test_apt_takes_the_labs_kernel_headers_over_the_archives_newer_ones(lab, tmp_path, distro):
    """Lab hosts keep their release's own archive in their sources, whose flavour metapackage is newer (bookworm's
    linux-headers-cloud-amd64 6.1.192-3 depends on 6.1.0-57's headers) and may hold the very kernel's headers at the
    same version without an epoch: apt must still take the lab's, and nothing else."""
    out, _, _ = lab
    kernel, metapackage, version = KERNELS[distro]
    apt = apt_with_repo(out, tmp_path / "apt", distro)
    upstream = version.split(":")[-1]
    newer = "linux-headers-9.9.9-99-" + metapackage.removeprefix("linux-headers-")
    archive = flat_repo(tmp_path / "archive", "".join(
        f"Package: {name}\nVersion: {v}\nArchitecture: amd64\nMaintainer: archive <a@x.invalid>\n"
        f"{'Depends: ' + dep + chr(10) if dep else ''}Filename: ./{name}.deb\nSize: 1\n"
        f"Description: the archive's own\n\n"
        for name, v, dep in [(metapackage, "99.0-1", f"{newer} (= 99.0-1)"), (newer, "99.0-1", ""),
                             (f"linux-headers-{kernel}", upstream, "")]))
    apt.add_source("archive.list", f"deb [trusted=yes] file:{archive}/ /\n")
    assert apt("update").returncode == 0
    got = installs(apt("-s", "install", f"linux-headers-{kernel}", metapackage))
    assert got == {f"linux-headers-{kernel}": version, metapackage: version}


@needs_apt
def test_apt_refuses_the_repository_under_another_key(lab, tmp_path):
    out, _, _ = lab
    repo = repo_dir(out)
    stranger = tmp_path / "stranger.gpg"
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    try:
        subprocess.run([*gpg, "--quick-gen-key", "stranger <s@x.invalid>", "ed25519", "sign", "never"],
                       check=True, capture_output=True)
        stranger.write_bytes(subprocess.run([*gpg, "--export"], check=True, capture_output=True).stdout)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
    apt = PrivateApt(tmp_path / "apt")
    apt.add_source("cuda.sources", deb822(f"file:{repo}/", stranger))
    update = apt("update")
    assert "NO_PUBKEY" in update.stderr or "not signed" in update.stderr, update.stderr
    assert apt("download", "nvidia-open").returncode != 0


@pytest.fixture()
def served(lab):
    """The mirror root served over HTTP as the lab's mirror container serves it."""
    out, _, _ = lab
    handler = functools.partial(QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@needs_apt
def test_apt_over_http_like_the_lab_hosts(lab, served, tmp_path):
    out, _, _ = lab
    apt = PrivateApt(tmp_path)
    apt.add_source("cuda.sources", deb822(f"{served}/apt/debian12/x86_64/",
                                          repo_dir(out) / "lab-archive-key.gpg"))
    update = apt("update")
    assert update.returncode == 0 and "W:" not in update.stderr, update.stderr
    got = apt("download", "cuda-keyring")
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "downloads" / "cuda-keyring_1.1-1_all.deb").is_file()


@pytest.mark.parametrize(("spec", "wheel"), [("sglang==0.5.10", WHEELS[0]), ("sglang[all]==0.5.10", WHEELS[0]),
                                           ("sglang==0.5.23", WHEELS[1])])
def test_pip_downloads_the_pinned_simulator_from_the_index(served, tmp_path, spec, wheel):
    """A pin without the local label takes the wheel of that release (PEP 440 ignores +moefleetsim there)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--index-url", f"{served}/pypi/simple/", "--dest", str(tmp_path / "dl"), spec],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, NO_PROXY="127.0.0.1"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in (tmp_path / "dl").iterdir()] == [wheel]


# --------------------------------------------------------------------------------------------- real inputs

REAL = {"nvidia-smi": REPO / "sim/gpu/nvidia-smi", "nvcc": REPO / "sim/gpu/nvcc",
        "sglang": REPO / "sim/sglang/pyproject.toml"}


@pytest.mark.skipif(not all(p.is_file() for p in REAL.values()),
                    reason="the repository's sim/gpu and sim/sglang inputs are not all there yet")
def test_real_inputs(tmp_path):
    out = tmp_path / "lab" / "mirror"
    result = build(out, REPO / "sim")
    assert result.returncode == 0, result.stderr
    repo = repo_dir(out)
    root = tmp_path / "root"
    for deb in ["nvidia-driver-cuda_590.48.01-1_amd64.deb", *(p.name for p in repo.glob("cuda-toolkit-*.deb"))]:
        subprocess.run(["dpkg-deb", "-x", str(repo / deb), str(root)], check=True)
    smi = subprocess.run([str(root / "usr/bin/nvidia-smi"), "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, SIM_GPU_SPEC=str(tmp_path / "no-spec.json")))
    assert smi.stdout.splitlines()[0] == "590.48.01", smi.stdout + smi.stderr
    env = {k: v for k, v in os.environ.items() if k != "SIM_CUDA_VERSION"}
    for xy in ("12.8", "12.9", "13.0"):
        nvcc = subprocess.run([str(root / f"usr/local/cuda-{xy}/bin/nvcc"), "--version"], capture_output=True,
                              text=True, timeout=30, env=env)
        assert nvcc.returncode == 0, nvcc.stderr
        assert f"release {xy}" in nvcc.stdout, nvcc.stdout
    page = (out / "pypi" / "simple" / "sglang" / "index.html").read_text()
    assert all(wheel in page for wheel in WHEELS)
