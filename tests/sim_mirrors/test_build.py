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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "sim" / "mirrors" / "build.py"
DISTROS = ("debian12", "ubuntu2204", "ubuntu2404")
COMMON = {
    ("nvidia-open", "580.95.05-1"), ("nvidia-open", "570.195.03-1"),
    ("nvidia-open-580", "580.95.05-1"), ("nvidia-open-570", "570.195.03-1"),
    ("cuda-drivers", "580.95.05-1"), ("cuda-keyring", "1.1-1"),
    ("cuda-toolkit-12-8", "12.8.1-1"), ("cuda-toolkit-12-9", "12.9.1-1"), ("cuda-toolkit-13-0", "13.0.2-1"),
}
# Like NVIDIA's repos: on Debian the persistence daemon is its own package; on Ubuntu it comes with
# the driver branch (nvidia-compute-utils-<branch>).
EXPECTED = {
    "debian12": COMMON | {("nvidia-persistenced", "580.95.05-1"), ("nvidia-persistenced", "570.195.03-1")},
    "ubuntu2204": COMMON | {("nvidia-compute-utils-580", "580.95.05-1"),
                            ("nvidia-compute-utils-570", "570.195.03-1")},
}
EXPECTED["ubuntu2404"] = EXPECTED["ubuntu2204"]
FAKE_SMI = b'#!/usr/bin/env python3\nprint("GPU 0: fake nvidia-smi for the mirror tests")\n'
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
"""


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
    assert (keys / "gnupg").is_dir() and (keys / "gnupg").stat().st_mode & 0o077 == 0
    for distro in DISTROS:
        repo = repo_dir(out, distro)
        for name in ("Packages", "Packages.gz", "Release", "InRelease", "Release.gpg",
                     "lab-archive-key.asc", "lab-archive-key.gpg", f"{fingerprint[-8:].lower()}.pub"):
            assert (repo / name).is_file(), f"{repo / name} is missing"
        assert (repo / "lab-archive-key.gpg").read_bytes() == (keys / "lab-archive-key.gpg").read_bytes()
        assert (repo / "lab-archive-key.asc").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    # Served by a container: everything world-readable.
    for path in out.rglob("*"):
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"


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
            assert entry["Architecture"] == ("all" if entry["Package"] == "cuda-keyring" else "amd64")
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
    branch = repo / "nvidia-open-580_580.95.05-1_amd64.deb"
    listing = deb_files(branch)
    assert " ./usr/bin/nvidia-smi\n" in listing
    assert "./usr/share/doc/nvidia-open-580/SIMULATED" in listing
    assert "modprobe" not in listing and "/lib/modules" not in listing
    subprocess.run(["dpkg-deb", "-x", str(branch), str(tmp_path)], check=True)
    assert (tmp_path / "usr/bin/nvidia-smi").read_bytes() == FAKE_SMI
    assert os.access(tmp_path / "usr/bin/nvidia-smi", os.X_OK)
    for version in ("580.95.05-1", "570.195.03-1"):
        depends = deb_field(repo / f"nvidia-open_{version}_amd64.deb", "Depends")
        assert depends == f"nvidia-open-{version.split('.')[0]} (= {version})"
    assert "nvidia-open" in deb_field(repo / "cuda-drivers_580.95.05-1_amd64.deb", "Conflicts")
    assert "cuda-drivers" in deb_field(branch, "Conflicts")
    for persistenced in (repo / "nvidia-persistenced_580.95.05-1_amd64.deb",
                         repo_dir(out, "ubuntu2404") / "nvidia-compute-utils-580_580.95.05-1_amd64.deb"):
        listing = deb_files(persistenced)
        assert "./usr/bin/nvidia-persistenced" in listing
        assert "./lib/systemd/system/nvidia-persistenced.service" in listing
        # The role enables the daemon; the package has no maintainer script doing it.
        control = subprocess.run(["dpkg-deb", "-I", str(persistenced)], check=True, capture_output=True,
                                 text=True).stdout
        assert "postinst" not in control
    ubuntu = repo_dir(out, "ubuntu2204") / "nvidia-open-580_580.95.05-1_amd64.deb"
    assert "nvidia-compute-utils-580 (= 580.95.05-1)" in deb_field(ubuntu, "Depends")
    keyring = deb_files(repo / "cuda-keyring_1.1-1_all.deb")
    assert "./usr/share/keyrings/cuda-archive-keyring.gpg" in keyring


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

def test_pypi_index_serves_the_wheel_with_its_hash(lab):
    out, _, _ = lab
    simple = out / "pypi" / "simple"
    assert 'href="sglang/"' in (simple / "index.html").read_text()
    page = (simple / "sglang" / "index.html").read_text()
    links = re.findall(r'href="([^"]+)"', page)
    assert len(links) == 1
    url, _, fragment = links[0].partition("#sha256=")
    wheel = (simple / "sglang" / urllib.parse.unquote(url)).resolve()
    assert wheel.name == "sglang-0.5.10+moefleetsim-py3-none-any.whl"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == fragment
    assert 'data-requires-python="&gt;=3.9"' in page


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


def test_changed_input_rebuilds_only_its_part_with_the_same_key(lab, tmp_path):
    out, inputs, _ = lab
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


@needs_apt
@pytest.mark.parametrize("distro", DISTROS)
def test_apt_updates_downloads_and_resolves_from_the_repository(lab, tmp_path, distro):
    out, _, _ = lab
    repo = repo_dir(out, distro)
    apt = PrivateApt(tmp_path)
    keyring = repo / "lab-archive-key.gpg"
    if distro == "debian12":  # what ansible.builtin.deb822_repository writes
        apt.add_source("cuda.sources", deb822(f"file:{repo}/", keyring))
    else:  # NVIDIA's documented one-line form
        apt.add_source("cuda.list", f"deb [signed-by={keyring}] file:{repo}/ /\n")
    update = apt("update")
    assert update.returncode == 0 and "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    policy = apt("policy", "nvidia-open", tool="apt-cache").stdout
    assert "Candidate: 580.95.05-1" in policy and "570.195.03-1" in policy
    # What the roles install: nvidia_driver (branch package, on Debian the daemon pinned to the branch)
    # and cuda_toolkit.
    wanted = ["nvidia-open-580", "cuda-toolkit-12-9"]
    if distro == "debian12":
        wanted.append("nvidia-persistenced=580.*")
    daemon = "nvidia-persistenced" if distro == "debian12" else "nvidia-compute-utils-580"
    got = apt("download", "nvidia-open", daemon, *wanted)
    assert got.returncode == 0, got.stderr
    assert sorted(p.name for p in (tmp_path / "downloads").iterdir()) == sorted([
        "cuda-toolkit-12-9_12.9.1-1_amd64.deb", "nvidia-open-580_580.95.05-1_amd64.deb",
        "nvidia-open_580.95.05-1_amd64.deb", f"{daemon}_580.95.05-1_amd64.deb"])
    plan = apt("-s", "install", *wanted)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Inst nvidia-open-580 (580.95.05-1" in plan.stdout
    assert f"Inst {daemon} (580.95.05-1" in plan.stdout
    assert "Inst cuda-toolkit-12-9 (12.9.1-1" in plan.stdout
    floor = apt("-s", "install", "nvidia-open=570.195.03-1")
    assert floor.returncode == 0 and "Inst nvidia-open-570 (570.195.03-1" in floor.stdout, floor.stderr
    if distro == "debian12":
        pinned = apt("-s", "install", "nvidia-open-570", "nvidia-persistenced=570.*")
        assert "Inst nvidia-persistenced (570.195.03-1" in pinned.stdout, pinned.stdout + pinned.stderr
    clash = apt("-s", "install", "nvidia-open", "cuda-drivers")
    assert clash.returncode != 0 and "Conflicts" in clash.stdout


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


def test_pip_downloads_the_pinned_simulator_from_the_index(served, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--index-url", f"{served}/pypi/simple/", "--dest", str(tmp_path), "sglang==0.5.10"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, NO_PROXY="127.0.0.1"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["sglang-0.5.10+moefleetsim-py3-none-any.whl"]


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
    for deb in ["nvidia-open-580_580.95.05-1_amd64.deb", *(p.name for p in repo.glob("cuda-toolkit-*.deb"))]:
        subprocess.run(["dpkg-deb", "-x", str(repo / deb), str(root)], check=True)
    assert (root / "usr/bin/nvidia-smi").read_bytes() == REAL["nvidia-smi"].read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "SIM_CUDA_VERSION"}
    for xy in ("12.8", "12.9", "13.0"):
        nvcc = subprocess.run([str(root / f"usr/local/cuda-{xy}/bin/nvcc"), "--version"], capture_output=True,
                              text=True, timeout=30, env=env)
        assert nvcc.returncode == 0, nvcc.stderr
        assert f"release {xy}" in nvcc.stdout, nvcc.stdout
    page = (out / "pypi" / "simple" / "sglang" / "index.html").read_text()
    assert "sglang-0.5.10+moefleetsim-py3-none-any.whl" in page
