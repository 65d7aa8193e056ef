"""playbooks/bench.yml's own expressions, run by ansible-playbook on localhost (no lab): the report lands under the
working directory of ansible-playbook, not next to the playbook; the client is pointed at the address the server
binds; the host leaves the routers before the first restart and comes back after the last one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "playbooks" / "bench.yml"
VENV_BIN = Path(sys.executable).parent


def sweep_play() -> dict:
    (play,) = [p for p in yaml.safe_load(BENCH.read_text()) if p.get("hosts") == "blackwell"]
    return play


def named(tasks: list[dict], name: str) -> dict:
    (task,) = [t for t in tasks if t.get("name") == name]
    return task


def sweep_block() -> dict:
    return named(sweep_play()["tasks"], "Sweep, report, then serve what the host served before (or the winner)")


def run(playbook: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """ansible-playbook with the repository's ansible.cfg (the collection), on localhost, from cwd."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook), *extra]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done


def write_play(path: Path, play_vars: dict, tasks: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    play = {"name": "bench.yml's expressions", "hosts": "localhost", "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}", **play_vars}, "tasks": tasks}
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return path


@pytest.mark.parametrize("report_dir", ["reports", "out/bench"])
def test_the_report_lands_under_the_working_directory_not_the_playbooks(tmp_path, report_dir):
    """bench.yml's header: reports/ under the working directory. The module runs in the playbook's directory
    (Ansible runs local modules there), so bench.yml resolves the directory in the play; run here with the
    expression and the module arguments of bench.yml itself, from another directory than the playbook's."""
    play = sweep_play()
    write = named(sweep_block()["block"], "Write the report on the controller")
    args = {k: write["moefleet.serving.bench_report"][k] for k in ("host", "model", "dest")}
    assert args["dest"] == "{{ bench_report_path }}"
    args.update(profiles=[], stem="bench-x", plots=False)
    workdir, playdir = tmp_path / "work", tmp_path / "playbooks"
    workdir.mkdir()
    playbook = write_play(playdir / "bench-report.yml",
                          {"bench_report_dir": report_dir, "bench_report_path": play["vars"]["bench_report_path"],
                           "bench_model": "kimi-k2.6"},
                          [{"name": "Write the report", "moefleet.serving.bench_report": args,
                            "delegate_to": "localhost"}])
    run(playbook, workdir)
    assert json.loads((workdir / report_dir / "bench-x.json").read_text())["host"] == "localhost"
    assert not (playdir / report_dir).exists()
    # An absolute directory is taken as it is.
    elsewhere = tmp_path / "elsewhere"
    run(playbook, workdir, "-e", f"bench_report_dir={elsewhere}")
    assert (elsewhere / "bench-x.md").is_file()


def test_the_client_is_pointed_at_the_address_the_server_binds(tmp_path):
    """bench_server_host from sglang_service_host: loopback for the wildcard addresses, IPv6 without brackets
    (bench_serving adds them, as NetworkAddress does), the role's default 127.0.0.1 when unset."""
    binds = ["127.0.0.1", "0.0.0.0", "::", "[::]", "10.0.0.11", "::1", "[fd00::7]", "fd00::7", "gpu-07.lan"]
    out = tmp_path / "seen.json"
    # bench.yml's first task reads the roles' defaults (the unset case's fallback) under __defaults_<role>.
    (first, *_) = sweep_play()["tasks"]
    assert first["ansible.builtin.include_vars"]["name"] == "__defaults_{{ item }}"
    assert "sglang_service" in first["loop"]
    defaults = {"name": "Read the sglang_service role's defaults", "ansible.builtin.include_vars": {
        "file": str(ROOT / "roles" / "sglang_service" / "defaults" / "main.yml"), "name": "__defaults_sglang_service"}}
    playbook = write_play(tmp_path / "addr.yml", {"bench_server_host": sweep_play()["vars"]["bench_server_host"]}, [
        defaults,
        {"name": "Note the address for each bind", "ansible.builtin.set_fact": {
            "seen": "{{ seen | default({}) | combine({item: _addr}) }}"},
         "vars": {"sglang_service_host": "{{ item }}", "_addr": "{{ bench_server_host }}"}, "loop": binds},
        {"name": "Note it without sglang_service_host", "ansible.builtin.set_fact": {
            "seen": "{{ seen | combine({'(unset)': bench_server_host}) }}"}},
        {"name": "Write them", "ansible.builtin.copy": {"content": "{{ seen | to_json }}", "dest": str(out),
                                                        "mode": "0644"}},
    ])
    run(playbook, tmp_path)
    assert json.loads(out.read_text()) == {
        "127.0.0.1": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "10.0.0.11": "10.0.0.11",
        "::1": "::1", "[fd00::7]": "fd00::7", "fd00::7": "fd00::7", "gpu-07.lan": "gpu-07.lan",
        "(unset)": "127.0.0.1",
    }
    # and it is what bench_serving gets as --host, with the dataset that needs no download
    profile = (ROOT / "playbooks" / "tasks" / "bench_profile.yml").read_text()
    assert "'--host', bench_server_host," in profile and "'127.0.0.1'" not in profile
    # the model directory as --model: the client's chat-template check reads it, not the Hub
    assert "'--model', bench_model_path, '--served-model-name', bench_model," in profile
    assert "(['--tokenize-prompt'] if bench_tokenize_prompt | bool else [])" in profile
    assert sweep_play()["vars"]["bench_dataset_name"] == "random-ids"


def test_the_host_leaves_the_routers_before_the_first_restart_and_returns_after_the_last():
    play = sweep_play()
    assert play["vars"]["bench_routed"] == "{{ groups['routers'] | default([]) | length > 0 }}"
    block = sweep_block()
    names = [t["name"] for t in block["block"]]
    out = named(block["block"], "Take the host out of the routers for the sweep and let its requests finish")
    assert names.index(out["name"]) < names.index("Serve and measure each profile")
    assert (out["ansible.builtin.include_role"], out["vars"]) == ({"name": "router_membership"},
                                                                  {"router_membership_state": "out"})
    assert "bench_routed | bool" in out["when"]
    after = [t["name"] for t in block["always"]]
    back = named(block["always"], "Put the host back into the routers and wait until they route to it")
    assert (back["ansible.builtin.include_role"], back["vars"]) == ({"name": "router_membership"},
                                                                    {"router_membership_state": "in"})
    # after the restore, and only when the host serves as asked; the temporary files go before the restore
    assert after.index(back["name"]) > after.index("Serve again what the host served before the sweep, or the winner")
    assert "bench_routed | bool" in back["when"] and "bench_final_profile is not none" in back["when"]
    assert "sglang_service_outcome.serving_profile | default('') == bench_final_profile" in back["when"]
    assert after.index("Remove the results and the key from the host") < after.index(
        "Serve again what the host served before the sweep, or the winner")
