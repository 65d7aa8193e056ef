"""lab.py's installed-base image: its tag follows every input of the install run (a changed role file, playbook or
mirror recipe gives a new image, so no lab job starts from a stale install), and only Debian 12 hosts start from it."""

from __future__ import annotations

import shutil

import pytest
from playbook import lab_module


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the inputs the tag reads, under a REPO of its own."""
    lab = lab_module()
    for top in lab.INSTALLED_INPUTS:
        source = lab.REPO / top
        if source.is_file():
            shutil.copy(source, tmp_path / top)
        else:
            shutil.copytree(source, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(lab, "REPO", tmp_path)
    return tmp_path


def test_the_tag_is_stable_and_changes_with_each_input(tree):
    lab = lab_module()
    first = lab.installed_tag()
    assert first == lab.installed_tag()
    assert first.startswith("localhost/moefleet-debian12-installed:")
    seen = {first}
    for path in ("roles/nvidia_driver/defaults/main.yml", "sim/playbooks/installed_base.yml",
                 "inventory/sim/group_vars/all.yml", "ansible.cfg"):
        with open(tree / path, "a") as out:
            out.write("\n# changed\n")
        tag = lab.installed_tag()
        assert tag not in seen, path
        seen.add(tag)


def test_installed_hosts_are_debian12_only(monkeypatch):
    lab = lab_module()
    monkeypatch.setattr(lab, "build_installed", lambda: pytest.fail("nothing is built before the refusal"))
    with pytest.raises(SystemExit, match="--installed is built for debian12 only"):
        lab.up("x", 2, lab.REPO / "unused.yml", ["debian12", "debian13"], installed=True)
