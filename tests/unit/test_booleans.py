"""Every documented boolean, wherever a role or playbook decides on it, takes what -e passes.

The documented booleans are the options with ``type: bool`` in the roles' argument specs plus the
playbook booleans playbooks/validate.yml lists and the run's own booleans of module_utils/playbook_inputs.py (the
very lists the controller checks use). Every
when/changed_when/failed_when and assert condition that names one is evaluated with ansible-core's own
templar with the variable set to each string form -e gives (true/false, yes/no, 1/0, any case) and must
decide exactly as it does with the real boolean: a bare ``when: flag`` fails here under ansible-core 2.19
("Conditionals must have a boolean result"), and ``not flag`` decides wrongly for "false".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs, profiles

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = yaml.safe_load((ROOT / "playbooks" / "validate.yml").read_text())[0]["vars"]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())


def _role_booleans() -> list[str]:
    names = []
    for role in ROLES:
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        names += [n for n, o in spec["argument_specs"]["main"]["options"].items() if o.get("type") == "bool"]
    return names


# The run's own booleans (moefleet_health_gate, moefleet_any_errors_fatal, moefleet_through_routers) are in the
# table playbooks/validate.yml checks them from (module_utils/playbook_inputs.py). apply too, but no condition
# decides on it: bench.yml reads it as bench_apply (| bool), and its one assert only says it is a boolean form.
RUN_BOOLEANS = [name for name, spec in playbook_inputs.INPUTS.items() if spec.kind == "bool" and name != "apply"]
BOOLEANS = _role_booleans() + VALIDATE["moefleet_playbook_booleans"] + RUN_BOOLEANS
TRUE_FORMS = ["true", "True", "yes", "YES", "1"]
FALSE_FORMS = ["false", "False", "no", "No", "0"]
CONDITION_KEYS = ("when", "changed_when", "failed_when")

# What the other names in those conditions hold, chosen so that the boolean decides each one.
CONTEXT = {
    "ansible_check_mode": False,
    "_nvidia_driver_secure_boot": True,
    "_nvidia_driver_pending": False,
    "moefleet_plan": {"verdict": "oom"},
    "sglang_service_outcome": {"outcome": "degraded"},
    "__sglang_service_start": {"failed": True},
}


def _files() -> list[Path]:
    files = [ROOT / "deploy.yml", *sorted((ROOT / "playbooks").rglob("*.yml"))]
    for role in ROLES:
        files += sorted((ROOT / "roles" / role).glob("tasks/*.yml"))
        files += sorted((ROOT / "roles" / role).glob("handlers/*.yml"))
    return files


def _conditions(node, where):
    """(where, condition) for every condition string in a parsed task file."""
    if isinstance(node, list):
        for item in node:
            yield from _conditions(item, where)
    elif isinstance(node, dict):
        here = f"{where} / {node['name']}" if isinstance(node.get("name"), str) else where
        for key in CONDITION_KEYS:
            value = node.get(key)
            for cond in value if isinstance(value, list) else [value]:
                if isinstance(cond, str):
                    yield f"{here} ({key})", cond
        for module in ("assert", "ansible.builtin.assert"):
            that = (node.get(module) or {}).get("that") if isinstance(node.get(module), dict) else None
            for cond in that if isinstance(that, list) else [that]:
                if isinstance(cond, str):
                    yield f"{here} (assert)", cond
        for value in node.values():
            if isinstance(value, list | dict):
                yield from _conditions(value, here)


def _uses() -> list[tuple[str, str, str]]:
    uses = []
    for path in _files():
        for where, cond in _conditions(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT))):
            for name in BOOLEANS:
                if re.search(rf"\b{name}\b", cond):
                    uses.append((where, name, cond))
    return uses


USES = _uses()


def _decide(cond: str, name: str, value) -> bool:
    templar = Templar(loader=DataLoader(), variables={**CONTEXT, name: value})
    return templar.evaluate_conditional(trust_as_template(cond))


def test_the_documented_booleans_are_found_and_used():
    assert {"sglang_service_rollback", "nvidia_driver_reboot", "moefleet_allow_unfit"} <= set(BOOLEANS)
    used = {name for _, name, _ in USES}
    assert {"nvidia_driver_reboot", "nvidia_driver_update_initramfs", "nvidia_driver_check_kernel_module",
            "sglang_service_rollback", "sglang_service_degraded_fails", "moefleet_allow_unfit"} <= used


def test_validate_yml_lists_every_role():
    """validate.yml checks the booleans of the roles it lists: every role but the two whose inputs the playbooks
    and roles set, not the operator (moefleet_common, router_membership; neither has a boolean), and no role that
    does not exist. (validate.yml is being rewritten on another branch; this names the two until then.)"""
    listed = set(VALIDATE["moefleet_roles"])
    assert listed <= set(ROLES)
    assert set(ROLES) - listed == {"moefleet_common", "router_membership"}
    for role in ("moefleet_common", "router_membership"):
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        options = [o for spec in specs.values() for o in (spec.get("options") or {}).values()]
        assert not [o for o in options if o.get("type") == "bool"]


@pytest.mark.parametrize(("where", "name", "cond"), USES, ids=[f"{w}:{n}" for w, n, _ in USES])
def test_condition_decides_on_every_form_minus_e_passes(where, name, cond):
    on, off = _decide(cond, name, True), _decide(cond, name, False)
    assert on != off, f"CONTEXT does not let {name} decide {cond!r}; add what it needs"
    for form in TRUE_FORMS:
        assert _decide(cond, name, form) is on, (where, form)
    for form in FALSE_FORMS:
        assert _decide(cond, name, form) is off, (where, form)


def test_a_bare_boolean_fails_this_check():
    """The check above can fail: the old bare forms break on the strings -e passes."""
    with pytest.raises(Exception, match="Conditionals must have a boolean result"):
        _decide("sglang_service_rollback", "sglang_service_rollback", "false")
    assert _decide("not nvidia_driver_reboot", "nvidia_driver_reboot", "false") is False  # decides wrongly


@pytest.mark.parametrize("form", [*TRUE_FORMS, *FALSE_FORMS, True, False, 0, 1])
def test_the_controller_accepts_what_the_roles_accept(form):
    assert profiles.bool_problem("sglang_service_rollback", form) is None
    assert profiles.parse_bool(form) is (form in TRUE_FORMS or form is True or form == 1)


@pytest.mark.parametrize("form", ["maybe", "", "on", "2", 2, None, [], "tru"])
def test_the_controller_refuses_anything_else_naming_the_variable(form):
    assert profiles.bool_problem("nvidia_driver_reboot", form, "gpu-1") == (
        f"nvidia_driver_reboot is {form!r} for gpu-1, which is not a boolean; set it to true or false "
        "(yes/no and 1/0 work too), e.g. -e nvidia_driver_reboot=true."
    )
