"""Each command's --help states the exit statuses the command returns, and the command returns them; output piped
into a reader that stops early (`moefleet plan ... | head -1`, `moefleet status | head -1`) ends without a
BrokenPipeError traceback, the command carrying on to its own exit status."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moefleet import cli
from moefleet.commands import bench, deploy, diagnose, history, p2p_check, plan, rollout, status

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "sim" / "model" / "kimi_k26_config.json"


def help_text(*command: str, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def exit_codes(module) -> set[int]:
    return {value for name, value in vars(module).items() if name.startswith("EXIT_") and isinstance(value, int)}


# (command, the module whose EXIT_* constants it returns, what --help says of each)
HELP = [
    (["plan"], plan, {0: "Exit 0 when every planned layout fits or is tight", 1: "1 when one does not",
                      2: "2 on bad input"}),
    (["diagnose"], diagnose, {0: "0 the log shows a ready server", 1: "1 it shows a failure",
                              2: "2 the input cannot be read as a log"}),
    (["rollout"], rollout, {0: "0 when every host serves the asked profile", 1: "1 when the run stopped",
                            2: "2 on bad input", 3: "3 with --check when a host could not be reached",
                            130: "130 on Ctrl-C"}),
    (["upgrade"], rollout, {0: "0 when every host serves the asked profile", 1: "1 when the run stopped",
                            2: "2 on bad input", 3: "3 with --check when a host could not be reached",
                            130: "130 on Ctrl-C"}),
    (["deploy"], rollout, {0: "0 when every host serves the asked profile", 1: "1 when the run stopped",
                           2: "2 on bad input", 3: "3 with --check when a host could not be reached",
                           130: "130 on Ctrl-C"}),
    (["status"], status, {0: "0 only when every host serves what it was asked", 1: "1 when a host drifted",
                          2: "2 on input errors", 3: "3 when a host was unreachable"}),
    (["history"], history, {0: "0 when the host has moefleet facts", 1: "1 when it has none",
                            2: "2 on input errors", 3: "3 when HOST is unreachable or its facts cannot be read"}),
    (["bench", "run"], bench, {0: "Exit 0 report written and the host serves again", 1: "1 otherwise",
                               2: "2 bad input", 130: "130 Ctrl-C"}),
    (["p2p-check"], p2p_check, {0: "0 P2P is fine (pcie_p2p)", 1: "1 shared memory is advised (pcie_shm)",
                                2: "2 an input cannot be read", 3: "3 the evidence decides nothing"}),
]


@pytest.mark.parametrize(("command", "module", "said"), HELP, ids=[" ".join(c) for c, _, _ in HELP])
def test_help_states_every_exit_status_the_command_returns(command, module, said, capsys):
    text = help_text(*command, capsys=capsys)
    assert set(said) == exit_codes(module) - ({3} if module is bench else set())
    for phrase in said.values():
        assert phrase in text, phrase


def test_deploy_returns_rollouts_statuses():
    assert exit_codes(deploy) == set() and deploy.rollout is rollout  # deploy.run is rollout.execute


def test_bench_parse_help_states_its_statuses(capsys):
    text = help_text("bench", capsys=capsys)
    assert "Exit codes (parse): 0 every file held at least one result; 2 a file held none or could not be read" in text


def test_no_command_prints_usage_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: moefleet" in capsys.readouterr().out
    assert "a usage error exits 2" in help_text(capsys=capsys)


def test_a_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["status", "--no-such-option"])
    assert done.value.code == 2


def test_without_the_collection_every_command_exits_2_with_a_sentence(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(tmp_path), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_HOME=str(tmp_path / "home"))
    script = ("import sys; sys.path = [p for p in sys.path if not p.endswith('.ansible/collections')]; "
              "from moefleet.cli import main; sys.exit(main(['status']))")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("moefleet: the collection moefleet.serving is not installed")
    assert "Traceback" not in done.stderr


# --- output into a pipe whose reader stops early ---------------------------------------------------------------


def piped(script: str, tmp_path: Path, lines: int = 1) -> tuple[int, str, str]:
    """Run a Python script into `head -N` (bash, pipefail): the script's exit status, what head printed, and the
    script's stderr."""
    (tmp_path / "run.py").write_text(textwrap.dedent(script))
    shell = f"set -o pipefail; {sys.executable} run.py 2>err.txt | head -{lines}"
    done = subprocess.run(["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, (tmp_path / "err.txt").read_text()


def test_plan_into_head_ends_quietly_with_its_own_status(tmp_path):
    code, out, err = piped(f"""
        import sys
        from moefleet.cli import main
        sys.exit(main(["plan", "--model-config", {str(MODEL)!r}, "--gpu", "RTX PRO 6000"]))
    """, tmp_path)
    assert out.startswith("8 GPUs x RTX PRO 6000")
    assert (code, err) == (0, "")


def test_plan_json_larger_than_the_pipe_into_head(tmp_path):
    code, out, err = piped(f"""
        import sys
        from moefleet.cli import main
        for _ in range(30):  # well over the pipe's 64 KiB: the write itself meets the closed pipe
            code = main(["plan", "--model-config", {str(MODEL)!r}, "--gpu", "H100", "--json"])
        sys.exit(code)
    """, tmp_path)
    assert out == "[\n"
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert code == 1  # the plan's own status: on an H100 80GB no catalog layout fits K2.6


STATUS = """
    import json, sys
    from pathlib import Path
    from moefleet import runner
    from moefleet.cli import main

    HOST = {{"host": "gpu-0", "reachable": True, "serving_profile": "ep8", "asked_profile": "ep8",
            "outcome": "ready", "state": "ready", "health": "serving", "unit": "active", "last_rollback": None}}

    def fake(name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None):
        hosts = [dict(HOST, host=f"gpu-{{i}}") for i in range({count})]
        Path(extravars["moefleet_status_path"]).write_text(json.dumps({{"hosts": hosts}}))
        return runner.RunResult("successful", 0)

    runner.run_playbook = fake
    Path("hosts.yml").write_text("all: {{}}\\n")
    sys.exit(main(["status", "-i", "hosts.yml"{json}]))
"""


@pytest.mark.parametrize("count", [3, 5000])
@pytest.mark.parametrize("json_flag", ["", ', "--json"'])
def test_status_into_head_ends_quietly_with_its_own_status(count, json_flag, tmp_path):
    code, out, err = piped(STATUS.format(count=count, json=json_flag), tmp_path)
    assert out.split() == (["{"] if json_flag else ["host", "serving", "asked", "outcome", "health", "last",
                                                     "rollback", "while", "serving"])
    assert (code, err) == (0, "")


ROLLOUT = """
    import json, sys
    from pathlib import Path
    from moefleet import runner
    from moefleet.cli import main

    def fake(name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None, skip_tags=None):
        for i in range(3000):  # progress lines, far more than the pipe holds: the run goes on to its end
            on_event({"event": "runner_on_ok", "event_data": {"host": f"gpu-{i}", "res": {"ansible_facts": {
                "sglang_service_outcome": {"outcome": "ready", "serving_profile": "ep8"}}}}})
        base = Path(extravars["moefleet_report_path"])
        base.with_name(base.name + ".json").write_text(json.dumps({"result": "complete", "hosts": []}))
        base.with_name(base.name + ".md").write_text("# Rollout report\\n")
        Path("finished").write_text("yes")
        return runner.RunResult("successful", 0)

    runner.run_playbook = fake
    Path("hosts.yml").write_text("all: {}\\n")
    sys.exit(main(["rollout", "-i", "hosts.yml", "-e", "profile=ep8", "--yes", "--report", "r"]))
"""


def test_a_rollout_into_head_runs_to_its_end_and_writes_its_report(tmp_path):
    code, out, err = piped(ROLLOUT, tmp_path)
    assert re.fullmatch(r"\d\d:\d\d:\d\d  gpu-0 +ready: serving ep8\n", out)
    assert (code, err) == (0, "")
    assert (tmp_path / "finished").exists() and (tmp_path / "r.json").exists()
