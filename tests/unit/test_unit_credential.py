"""The restore's unit for today's key (roles/sglang_service/tasks/restore.yml): the last good unit, rendered by the
role's own template with or without an API key, made to serve with the key set now (unit_with_credential) or with
none (unit_without_credential). Judged against what the template itself renders for the other case."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.moefleet.serving.plugins.filter.moefleet import unit_with_credential, unit_without_credential

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles/sglang_service/templates/etc/systemd/system/sglang.service.j2"
LIBEXEC = "/usr/local/libexec/moefleet"
SOURCE = "/etc/sglang/credentials/sglang-secrets.yaml"
REDACT = f"{LIBEXEC}/sglang-redact"


def render(api_key: str) -> str:
    """The role's template, rendered as the role renders it (Ansible's test "match", filter "comment" stood in for)."""
    env = jinja2.Environment(keep_trailing_newline=True, trim_blocks=True)
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    env.filters["comment"] = lambda text: "# " + text
    return env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="managed", __sglang_service_attempt={"profile": "tp8"},
        _sglang_service_args=["--model-path", "/srv/models/kimi", "--tp-size", "8", "--served-model-name", "kimi k2"],
        _sglang_service_cap_nodes=[], _sglang_service_env={"NCCL_P2P_DISABLE": "0"},
        _sglang_service_gpu_nodes=["/dev/nvidia0", "/dev/nvidiactl"], _sglang_service_systemd_version=252,
        moefleet_libexec_dir=LIBEXEC, sglang_config_dir="/etc/sglang", sglang_group="sglang",
        sglang_home="/var/lib/sglang",
        sglang_service_api_key=api_key, sglang_service_cuda_env_file="/etc/sglang/cuda.env",
        sglang_service_served_model_name="kimi", sglang_service_stop_timeout=600, sglang_user="sglang",
        sglang_venv="/opt/sglang/venv")


def directives(text: str) -> list[str]:
    """The unit's lines that systemd reads (comments and blank lines are not)."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_a_unit_from_before_the_key_serves_with_it_as_the_template_would_render_it():
    without, with_key = render(""), render("a-key")
    assert "LoadCredential=" not in without and "LoadCredential=" in with_key  # the template's two shapes differ
    assert directives(unit_with_credential(without, SOURCE, REDACT)) == directives(with_key)


def test_a_unit_from_while_a_key_was_set_serves_without_it_as_the_template_would_render_it():
    assert directives(unit_without_credential(render("a-key"), REDACT)) == directives(render(""))


def test_a_unit_already_of_todays_shape_is_left_as_it_is():
    with_key, without = render("a-key"), render("")
    assert unit_with_credential(with_key, SOURCE, REDACT) == with_key
    assert unit_without_credential(without, REDACT) == without


def test_a_unit_without_one_execstart_is_refused_with_the_count():
    with pytest.raises(AnsibleFilterError, match="0 ExecStart= lines"):
        unit_with_credential("[Service]\nType=simple\n", SOURCE, REDACT)
