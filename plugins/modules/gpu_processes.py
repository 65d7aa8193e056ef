#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_processes
short_description: Find, and clean, processes holding GPU memory outside a service
description:
  - Lists the processes that hold GPU memory (C(nvidia-smi --query-compute-apps)) and sorts them into
    those of the unit, the service user's leftovers outside the unit (an earlier crashed start's orphans,
    a documented cause of the next OOM), and anyone else's.
  - With O(kill_leftovers), the service user's leftovers are killed with SIGKILL (they ignore SIGTERM)
    and the module waits until their memory is free. Anyone else's processes are only reported.
options:
  unit:
    description: The service's systemd unit; its own processes are left alone.
    type: str
    default: sglang.service
  service_user:
    description: The service's user, whose processes outside the unit count as leftovers.
    type: str
    required: true
  kill_leftovers:
    description: Kill the service user's leftovers.
    type: bool
    default: true
  include_unit:
    description: Count the unit's own processes as leftovers too (after the unit was stopped).
    type: bool
    default: false
  timeout:
    description: Seconds to wait for killed processes to go.
    type: int
    default: 15
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Clean the service user's leftovers; report anyone else's
  moefleet.serving.gpu_processes:
    service_user: sglang
  register: __gpu_processes
"""

RETURN = r"""
processes:
  description:
    - Every process holding GPU memory, with pid, process_name, used_memory_mib (summed over GPUs),
      user, in_unit.
  returned: always
  type: list
killed:
  description: PIDs of the service user's leftovers that were killed.
  returned: always
  type: list
foreign:
  description: Processes of other users holding GPU memory, with pid, user, process_name, used_memory_mib.
  returned: always
  type: list
"""

import os
import pwd
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.gpu_facts import (
    COMPUTE_APPS_FIELDS,
    GpuFactsError,
    parse_compute_apps,
)


def owner(pid):
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            uid = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
        return pwd.getpwuid(uid).pw_name
    except (OSError, StopIteration, KeyError):
        return None


def in_unit(pid, unit):
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return any(line.rstrip().endswith(f"/{unit}") or f"/{unit}/" in line for line in handle)
    except OSError:
        return False


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "sglang.service"},
            "service_user": {"type": "str", "required": True},
            "kill_leftovers": {"type": "bool", "default": True},
            "include_unit": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 15},
        },
        supports_check_mode=True,
    )
    p = module.params
    smi = module.get_bin_path("nvidia-smi")
    if not smi:
        if module.check_mode:  # a bare host in check mode: the driver would be installed by this run
            module.exit_json(changed=False, processes=[], killed=[], foreign=[],
                             msg="nvidia-smi is not installed yet; nothing holds GPU memory.")
        module.fail_json(msg="nvidia-smi is not installed: install the NVIDIA driver (role nvidia_driver) first.")
    rc, out, err = module.run_command(
        [smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), "--format=csv,noheader,nounits"],
        environ_update={"LC_ALL": "C"},
    )
    if rc != 0:
        module.fail_json(msg=f"nvidia-smi could not list compute processes: {err.strip() or out.strip()}")
    try:
        rows = parse_compute_apps(out)
    except GpuFactsError as exc:
        module.fail_json(msg=str(exc))
    by_pid = {}
    for row in rows:
        entry = by_pid.setdefault(row["pid"], {"pid": row["pid"], "process_name": row["process_name"],
                                               "used_memory_mib": 0, "user": owner(row["pid"]),
                                               "in_unit": in_unit(row["pid"], p["unit"])})
        entry["used_memory_mib"] += row["used_memory_mib"]
    processes = sorted(by_pid.values(), key=lambda e: e["pid"])
    outside = [e for e in processes if p["include_unit"] or not e["in_unit"]]
    leftovers = [e["pid"] for e in outside if e["user"] == p["service_user"]]
    foreign = [e for e in outside if e["user"] != p["service_user"]]
    killed = []
    if leftovers and p["kill_leftovers"] and not module.check_mode:
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + p["timeout"]
        while any(alive(pid) for pid in killed):
            if time.monotonic() > deadline:
                module.fail_json(msg=f"Leftover processes {killed} of {p['service_user']} did not exit after "
                                     "SIGKILL (stuck in the driver?); a reboot may be needed.", processes=processes)
            time.sleep(0.1)
    module.exit_json(changed=bool(killed) or (bool(leftovers) and p["kill_leftovers"] and module.check_mode),
                     processes=processes, killed=killed, foreign=foreign)


if __name__ == "__main__":
    main()
