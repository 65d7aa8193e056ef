"""The nvidia_driver role installs the kernel's headers and the headers metapackage that follows its updates.

The role's own expressions are evaluated here with ansible-core's templar: its defaults and vars as the files hold
them, the kernel's name as the `kernel` fact gives it (uname -r). Debian 13 names its kernels 6.12.117+deb13-amd64;
an expression that only strips Debian 12's "6.1.0-31-" left the whole name, so the role installed the running
kernel's headers twice and never linux-headers-amd64, and the host lost its GPUs at the next kernel update.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from role_defaults import role_defaults

ROLE = Path(__file__).resolve().parents[2] / "roles" / "nvidia_driver"

# uname -r -> the headers metapackage whose Depends follow that kernel's updates, as the distributions name them.
KERNELS = {
    "6.12.117+deb13-amd64": "linux-headers-amd64",              # Debian 13
    "6.12.117+deb13-cloud-amd64": "linux-headers-cloud-amd64",  # Debian 13, cloud images
    "6.12.117+deb13-rt-amd64": "linux-headers-rt-amd64",        # Debian 13, PREEMPT_RT
    "6.1.0-31-amd64": "linux-headers-amd64",                    # Debian 12
    "6.1.0-31-cloud-amd64": "linux-headers-cloud-amd64",        # Debian 12, cloud images
    "6.8.0-60-generic": "linux-headers-generic",                # Ubuntu 24.04
    "6.8.0-1015-aws": "linux-headers-aws",                      # Ubuntu on EC2
    "5.15.0-1063-azure": "linux-headers-azure",                 # Ubuntu 22.04 on Azure
}
# Names of no distribution's form: a self-built kernel (this build machine's), a bare upstream version.
UNKNOWN = ["6.18.44-fc-v657", "6.12.117", "6.12.117-amd64", ""]


def _trusted(value):
    """What Ansible does with a role's files: their strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def _role_vars() -> dict:
    defaults = role_defaults("nvidia_driver")
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    return _trusted({**defaults, **variables})  # vars/ win over defaults/, as in a play


def _templar(kernel: str, **inventory) -> Templar:
    facts = {"kernel": kernel, "distribution": "Debian", "distribution_release": "trixie"}
    return Templar(loader=DataLoader(), variables={**_role_vars(), "ansible_facts": facts,
                                                   "inventory_hostname": "gpu-1", **_trusted(inventory)})


def _value(templar: Templar, name: str):
    return templar.template(trust_as_template(f"{{{{ {name} }}}}"))


def _task(tasks_file: str, name_start: str) -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / tasks_file).read_text())
    found = [t for t in tasks if t.get("name", "").startswith(name_start)]
    assert len(found) == 1, f"{tasks_file} has {len(found)} tasks named {name_start!r}..."
    return found[0]


HEADERS_TASK = _task("install.yml", "Install the running kernel's headers")
REFUSAL = _task("preflight.yml", "Check that the kernel's name says which headers metapackage")


def _refused(templar: Templar) -> bool:
    """Whether the preflight's check stops the run, evaluated as a play would: its when, then its that."""
    check = REFUSAL["ansible.builtin.assert"]
    if not templar.evaluate_conditional(trust_as_template(REFUSAL["when"])):
        return False
    return not templar.evaluate_conditional(trust_as_template(check["that"]))


def test_the_headers_task_installs_what_these_tests_template():
    assert HEADERS_TASK["ansible.builtin.apt"]["name"] == "{{ _nvidia_driver_kernel_headers_packages }}"
    assert HEADERS_TASK["when"] == "nvidia_driver_kernel_headers | bool"


@pytest.mark.parametrize(("kernel", "metapackage"), KERNELS.items(), ids=list(KERNELS))
def test_the_metapackage_is_the_kernels_flavours(kernel, metapackage):
    templar = _templar(kernel)
    assert _value(templar, "nvidia_driver_kernel_headers_metapackage") == metapackage
    # The exact headers for now, the metapackage for the kernels to come: two packages, never one twice.
    assert _value(templar, "_nvidia_driver_kernel_headers_packages") == [f"linux-headers-{kernel}", metapackage]
    assert not _refused(templar)


@pytest.mark.parametrize("kernel", UNKNOWN)
def test_a_kernel_name_of_another_form_is_refused_naming_the_fix(kernel):
    templar = _templar(kernel)
    assert _value(templar, "nvidia_driver_kernel_headers_metapackage") == ""
    assert _refused(templar)
    message = " ".join(templar.template(trust_as_template(REFUSAL["ansible.builtin.assert"]["fail_msg"])).split())
    assert f"gpu-1 runs kernel {kernel}," in message
    assert "Nothing was changed." in message
    assert "Set nvidia_driver_kernel_headers_metapackage to the package that follows this kernel" in message
    assert "set nvidia_driver_kernel_headers to false" in message


def test_the_refusal_runs_before_any_change():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    assert tasks[0]["ansible.builtin.import_tasks"] == "preflight.yml"
    preflight = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    modules = [next(k for k in t if k.startswith("ansible.builtin.")) for t in preflight]
    # Only reads and checks in the preflight: no package, file or service module; apt only refreshes its lists (to
    # ask whether the running kernel's headers are in the archive), installing nothing.
    assert set(modules) <= {"ansible.builtin.setup", "ansible.builtin.assert", "ansible.builtin.package_facts",
                            "ansible.builtin.command", "ansible.builtin.slurp", "ansible.builtin.stat",
                            "ansible.builtin.apt"}
    for task in preflight:
        if "ansible.builtin.apt" in task:
            assert set(task["ansible.builtin.apt"]) == {"update_cache", "cache_valid_time"}, task


@pytest.mark.parametrize("inventory", [
    {"nvidia_driver_kernel_headers_metapackage": "linux-headers-fc"},
    {"nvidia_driver_kernel_headers": False},
    {"nvidia_driver_kernel_headers": "no"},
], ids=["metapackage set", "headers off", "headers off as -e gives it"])
def test_either_fix_the_refusal_names_lets_the_run_go_on(inventory):
    assert not _refused(_templar("6.18.44-fc-v657", **inventory))


def test_a_metapackage_set_to_the_exact_headers_is_installed_once():
    templar = _templar("6.18.44-fc-v657", nvidia_driver_kernel_headers_metapackage="linux-headers-6.18.44-fc-v657")
    assert _value(templar, "_nvidia_driver_kernel_headers_packages") == ["linux-headers-6.18.44-fc-v657"]


def test_the_kernel_release_can_stand_in_for_the_running_kernel():
    """The lab's containers run the build machine's kernel; a host image built in a chroot runs the builder's."""
    templar = _templar("6.18.44-fc-v657", nvidia_driver_kernel_release="6.1.0-31-cloud-amd64")
    assert _value(templar, "_nvidia_driver_kernel_headers_packages") == [
        "linux-headers-6.1.0-31-cloud-amd64", "linux-headers-cloud-amd64"]
    assert not _refused(templar)


# -- a stale image: the running kernel's headers left the archive -------------------------------------------------

STALE = _task("preflight.yml", "Refuse a kernel whose headers left the archive")
POLICY = {
    "there": "linux-headers-6.1.0-31-amd64:\n  Installed: (none)\n  Candidate: 6.1.128-1\n  Version table:\n"
             "     6.1.128-1 500\n        500 http://deb.debian.org/debian bookworm/main amd64 Packages\n",
    "gone": "",  # apt-cache policy prints nothing for a package no source lists (N: Unable to locate package)
    "no version": "linux-headers-6.1.0-31-amd64:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n",
}


def _stale_refused(kernel: str, policy: str, installed: tuple[str, ...] = (), check_mode: bool = False,
                   **inventory) -> bool:
    templar = _templar(kernel, **inventory)
    templar.available_variables = {
        **templar.available_variables, "ansible_check_mode": check_mode,
        "ansible_facts": {**templar.available_variables["ansible_facts"],
                          "packages": {name: [{"version": "1"}] for name in installed}},
        "__nvidia_driver_headers_policy": {"stdout": policy}}
    if not all(templar.evaluate_conditional(trust_as_template(w)) for w in STALE["when"]):
        return False
    return not templar.evaluate_conditional(trust_as_template(STALE["ansible.builtin.assert"]["that"]))


@pytest.mark.parametrize(("policy", "refused"), [("there", False), ("gone", True), ("no version", True)])
def test_a_kernel_whose_headers_left_the_archive_is_refused_before_any_change(policy, refused):
    assert _stale_refused("6.1.0-31-amd64", POLICY[policy]) is refused


def test_the_stale_kernel_refusal_says_what_to_do():
    templar = _templar("6.1.0-31-cloud-amd64")
    message = " ".join(templar.template(trust_as_template(STALE["ansible.builtin.assert"]["fail_msg"])).split())
    assert "gpu-1 runs kernel 6.1.0-31-cloud-amd64, whose headers (linux-headers-6.1.0-31-cloud-amd64) are not in" \
        in message
    assert "Nothing was changed." in message
    assert "apt-get install linux-image-cloud-amd64, then reboot" in message
    assert "set nvidia_driver_kernel_headers to false" in message


@pytest.mark.parametrize(("installed", "inventory", "check_mode"), [
    (("linux-headers-6.1.0-31-amd64",), {}, False),  # already installed: nothing to ask
    ((), {"nvidia_driver_kernel_headers": False}, False),  # the module comes another way
    ((), {}, True),  # check mode cannot refresh apt's lists: the install step says so instead
], ids=["installed", "headers off", "check mode"])
def test_no_stale_kernel_refusal_where_nothing_is_to_install_or_apt_cannot_tell(installed, inventory, check_mode):
    assert not _stale_refused("6.1.0-31-amd64", POLICY["gone"], installed, check_mode, **inventory)


def test_the_preflight_asks_apt_for_the_running_kernels_headers():
    asked = _task("preflight.yml", "Ask apt whether the running kernel's headers can be installed")
    assert asked["ansible.builtin.command"]["argv"] == [
        "apt-cache", "policy", "linux-headers-{{ nvidia_driver_kernel_release }}"]
    assert asked["register"] == "__nvidia_driver_headers_policy" and asked["check_mode"] is False
