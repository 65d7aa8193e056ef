"""playbooks/bench.yml's own expressions, run by ansible-playbook on localhost (no lab): the report lands under the
working directory of ansible-playbook, not next to the playbook; the client is pointed at the address the server
binds; the host leaves the routers before the first restart and comes back after the last one; every input is
checked on the controller before any host is read (an unreachable inventory host, never contacted)."""

from __future__ import annotations

import json
import os
import re
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


def write_play(path: Path, play_vars: dict, tasks: list[dict], vars_files: list[str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    play = {"name": "bench.yml's expressions", "hosts": "localhost", "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}", **play_vars},
            **({"vars_files": vars_files} if vars_files else {}), "tasks": tasks}
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
    # bench.yml's play lists the fleet's defaults first (the unset case's fallback); here they are loaded as a
    # vars file, below the task vars that stand for the inventory, as role defaults are.
    assert sweep_play()["roles"][0] == {"role": "moefleet_defaults"}
    home = str(ROOT / "roles" / "moefleet_defaults" / "defaults" / "main.yml")
    playbook = write_play(tmp_path / "addr.yml", {"bench_server_host": sweep_play()["vars"]["bench_server_host"]}, [
        {"name": "Note the address for each bind", "ansible.builtin.set_fact": {
            "seen": "{{ seen | default({}) | combine({item: _addr}) }}"},
         "vars": {"sglang_service_host": "{{ item }}", "_addr": "{{ bench_server_host }}"}, "loop": binds},
        {"name": "Note it without sglang_service_host", "ansible.builtin.set_fact": {
            "seen": "{{ seen | combine({'(unset)': bench_server_host}) }}"}},
        {"name": "Write them", "ansible.builtin.copy": {"content": "{{ seen | to_json }}", "dest": str(out),
                                                        "mode": "0644"}},
    ], vars_files=[home])
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


# Tasks that run on the controller only: they read no host (assert, meta and include_vars are action plugins that
# open no connection).
CONTROLLER_ONLY = {"ansible.builtin.assert", "ansible.builtin.meta", "ansible.builtin.include_vars"}


def test_every_input_is_checked_before_the_first_task_that_reads_a_host():
    """The sweep's inputs are validate.yml's (imported first, as rollout.yml does; INPUTS of
    module_utils/playbook_inputs.py); the sweep play's tasks up to the first one that reads a host (the fault
    watcher's verdict, on the measured host only) run on the controller, and no later assert checks an input again."""
    from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs

    plays = yaml.safe_load(BENCH.read_text())
    assert plays[0] == {"name": "Validate input on the controller", "ansible.builtin.import_playbook": "validate.yml"}
    tasks = sweep_play()["tasks"]
    names = [t["name"] for t in tasks]
    first_read = names.index("Refuse a host the fault watcher found unfit (moefleet remediate first)")
    assert tasks[first_read]["ansible.builtin.include_role"] == {"name": "moefleet_common", "tasks_from": "fit.yml"}
    before = [next(k for k in t if k.startswith("ansible.")) for t in tasks[:first_read]]
    assert set(before) <= CONTROLLER_ONLY, before
    assert names.index("Measure one host only (the first of the play, or bench_host)") < first_read
    for task in tasks[first_read:]:
        that = (task.get("ansible.builtin.assert") or {}).get("that", [])
        for condition in that if isinstance(that, list) else [that]:
            checked = [n for n in playbook_inputs.INPUTS if re.search(rf"\b{n}\b", condition)]
            assert checked == [], f"{task['name']} checks {checked} again, after a host was read"


def run_refused(inventory: Path, *extra: str) -> str:
    """bench.yml run on an inventory whose only host is unreachable (TEST-NET-1): it must fail on the controller,
    the host never contacted (a task on it would report it unreachable after an SSH timeout)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_TIMEOUT="3", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(BENCH)]
    for value in extra:
        cmd += ["-e", value]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    recap = done.stdout.split("PLAY RECAP")[-1]
    assert done.returncode != 0, done.stdout[-3000:]
    assert "UNREACHABLE!" not in done.stdout and "unreachable=1" not in recap, "a host was contacted"
    assert "Refuse a host the fault watcher found unfit" not in done.stdout, "the sweep reached its host tasks"
    return " ".join(done.stdout.split())


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                    "          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n"
                    "          sglang_model_source: prestaged\n")
    return path


def test_bad_sweep_inputs_are_refused_before_any_host_each_with_its_fix(unreachable):
    out = run_refused(unreachable, json.dumps({"profiles": ["tp8", "tp3"], "bench_ladder": [1, 0],
                                               "bench_service_extra_env": {"NCCL_P2P_DISABLE": "1"}}),
                      "apply_objective=fastest", "bench_slo_p99_itl_ms=null")
    for sentence in (
        "profiles names tp3, which the catalog does not have; name profiles of the catalog (tp8,",
        "item 2 of bench_ladder is 0; give each as a whole number from 1 to 100000",
        "bench_service_extra_env sets NCCL_P2P_DISABLE, which the NCCL set pcie_shm defines",
        "apply_objective is 'fastest'; set it to one of single_stream, throughput, slo",
        "bench_slo_p99_itl_ms is 'null'; set it to a number above 0",
    ):
        assert sentence in out, sentence


def test_a_host_to_measure_outside_the_run_is_refused_before_any_host(unreachable):
    out = run_refused(unreachable, "bench_host=gpu-9")
    assert "bench_host is gpu-9, which is not a host of group blackwell in this run (unreachable-1)" in out


def test_good_sweep_inputs_pass_the_checks(tmp_path):
    """The forms the header documents pass validate.yml: the run reaches the host's first check, here a local host
    that is not deployed (read-only: the fault watcher's file, facts, two stat calls)."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        local-1:\n"
                    "          ansible_connection: local\n"
                    f"          ansible_python_interpreter: {sys.executable}\n"
                    "          sglang_profile: tp8\n          sglang_model_source: prestaged\n"
                    f"          sglang_venv: {tmp_path}/venv\n          sglang_model_path: {tmp_path}/model\n"
                    f"          moefleet_unfit_file: {tmp_path}/unfit.json\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    good = {"profiles": "tp8, ep8", "bench_ladder": [1, "64"], "bench_slo_p99_itl_ms": None, "apply": "no",
            "apply_objective": "slo", "bench_prompts_per_concurrency": "1.5", "bench_dataset_path": "/srv/sg.json",
            "bench_service_extra_env": {"NCCL_DEBUG": "INFO"}, "bench_report_dir": str(tmp_path / "reports")}
    done = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(path), str(BENCH), "-e", json.dumps(good)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = " ".join(done.stdout.split())
    assert done.returncode != 0 and "TASK [Require a deployed host]" in out, done.stdout[-3000:]
    assert f"local-1 lacks {tmp_path}/venv/bin/python and {tmp_path}/model/config.json" in out


@pytest.mark.parametrize(("argv", "sentence"), [
    (["-e", '{"bench_ladder": [1, 0]}'], "item 2 of bench_ladder is 0; give each as a whole number from 1 to 100000"),
    (["-e", "apply_objective=fastest"], "apply_objective is 'fastest'; set it to one of single_stream, throughput"),
    (["--profiles", " , "], "--profiles needs one or more profile names"),
    (["--profiles", "tp8", "-e", "bench_dataset_name=sharegpt"], "bench_dataset_name is 'sharegpt'; set it to one of"),
])
def test_moefleet_bench_run_refuses_bad_input_with_exit_2_before_running_anything(monkeypatch, capsys, argv,
                                                                                   sentence):
    """The CLI's own check is playbook_inputs' (the one validate.yml runs): nothing starts, exit 2, the sentence."""
    from moefleet import runner
    from moefleet.cli import main

    def no_run(*_args, **_kwargs):
        raise AssertionError("the playbook ran")

    monkeypatch.setattr(runner, "run_playbook", no_run)
    assert main(["bench", "run", *argv]) == 2
    assert sentence in " ".join(capsys.readouterr().err.split())
