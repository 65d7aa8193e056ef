"""The lab's sim_faults as the simulator receives them (inventory/sim/group_vars/all.yml): the profile becomes
flags, and every other key of the fault reaches SGLANG_SIM_FAULTS."""

from __future__ import annotations

import json
from pathlib import Path

from playbook import ROOT, run_playbook

GROUP_VARS = ROOT / "inventory" / "sim" / "group_vars" / "all.yml"


def rendered(tmp_path: Path, sim_faults: list[dict]) -> list[dict]:
    out = tmp_path / "faults.json"
    playbook = tmp_path / "render.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}", "lab_repo_root": str(ROOT)},
        "vars_files": [str(GROUP_VARS)],
        "tasks": [{"name": "Write what the simulator receives",
                   "ansible.builtin.copy": {"content": "{{ sglang_service_extra_env.SGLANG_SIM_FAULTS }}",
                                            "dest": str(out), "mode": "0644"}}],
    }]))
    done = run_playbook("localhost,", str(playbook), json.dumps({"sim_faults": sim_faults}), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_every_key_of_a_fault_reaches_the_simulator(tmp_path):
    faults = rendered(tmp_path, [
        {"fault": "oom_runtime", "after_requests": 2},
        {"fault": "stale_gpu_process", "profile": "tp8", "gpus": [0, 3], "mib": 1024},
        {"fault": "hang", "profile": "ep8", "flags": {"cuda_graph_max_bs": 8}, "env": {"NCCL_DEBUG": "INFO"}},
    ])
    runtime, stale, hang = faults
    assert runtime == {"fault": "oom_runtime", "after_requests": 2}
    assert (stale["gpus"], stale["mib"], stale["flags"]["tp_size"]) == ([0, 3], 1024, 8)
    assert "profile" not in stale
    assert (hang["flags"]["ep_size"], hang["flags"]["cuda_graph_max_bs"]) == (8, 8)
    assert hang["env"] == {"NCCL_P2P_DISABLE": None, "NCCL_DEBUG": "INFO"}
