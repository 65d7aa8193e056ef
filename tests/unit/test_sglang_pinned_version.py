"""A serve-only deploy (--skip-tags install) installs nothing, so the sglang role's check steps refuse a virtualenv
that holds another SGLang release than sglang_package_spec pins (or none), with the sentence that names the fix.
The role runs here on localhost against a stand-in virtualenv: its bin/python is this Python with a site directory
that holds only an sglang-VERSION.dist-info (about 5 s a case)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from playbook import SERVE_ONLY, run_playbook


def venv_with(tmp_path: Path, version: str | None) -> Path:
    venv = tmp_path / "venv"
    site = venv / "site"
    site.mkdir(parents=True)
    if version is not None:
        info = site / f"sglang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return venv


def pin_check(output: str) -> str | None:
    """How the pin check ended on localhost: ok, skipping or fatal (None: it never came up)."""
    found = re.search(r"holds the SGLang release sglang_package_spec pins\] \**\n(\w+): \[localhost\]", output)
    return found.group(1) if found else None


def serve_only(tmp_path: Path, version: str | None, spec: str = "sglang[all]==0.5.10", venv: Path | None = None):
    playbook = tmp_path / "sglang.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "sglang_venv": str(venv or venv_with(tmp_path, version)), "sglang_package_spec": spec},
        "roles": ["sglang"],
    }]))
    return run_playbook("localhost,", str(playbook), options=SERVE_ONLY, timeout=120)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.10+moefleetsim"])
def test_the_pinned_release_passes(tmp_path, version):
    done = serve_only(tmp_path, version)
    assert done.returncode == 0, done.stdout[-3000:]
    assert pin_check(done.stdout) == "ok", done.stdout[-3000:]  # it ran and passed, not skipped


@pytest.mark.parametrize(("version", "held"), [("0.5.9", "holds SGLang 0.5.9"), (None, "holds no SGLang")])
def test_another_release_or_none_is_refused_with_the_fix(tmp_path, version, held):
    done = serve_only(tmp_path, version)
    assert done.returncode != 0
    text = " ".join(done.stdout.split())
    assert held in text and "not the 0.5.10 that sglang_package_spec pins" in text, text[-3000:]
    assert "run the deploy without --skip-tags install" in text


def test_a_spec_without_an_exact_pin_is_not_judged(tmp_path):
    done = serve_only(tmp_path, "0.5.9", spec="sglang[all]>=0.5")
    assert done.returncode == 0, done.stdout[-3000:]
    assert pin_check(done.stdout) == "skipping", done.stdout[-3000:]


def test_a_missing_virtualenv_is_refused_naming_the_install_and_the_old_layout(tmp_path):
    """A host installed before each release had a virtualenv of its own (/opt/sglang/venv), deployed serve-only:
    the release's virtualenv does not exist, and the refusal says how to install it or keep the old one."""
    done = serve_only(tmp_path, None, venv=tmp_path / "opt-sglang" / "0.5.10")
    assert done.returncode != 0
    text = " ".join(done.stdout.split())
    assert f"{tmp_path}/opt-sglang/0.5.10/bin/python on localhost did not run" in text, text[-3000:]
    assert "run the deploy without --skip-tags install" in text and "set sglang_venv to it" in text, text[-3000:]
