#!/usr/bin/python
"""Ansible module: wait for an SGLang server to be ready, or say within a second why it will not be."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_readiness
short_description: Wait until an SGLang server serves, or report its OOM, crash or hang within a second
description:
  - Follows the log of the current start of an SGLang server and polls its HTTP endpoints, in the shape
    of M(ansible.builtin.wait_for).
  - The log is the systemd unit's journal for its current invocation only (C(InvocationID)), so lines
    of earlier starts never count; or a plain file given as O(log_path), read from its beginning.
  - Each log line goes through the classifier in C(plugins/module_utils/sglang_log.py), the same one
    C(moefleet diagnose) uses. The module returns within about one second of the line that decides
    the start (an OOM, a crash's exception line, the unit dying), not at the timeout.
  - HTTP is polled in order C(/health_generate), C(/v1/models), C(/server_info) (C(/get_server_info) on
    old builds); the server is ready when all three answer and the server arguments it reports equal
    O(expected_args).
  - An OOM is reported with its phase (C(weight_load), C(kv_cache), C(cuda_graph), C(runtime)), the GPU,
    the MiB it tried to allocate, the MiB free and the GPU's capacity, and one sentence of advice that
    follows the phase. A weight-load OOM is not fixed by a higher C(--mem-fraction-static); a KV-pool
    OOM is.
  - The unit dying (C(systemctl show) says failed, inactive, auto-restart, or a new invocation) ends the
    wait at once, whatever the exit code says (some SGLang versions exit 0 after a failure).
version_added: "0.1.0"
author: moefleet maintainers (!UNKNOWN)
options:
  unit:
    description:
      - The systemd unit that runs the server. Its journal for the current invocation is followed, and
        its state is watched.
      - Defaults to C(sglang.service) when O(log_path) is not given. With O(log_path) and no O(unit),
        no unit is watched.
    type: str
  log_path:
    description:
      - Follow this file from its beginning instead of the unit's journal. The file may appear later.
    type: path
  url:
    description: Base URL of the server.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: The server's C(--api-key), sent as a bearer token.
    type: str
  expected_args:
    description:
      - Server arguments the unit was started with, compared with what C(/server_info) reports, for
        example C(tp_size), C(ep_size), C(pp_size), C(dp_size), C(enable_dp_attention), C(model_path),
        C(served_model_name). A difference fails the task and names each argument.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds to wait in all for the server to be ready.
      - A cold start of a ~600 GB model takes many minutes.
    type: int
    default: 2700
  hang_timeout:
    description:
      - Seconds without a new log line after which the start is reported C(hung) in the phase it
        stopped in. HTTP access-log lines (our own polls) do not count as progress.
    type: int
    default: 600
  sleep:
    description: Seconds between HTTP polls.
    type: float
    default: 1.0
  delay:
    description: Seconds to wait before starting to look. Lines logged meanwhile are still read.
    type: int
    default: 0
  http_timeout:
    description: Seconds one HTTP request may take; C(/health_generate) runs a one-token generation.
    type: int
    default: 25
  msg:
    description: Message to fail with instead of the generated one. The details are returned either way.
    type: str
notes:
  - The journal is followed with a C(journalctl --follow) child read through C(select), not with
    C(run_command), because C(run_command) waits for its command to end and a follow never ends.
  - Check mode returns at once without waiting, with C(skipped=true) and C(changed=false).
requirements:
  - systemd (C(systemctl), C(journalctl)) on the host when a unit is followed.
seealso:
  - module: ansible.builtin.wait_for
  - module: ansible.builtin.uri
"""

EXAMPLES = r"""
- name: Wait for SGLang to serve the profile it was started with
  moefleet.serving.sglang_readiness:
    unit: sglang.service
    expected_args:
      tp_size: 8
      ep_size: 4
      served_model_name: kimi-k2.6
    timeout: 2700
    hang_timeout: 600
  register: __sglang_service_readiness

- name: Follow a log file instead of the journal (no unit watched)
  moefleet.serving.sglang_readiness:
    log_path: /var/log/sglang/server.log
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_service_api_key }}"
    timeout: 600

- name: Restart, then keep the start's outcome whatever it is (a failed start is a result to act on)
  block:
    - name: Restart the server
      ansible.builtin.systemd_service:
        name: sglang.service
        state: restarted
    - name: Wait for readiness
      moefleet.serving.sglang_readiness:
        unit: sglang.service
      register: readiness
      failed_when: false
    - name: Keep the outcome
      ansible.builtin.set_fact:
        start_outcomes: "{{ start_outcomes | default([]) + [readiness.outcome] }}"
"""

RETURN = r"""
elapsed:
  description: Seconds from the start of the wait to the decision.
  returned: always
  type: float
  sample: 312.4
state:
  description: >-
    C(ready), C(oom), C(crashed), C(hung), C(starting) (timed out while starting), C(mismatch) (serving,
    but with other arguments than O(expected_args)) or C(unknown) (check mode, argument errors).
  returned: always
  type: str
  sample: oom
phase:
  description: >-
    For an OOM its phase (weight_load, kv_cache, cuda_graph, runtime); otherwise the start-up phase
    reached (launch, nccl_init, weight_load, kv_cache, cuda_graph, warmup).
  returned: always
  type: str
  sample: weight_load
oom:
  description: The OOM's details, or null.
  returned: always
  type: dict
  sample: {"phase": "weight_load", "gpu": 2, "tried_to_allocate_mib": 672.0, "free_mib": 136.94,
           "capacity_gib": 94.97, "rank": "TP2"}
cause:
  description: >-
    For a crash, C(nccl), C(port_in_use), C(bad_weights), C(unsupported_arch), C(driver), C(gpu_unavailable)
    (CUDA or NVML cannot use the host's GPUs: device nodes, driver not loaded or mismatched, a lost GPU; the
    advice names which), C(gpu_fault) (a GPU failed running a kernel) or C(other); else null.
  returned: always
  type: str
  sample: nccl
line:
  description: The log line that decided, or the unit's state when its death decided.
  returned: always
  type: str
advice:
  description: One sentence on what to change, following the OOM phase, crash cause or hang phase.
  returned: always
  type: str
outcome:
  description: >-
    The start's outcome as one record, the keys RV(state), RV(phase), RV(cause), RV(oom) and RV(advice) of this
    result: what the sglang_service role appends to the host's attempts and keeps in its history.
  returned: always
  type: dict
  sample: {"state": "oom", "phase": "kv_cache", "cause": null, "oom": null,
           "advice": "Raise --mem-fraction-static or pick a layout with fewer weights per GPU."}
log_excerpt:
  description: The last 40 lines of the log of this start.
  returned: always
  type: list
  elements: str
unit_state:
  description: The unit's ActiveState, SubState, Result and ExecMainStatus at the end (empty without a unit).
  returned: always
  type: dict
invocation_id:
  description: The unit invocation that was followed.
  returned: when a unit is followed
  type: str
server_info:
  description: The arguments checked against O(expected_args), as the server reported them.
  returned: when ready or when they differ
  type: dict
mismatches:
  description: Each expected argument that differs, with what was expected and what the server reports.
  returned: always
  type: list
  elements: dict
"""

# Imports follow DOCUMENTATION/EXAMPLES/RETURN, as Ansible's module layout requires. The work is in
# plugins/module_utils/readiness.py (log sources, HTTP probe, wait loop); this file is the entry point.
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.readiness import run

# The options DOCUMENTATION describes.
ARGUMENT_SPEC = {
    "unit": {"type": "str"},
    "log_path": {"type": "path"},
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "expected_args": {"type": "dict", "default": {}},
    "timeout": {"type": "int", "default": 2700},
    "hang_timeout": {"type": "int", "default": 600},
    "sleep": {"type": "float", "default": 1.0},
    "delay": {"type": "int", "default": 0},
    "http_timeout": {"type": "int", "default": 25},
    "msg": {"type": "str"},
}


def main() -> None:
    run(AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True))


if __name__ == "__main__":
    main()
