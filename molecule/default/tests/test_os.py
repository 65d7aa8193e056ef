"""Each of the scenario's hosts runs the release the lab gave it, and got NVIDIA's repository layout of that
release from the lab's mirror (Debian 13's is signed with a key of its own)."""

import os

import yaml

CODENAMES = {"debian12": "bookworm", "debian13": "trixie"}


def inventory_hosts() -> dict[str, dict]:
    with open(os.environ["MOEFLEET_LAB_INVENTORY"]) as f:
        return yaml.safe_load(f)["all"]["children"]["blackwell"]["hosts"]


def test_the_scenario_covers_both_releases():
    assert sorted(h["lab_os"] for h in inventory_hosts().values()) == ["debian12", "debian13"]


def test_host_runs_its_release(host):
    release = inventory_hosts()[host.backend.get_hostname()]["lab_os"]
    os_release = host.file("/etc/os-release").content_string
    assert f"VERSION_CODENAME={CODENAMES[release]}" in os_release


def test_apt_uses_the_release_layout_and_its_key(host):
    release = inventory_hosts()[host.backend.get_hostname()]["lab_os"]
    sources = host.check_output("grep -rh -e '^URIs:' -e '^deb ' /etc/apt/sources.list.d/ || true")
    # NVIDIA's repository as the role added it; the lab's stand-in for the distribution archive (prepare.yml) aside
    nvidia = [line for line in sources.splitlines() if "/apt/" in line and "/apt/archive/" not in line]
    assert nvidia and all(f"/apt/{release}/x86_64/" in line for line in nvidia), sources
    # installed from there: apt verified that layout's Release file (debian13's own key, the others' shared one)
    assert host.package("nvidia-open").is_installed
