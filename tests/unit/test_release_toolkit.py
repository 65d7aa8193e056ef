"""Each SGLang release gets the CUDA toolkit it is built for, side by side with the others: cuda_toolkit_version
follows sglang_package_spec (roles/moefleet_defaults), each toolkit has an environment file of its own, and the SGLang
unit names its release's, so a last good unit of the old release, restored after an upgrade failed, runs with the
toolkit it was built for. The defaults are rendered by Ansible here (a playbook on localhost, about 2 s a case)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import sglang_releases
from playbook import ROOT, run_playbook

DEFAULTS = [ROOT / "roles" / "moefleet_defaults" / "defaults" / "main.yml",
            ROOT / "roles" / "cuda_toolkit" / "defaults" / "main.yml",
            ROOT / "roles" / "sglang_service" / "defaults" / "main.yml"]
SHOWN = ["cuda_toolkit_version", "cuda_toolkit_package", "cuda_toolkit_env_file", "cuda_toolkit_home",
         "sglang_service_cuda_env_file", "sglang_venv", "nvidia_driver_branch"]


def rendered(tmp_path: Path, extra: dict) -> dict:
    out = tmp_path / "vars.json"
    playbook = tmp_path / "defaults.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(p) for p in DEFAULTS],
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"ansible.builtin.copy": {"content": "{{ {" + ", ".join(f"'{name}': {name}" for name in SHOWN)
                                                       + "} | to_json }}", "dest": str(out), "mode": "0600"}}],
    }]))
    # as an inventory's variables would (the defaults files are vars_files here, above play vars)
    done = run_playbook("localhost,", str(playbook), json.dumps(extra), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize(("spec", "toolkit"), [("sglang[all]==0.5.10", "12.9"), ("sglang==0.5.23", "13.0")])
def test_each_release_gets_its_toolkit_with_an_environment_file_of_its_own(tmp_path, spec, toolkit):
    found = rendered(tmp_path, {"sglang_package_spec": spec})
    release = sglang_releases.release_of(spec)
    assert found["cuda_toolkit_version"] == toolkit == sglang_releases.toolkit_for(release)
    assert found["cuda_toolkit_package"] == "cuda-toolkit-" + toolkit.replace(".", "-")
    assert found["cuda_toolkit_home"] == f"/usr/local/cuda-{toolkit}"
    # the unit names the toolkit's own file, and the release's own virtualenv
    env_file = f"/etc/default/cuda-toolkit-{toolkit}"
    assert found["sglang_service_cuda_env_file"] == found["cuda_toolkit_env_file"] == env_file
    assert found["sglang_venv"] == f"/opt/sglang/{release}"
    # the defaults pass the controller's pairing of the release with the host's toolkit and driver
    assert sglang_releases.stack_problems(release, found["cuda_toolkit_version"], found["nvidia_driver_branch"],
                                          "localhost") == []


def test_an_operators_toolkit_is_kept_and_judged(tmp_path):
    found = rendered(tmp_path, {"sglang_package_spec": "sglang==0.5.23", "cuda_toolkit_version": "12.9"})
    assert found["cuda_toolkit_env_file"] == "/etc/default/cuda-toolkit-12.9"
    problems = sglang_releases.stack_problems("0.5.23", found["cuda_toolkit_version"], 580, "gpu-1")
    assert len(problems) == 1, problems
    assert "leave cuda_toolkit_version unset (it follows the pinned release: 13.0)" in problems[0]


def test_the_uninstall_knows_every_supported_releases_toolkit(tmp_path):
    """playbooks/uninstall.yml's _toolkits, rendered by Ansible: every supported release's toolkit, from
    sglang_releases.STACK (the filter moefleet.serving.sglang_cuda_toolkits), not a list of its own."""
    plays = yaml.safe_load((ROOT / "playbooks" / "uninstall.yml").read_text())
    expression = next(p["vars"]["_toolkits"] for p in plays if "_toolkits" in p.get("vars", {}))
    out, playbook = tmp_path / "toolkits.json", tmp_path / "toolkits.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}", "_toolkits": expression},
        "tasks": [{"ansible.builtin.copy": {"content": "{{ _toolkits | to_json }}", "dest": str(out), "mode": "0600"}}],
    }]))
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = sorted({sglang_releases.toolkit_for(r) for r in sglang_releases.SUPPORTED})
    assert json.loads(out.read_text()) == expected == ["12.9", "13.0"]
    bad = run_playbook("localhost,", str(playbook), json.dumps({"_toolkits": "{{ '0.5.10' | "
                                                                "moefleet.serving.sglang_cuda_toolkits }}"}))
    assert bad.returncode != 0 and "give a list of SGLang releases or 'supported'" in bad.stdout + bad.stderr
