"""moefleet.serving.worker_url: the one composition of an SGLang server's URL (the serving host's own view, and a
router's), which playbooks/serve.yml, status.yml, bench.yml, roles/router_membership, roles/sglang_router and
roles/sglang_service read instead of writing it each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.moefleet.serving.plugins.filter.moefleet import FilterModule, worker_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("127.0.0.1", 30000, "http://127.0.0.1:30000"),
        ("0.0.0.0", 30000, "http://127.0.0.1:30000"),  # binds every address: the host reaches itself on loopback
        ("::", "30001", "http://127.0.0.1:30001"),
        ("10.0.0.5", 8000, "http://10.0.0.5:8000"),
        ("::1", 30000, "http://[::1]:30000"),
        ("fd00::5", 30000, "http://[fd00::5]:30000"),
        ("[fd00::5]", 30000, "http://[fd00::5]:30000"),
    ],
)
def test_the_hosts_own_view(host, port, expected):
    assert worker_url(host, port) == expected


@pytest.mark.parametrize(
    ("host", "reach", "expected"),
    [
        ("0.0.0.0", "10.0.0.5", "http://10.0.0.5:30000"),  # a router reaches it at the host's address
        ("::", "gpu-1", "http://gpu-1:30000"),
        ("127.0.0.1", "10.0.0.5", "http://10.0.0.5:30000"),  # another host cannot reach its loopback
        ("localhost", "10.0.0.5", "http://10.0.0.5:30000"),
        ("::1", "fd00::5", "http://[fd00::5]:30000"),
        ("10.0.0.7", "10.0.0.5", "http://10.0.0.7:30000"),  # a private bind is the address the routers use
        ("fd00::7", "10.0.0.5", "http://[fd00::7]:30000"),
    ],
)
def test_a_routers_view(host, reach, expected):
    assert worker_url(host, 30000, reach) == expected


def test_an_empty_address_is_refused():
    with pytest.raises(AnsibleFilterError, match="sglang_service_host"):
        worker_url("", 30000)


def test_it_is_the_collections_filter():
    assert FilterModule().filters()["worker_url"] is worker_url


def test_no_playbook_or_role_composes_a_worker_url_itself():
    """The composition is the filter's: no template writes http://<sglang_service_host>:<sglang_service_port>."""
    offenders = []
    for path in [*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/**/*.yml"), *ROOT.glob("roles/**/*.j2")]:
        text = path.read_text()
        for match in re.finditer(r"'http://'|http://\{\{", text):
            line = text.count("\n", 0, match.start()) + 1
            window = text[match.start():match.start() + 400]
            if "sglang_service_port" in window or "sglang_service_host" in window or "bench_port" in window:
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == []


def test_the_routers_worker_list_is_the_filters(tmp_path):
    """roles/sglang_router's --worker-urls (vars/main.yml), rendered by ansible-playbook for workers that bind
    loopback (unset: the fleet's default), every address, a private IPv4 or IPv6 address: each the filter's router
    view, with the fleet's default port (roles/moefleet_defaults, a dependency of the role) where the inventory sets
    none."""
    role = ROOT / "roles" / "sglang_router"
    home = ROOT / "roles" / "moefleet_defaults"
    meta = yaml.safe_load((role / "meta" / "main.yml").read_text())
    assert {"role": "moefleet_defaults"} in meta["dependencies"]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "blackwell": {"hosts": {
            "w1": {"ansible_host": "10.0.0.1"},
            "w2": {"ansible_host": "fd00::2", "sglang_service_host": "0.0.0.0", "sglang_service_port": 31000},
            "w3": {"sglang_service_host": "10.0.0.33"},
            "w4": {"ansible_host": "10.0.0.4", "sglang_service_host": "fd00::44"},
        }},
        "routers": {"hosts": {"r1": {"ansible_connection": "local",
                                     "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}},
    }}}))
    out = tmp_path / "urls.json"
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "r1", "gather_facts": False,
        "vars_files": [str(home / "defaults" / "main.yml"), str(role / "defaults" / "main.yml"),
                       str(role / "vars" / "main.yml")],
        "tasks": [
            {"ansible.builtin.copy": {"content": "{{ _sglang_router_worker_urls | to_json }}", "dest": str(out),
                                      "mode": "0644"}},
        ],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert json.loads(out.read_text()) == [
        "http://10.0.0.1:30000", "http://[fd00::2]:31000", "http://10.0.0.33:30000", "http://[fd00::44]:30000"]
