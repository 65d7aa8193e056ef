"""The CLI where operators run it: their Ansible configuration, found as ansible-playbook finds it (ANSIBLE_CONFIG,
./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg; the clone's own only when there is none), their inventory,
and their vault passwords (--vault-password-file, --ask-vault-pass) on every command that runs Ansible. The last
tests run the real ansible-runner and ansible-playbook (on the controller only: validate.yml, an ad-hoc debug)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moefleet import cli, collection, runner

BIN = Path(sys.executable).parent
ETC_CFG = Path("/etc/ansible/ansible.cfg")
OPERATOR_CFG = """\
[defaults]
inventory = hosts.yml
roles_path = myroles
collections_path = mycollections
callbacks_enabled = ansible.builtin.junit
host_key_checking = False
"""
HOSTS = """\
blackwell:
  hosts:
    gpu-1:
    gpu-2:
  vars:
    sglang_profile: tp8
    sglang_model_source: prestaged
"""


@pytest.fixture
def operator(tmp_path, monkeypatch) -> Path:
    """A working directory outside the clone, a home of its own, no ANSIBLE_* variable set."""
    for name in [n for n in os.environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    home, work = tmp_path / "home", tmp_path / "ops"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (work / "hosts.yml").write_text(HOSTS)
    return work


def test_the_operators_ansible_cfg_in_the_working_directory_is_used(operator):
    (operator / "ansible.cfg").write_text(OPERATOR_CFG)
    assert runner.ansible_config() == operator / "ansible.cfg"
    assert runner.default_inventories() == [operator / "hosts.yml"]  # relative to the file, as Ansible reads it
    assert runner.ansible_environment() == {
        "ANSIBLE_CONFIG": str(operator / "ansible.cfg"),
        # this collection and its roles first (its playbooks name them), then the operator's
        "ANSIBLE_COLLECTIONS_PATH": f"{collection.COLLECTIONS_DIR}:{operator / 'mycollections'}",
        "ANSIBLE_ROLES_PATH": f"{collection.ROOT / 'roles'}:{operator / 'myroles'}",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.junit,moefleet.serving.moefleet_report",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
    }


def test_ansible_config_in_the_environment_wins(operator, monkeypatch, tmp_path):
    (operator / "ansible.cfg").write_text(OPERATOR_CFG)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ansible.cfg").write_text("[defaults]\ninventory = fleet/\n")
    (elsewhere / "fleet").mkdir()
    monkeypatch.setenv("ANSIBLE_CONFIG", str(elsewhere / "ansible.cfg"))
    assert runner.ansible_config() == elsewhere / "ansible.cfg"
    assert runner.default_inventories() == [elsewhere / "fleet"]
    env = runner.ansible_environment()
    assert env["ANSIBLE_CONFIG"] == str(elsewhere / "ansible.cfg")
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"  # Ansible's default, which ansible-runner would turn off


def test_the_home_ansible_cfg_when_nothing_nearer(operator):
    (Path(os.environ["HOME"]) / ".ansible.cfg").write_text("[defaults]\ninventory = ~/inventory.yml\n")
    (Path(os.environ["HOME"]) / "inventory.yml").write_text(HOSTS)
    assert runner.ansible_config() == Path(os.environ["HOME"]) / ".ansible.cfg"
    assert runner.default_inventories() == [Path(os.environ["HOME"]) / "inventory.yml"]


@pytest.mark.skipif(ETC_CFG.exists(), reason="/etc/ansible/ansible.cfg exists here: Ansible, and moefleet, use it")
def test_the_clones_own_ansible_cfg_only_when_there_is_no_other(operator):
    assert runner.ansible_config() == collection.ANSIBLE_CFG == collection.ROOT / "ansible.cfg"
    assert runner.ansible_environment()["ANSIBLE_CONFIG"] == str(collection.ROOT / "ansible.cfg")
    assert runner._project_dir(collection.ANSIBLE_CFG) == str(collection.ROOT)  # its relative paths are the clone's


@pytest.mark.skipif(ETC_CFG.exists(), reason="/etc/ansible/ansible.cfg exists here: Ansible, and moefleet, use it")
def test_an_installed_collection_without_any_ansible_cfg_runs_under_ansibles_defaults(operator, monkeypatch):
    monkeypatch.setattr(collection, "ANSIBLE_CFG", None)  # an installed copy ships none
    assert runner.ansible_config() is None
    assert "ANSIBLE_CONFIG" not in runner.ansible_environment()
    with pytest.raises(runner.BadInput, match=r"No inventory given, and none that the Ansible configuration \(no "
                                              r"ansible.cfg found\) names exists \(/etc/ansible/hosts\): pass -i"):
        runner.default_inventories()


def test_several_inventories_in_ansible_cfg_all_reach_the_run(operator, monkeypatch):
    (operator / "ansible.cfg").write_text("[defaults]\ninventory = hosts.yml,more.yml,missing.yml\n")
    (operator / "more.yml").write_text("all: {}\n")
    seen: dict = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        return type("R", (), {"status": "successful", "rc": 0, "stats": {}})()

    import ansible_runner

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    runner.run_playbook("status.yml", None, {})
    assert seen["inventory"] == [str(operator / "hosts.yml"), str(operator / "more.yml")]  # as Ansible: those found


def test_run_playbook_and_run_adhoc_use_the_operators_configuration_and_vault(operator, monkeypatch):
    import ansible_runner

    (operator / "ansible.cfg").write_text(OPERATOR_CFG)
    calls: list[dict] = []

    def fake_run(**kwargs):
        calls.append(kwargs)
        return type("R", (), {"status": "successful", "rc": 0, "stats": {}})()

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    secrets = runner.Vault(("/srv/vault pass",), ask=True, password="hunter2")
    runner.run_playbook("status.yml", None, {}, vault=secrets)
    runner.run_adhoc("ansible.builtin.setup", "filter=ansible_local", None, "blackwell", vault=secrets)
    for kwargs in calls:
        assert kwargs["inventory"] == str(operator / "hosts.yml")
        assert kwargs["envvars"]["ANSIBLE_CONFIG"] == str(operator / "ansible.cfg")
        assert kwargs["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "False"
        assert kwargs["project_dir"] == str(operator)  # ansible-playbook runs where the operator is
        assert kwargs["cmdline"] == "--vault-password-file '/srv/vault pass' --ask-vault-pass"
        assert kwargs["passwords"] == {runner.VAULT_PROMPT: "hunter2"}
    assert "hunter2" not in repr(secrets)


# --- the real thing: ansible-runner and ansible-playbook from outside the clone --------------------------------


def test_a_playbook_runs_from_outside_the_clone_under_the_operators_ansible_cfg(operator):
    """validate.yml (the collection's module and filters, the controller only) through the runner, with the
    operator's ansible.cfg and inventory; and deploy.yml's roles and modules resolve under it (--syntax-check)."""
    (operator / "ansible.cfg").write_text(OPERATOR_CFG.replace("callbacks_enabled = ansible.builtin.junit\n", ""))
    failures: list[str] = []

    def failed(event):
        if event.get("event") == "runner_on_failed":
            failures.append(" ".join(str(event["event_data"]["res"].get("msg")).split()))

    good = runner.run_playbook("validate.yml", None, {"profile": "tp8", "moefleet_max_unavailable": "25%"},
                               on_event=failed)
    assert (good.status, good.rc, failures) == ("successful", 0, [])
    bad = runner.run_playbook("validate.yml", None, {"moefleet_max_unavailable": "0"}, on_event=failed)
    assert bad.rc != 0 and failures[0].startswith("moefleet_max_unavailable is '0', which Ansible takes as every")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}, **runner.ansible_environment()}
    check = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", str(collection.PLAYBOOKS / "deploy.yml")],
                           cwd=operator, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


VAULTED = "secret_word: s3cret-from-vault\n"


@pytest.fixture
def vaulted(operator) -> Path:
    """The inventory's group_vars/all/vault.yml, encrypted with the password in ../vault-pass."""
    password = operator.parent / "vault-pass"
    password.write_text("correct horse\n")
    vault = operator / "group_vars" / "all" / "vault.yml"
    vault.parent.mkdir(parents=True)
    vault.write_text(VAULTED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    subprocess.run([str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(vault)],
                   check=True, capture_output=True, env=env, timeout=60)
    assert vault.read_text().startswith("$ANSIBLE_VAULT;")
    (operator / "ansible.cfg").write_text("[defaults]\ninventory = hosts.yml\n")
    return password


def test_vault_password_file_and_ask_vault_pass_reach_ansible(vaulted):
    def secret(vault):
        result = runner.run_adhoc("ansible.builtin.debug", "msg={{ secret_word }}", None, "gpu-1", vault=vault)
        return result.ok.get("gpu-1", {}).get("msg")

    assert secret(runner.Vault((str(vaulted),))) == "s3cret-from-vault"
    assert secret(runner.Vault(ask=True, password="correct horse")) == "s3cret-from-vault"  # the prompt answered
    assert secret(None) is None  # without a password Ansible cannot read the inventory


class Recorder:
    """Stands in for runner.run_playbook and runner.run_adhoc, keeping the vault each was given (and the
    playbooks' --skip-tags)."""

    def __init__(self):
        self.vaults: list[runner.Vault | None] = []
        self.skip_tags: list[str | None] = []

    def playbook(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None,
                 skip_tags=None):
        self.vaults.append(vault)
        self.skip_tags.append(skip_tags)
        return runner.RunResult("failed", 2)

    def adhoc(self, module, module_args, inventory, pattern, limit=None, extravars=None, vault=None):
        self.vaults.append(vault)
        return runner.AdhocResult({}, {}, {}, "successful", 0)


COMMANDS = [
    ["rollout", "-e", "profile=ep8", "--yes"],
    ["rollout", "-e", "profile=ep8", "--check"],
    ["deploy", "-e", "profile=ep8", "--yes"],
    ["deploy", "-e", "profile=ep8", "--check"],
    ["status"],
    ["history", "gpu-1"],
    ["bench", "run"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) if c[0] == "bench" else c[0] + c[-1] for c in
                                                   COMMANDS])
def test_every_command_that_runs_ansible_passes_the_vault_options(command, operator, monkeypatch, capsys):
    record = Recorder()
    monkeypatch.setattr(runner, "run_playbook", record.playbook)
    monkeypatch.setattr(runner, "run_adhoc", record.adhoc)
    (operator / "pass.txt").write_text("pw\n")
    asked: list[str] = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "typed")
    cli.main([*command, "-i", "hosts.yml", "--vault-password-file", "pass.txt", "--ask-vault-pass"])
    assert record.vaults, capsys.readouterr()
    assert set(record.vaults) == {runner.Vault((str(operator / "pass.txt"),), ask=True, password="typed")}
    assert asked == ["Vault password: "]  # once, for every run of the command


@pytest.mark.parametrize("command", ["rollout", "deploy"])
def test_serve_only_skips_the_install_tag_and_nothing_else(command, operator, monkeypatch, capsys):
    record = Recorder()
    monkeypatch.setattr(runner, "run_playbook", record.playbook)
    cli.main([command, "-i", "hosts.yml", "-e", "profile=ep8", "--yes", "--serve-only"])
    cli.main([command, "-i", "hosts.yml", "-e", "profile=ep8", "--yes"])
    assert record.skip_tags == ["install", None], capsys.readouterr()


@pytest.mark.parametrize("command", COMMANDS[::2] + [["status"]])
def test_a_vault_password_file_that_is_not_there_is_bad_input(command, operator, monkeypatch, capsys):
    record = Recorder()
    monkeypatch.setattr(runner, "run_playbook", record.playbook)
    monkeypatch.setattr(runner, "run_adhoc", record.adhoc)
    assert cli.main([*command, "-i", "hosts.yml", "--vault-password-file", "nope.txt"]) == 2
    assert "--vault-password-file nope.txt: no such file" in capsys.readouterr().err
    assert record.vaults == []


def test_the_rollout_plan_reads_the_operators_inventory_by_default(operator, monkeypatch, capsys):
    """`moefleet rollout --check` without -i, from the operator's directory: their ansible.cfg's inventory."""
    (operator / "ansible.cfg").write_text(OPERATOR_CFG)
    seen: list = []

    def adhoc(module, module_args, inventory, pattern, limit=None, extravars=None, vault=None):
        seen.append(runner.inventory_sources(inventory))
        return runner.AdhocResult({}, {}, {}, "successful", 0)

    monkeypatch.setattr(runner, "run_adhoc", adhoc)
    assert cli.main(["rollout", "-e", "profile=ep8", "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inventory"] == str(operator / "hosts.yml")
    assert seen == [[operator / "hosts.yml"]]
