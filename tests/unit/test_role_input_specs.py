"""Each host's role inputs are checked on the controller against the roles' own meta/argument_specs.yml, by
ansible.builtin.validate_argument_spec in playbooks/validate.yml's second play (one declaration per variable).

Here, with the validator that action runs (ArgumentSpecValidator, called as the action calls it): what the old
hand-written checks refused is refused, naming the variable; every boolean form the refusal message offers is read
by the spec as the roles' ``| bool`` reads it; the example and sim inventories' values pass; and validate.yml checks
every role deploy runs on the hosts. tests/integration/test_validate_playbook.py runs the play itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.filter.core import to_bool

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = yaml.safe_load((ROOT / "playbooks" / "validate.yml").read_text())
HOST_PLAY = next(play for play in VALIDATE if play["hosts"] == "blackwell")
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
# What serve.yml passes the sglang_service role, as validate.yml passes it.
SERVE_ARGS = {"sglang_service_profile": "tp8", "sglang_service_catalog": {"profiles": {}}}


def spec(role: str) -> dict:
    text = (ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text()
    return yaml.safe_load(text)["argument_specs"]["main"]["options"]


def errors(argument_spec: dict, values: dict) -> list[str]:
    """validate_argument_spec's refusals: the options the spec declares, from the host's variables."""
    given = {name: value for name, value in values.items() if name in argument_spec}
    return ArgumentSpecValidator(argument_spec).validate(given, validate_role_argument_spec=True).error_messages


def role_errors(role: str, values: dict) -> list[str]:
    return errors(spec(role), {**values, **(SERVE_ARGS if role == "sglang_service" else {})})


def test_validate_yml_checks_every_role_deploy_runs_on_the_hosts():
    # sglang_router runs on the routers: validate.yml's router play checks its inputs (playbooks/tasks/role_inputs.yml);
    # router_membership's one input is the playbooks' (state: out|in), not the operator's; node_metrics and
    # monitoring_server run from playbooks/monitoring.yml, not deploy, whose first play checks them the same way.
    not_operators = {"sglang_router", "router_membership", "node_metrics", "monitoring_server"}
    assert sorted(HOST_PLAY["vars"]["moefleet_host_roles"]) == [r for r in ROLES if r not in not_operators]


@pytest.mark.parametrize(
    ("role", "name", "value", "sentence"),
    [
        ("sglang_service", "sglang_service_rollback", "maybe", "The value 'maybe' is not a valid boolean."),
        ("nvidia_driver", "nvidia_driver_reboot", "sometimes", "The value 'sometimes' is not a valid boolean."),
        ("sglang_model", "sglang_model_gated", "", "is not a valid boolean"),
        ("sglang_model", "sglang_model_source", "s3", "must be one of: huggingface, prestaged, got: s3"),
        ("nvidia_driver", "nvidia_driver_expected_gpu_count", "eight", "cannot be converted to an int"),
        ("sglang_service", "sglang_service_port", "http", "cannot be converted to an int"),
        ("sglang_service", "sglang_service_extra_flags", ["trust_remote_code"], "unable to convert to dict"),
    ],
)
def test_a_role_input_the_spec_refuses_is_named(role, name, value, sentence):
    found = role_errors(role, {name: value})
    assert len(found) == 1 and name in found[0] and sentence in found[0], found


def test_the_playbooks_own_per_host_inputs_are_declared_and_checked():
    host_spec = HOST_PLAY["vars"]["moefleet_host_inputs_spec"]
    assert errors(host_spec, {"moefleet_allow_unfit": "true", "moefleet_gpu_memory_gib": "94.97"}) == []
    assert "The value 'sure' is not a valid boolean" in errors(host_spec, {"moefleet_allow_unfit": "sure"})[0]
    assert "moefleet_gpu_memory_gib" in errors(host_spec, {"moefleet_gpu_memory_gib": "lots"})[0]


# The forms the refusal tells operators to use (validate.yml rewrites Ansible's longer list to these).
FORMS = ["true", "True", "false", "yes", "YES", "no", "on", "off", "1", "0", True, False, 1, 0]


@pytest.mark.parametrize("form", FORMS)
def test_the_spec_reads_each_offered_boolean_form_as_the_roles_bool_filter_does(form):
    validated = ArgumentSpecValidator(spec("sglang_service")).validate(
        {"sglang_service_rollback": form, **SERVE_ARGS}, validate_role_argument_spec=True)
    assert validated.error_messages == []
    assert validated.validated_parameters["sglang_service_rollback"] is to_bool(form)


def _plain(values: dict) -> dict:
    """The values a file sets that need no template (the rest depend on the lab's or vault's variables)."""
    return {k: v for k, v in values.items() if not (isinstance(v, str) and "{{" in v)}


SHIPPED = ["inventory/example/group_vars/blackwell/main.yml", "inventory/sim/group_vars/all.yml"]


@pytest.mark.parametrize("path", SHIPPED)
def test_the_shipped_inventories_pass_every_role_spec(path):
    values = _plain(yaml.safe_load((ROOT / path).read_text()))
    checked = [name for role in HOST_PLAY["vars"]["moefleet_host_roles"] for name in spec(role) if name in values]
    assert len(checked) >= 5, checked  # the files set role inputs: the check below checks something
    for role in HOST_PLAY["vars"]["moefleet_host_roles"]:
        assert role_errors(role, values) == [], (path, role)
