#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write a benchmark sweep's report and pick the best profile per objective
description:
  - Run on the controller (C(delegate_to) localhost) by C(playbooks/bench.yml) once every profile of the sweep
    was served and measured. Reads the JSON lines C(python -m sglang.bench_serving --output-file) wrote for each
    profile (fetched from the host), builds the report and writes, under O(dest), C(STEM.json), C(STEM.csv),
    C(STEM.md) (the summary table) and, when matplotlib is installed on the controller, C(STEM-throughput.png)
    and C(STEM-latency.png).
  - The recommendation names the profile with the highest output tok/s at concurrency 1 (single_stream), the
    highest output tok/s at any concurrency (throughput), and the highest output tok/s among the results within
    the SLO (slo, null when none is, or no bound is given). Failed profiles never win.
  - The logic is C(plugins/module_utils/bench_report.py); C(moefleet bench run) and the tests read the same files.
options:
  host:
    description: The host the sweep ran on.
    type: str
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  profiles:
    description:
      - The profiles in sweep order. Each has C(profile) (the name), C(status) (V(ok) or V(failed)), C(outcome)
        (the service role's readiness outcome), optional C(error) (why a served profile has no results),
        C(results_file) (a JSONL file on the controller; missing or empty for a failed profile) and any further
        keys (timings), which are kept in the report as they are.
    type: list
    elements: dict
    required: true
  dest:
    description:
      - Directory for the report files (made if missing), an absolute path.
      - A relative path is refused. Ansible runs a module on the controller in the playbook's directory, not in the
        working directory of C(ansible-playbook), so a relative path would land next to the playbook. Resolve it in
        the play instead, as C(playbooks/bench.yml) does with the filter C(ansible.builtin.realpath), which runs in
        the controller's own process and so in its working directory.
    type: path
    required: true
  stem:
    description: File name without extension; default C(bench-<UTC time>).
    type: str
  slo_p99_itl_ms:
    description: The SLO's bound on p99 inter-token latency, in ms; unset for none.
    type: float
  slo_p99_ttft_ms:
    description: The SLO's bound on p99 time to first token, in ms; unset for none.
    type: float
  plots:
    description: Draw the PNG plots (needs matplotlib on the controller; without it the report says so).
    type: bool
    default: true
  facts:
    description: Further keys for the report (workload, times), merged at its top level.
    type: dict
    default: {}
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the sweep's report on the controller
  moefleet.serving.bench_report:
    host: gpu-01
    model: kimi-k2.6
    profiles:
      - {profile: ep8, status: ok, outcome: {outcome: ready}, results_file: /tmp/bench/ep8.jsonl}
      - {profile: pp8, status: failed, outcome: {outcome: failed, state: oom, phase: weight_load}}
    dest: "{{ 'reports' | ansible.builtin.realpath }}"  # reports/ under the working directory
    slo_p99_itl_ms: 100
  delegate_to: localhost
  register: bench_written
"""

RETURN = r"""
report:
  description: The report as written to the JSON file (host, model, profiles with their results, slo,
    recommendation, recommendation_detail, and the keys of O(facts)).
  returned: success
  type: dict
recommendation:
  description: The profile per objective (single_stream, throughput, slo); null where no profile qualifies.
  returned: success
  type: dict
files:
  description: Paths written (json, csv, markdown, plots as a list) and plots_skipped (why no plots, or null).
  returned: success
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.bench_report import (
    BenchReportError,
    build_report,
    results_from_jsonl,
    write_report,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "profiles": {"type": "list", "elements": "dict", "required": True},
            "dest": {"type": "path", "required": True},
            "stem": {"type": "str"},
            "slo_p99_itl_ms": {"type": "float"},
            "slo_p99_ttft_ms": {"type": "float"},
            "plots": {"type": "bool", "default": True},
            "facts": {"type": "dict", "default": {}},
        },
        supports_check_mode=False,
    )
    p = module.params
    if not os.path.isabs(p["dest"]):
        module.fail_json(msg=f"dest is {p['dest']!r}, a relative path: this module runs in the playbook's directory "
                             "(Ansible runs modules on the controller there), not in the working directory of "
                             "ansible-playbook. Pass an absolute path, e.g. \"{{ dir | ansible.builtin.realpath }}\".")
    profiles = []
    for entry in p["profiles"]:
        entry = dict(entry)
        path = entry.pop("results_file", None)
        results = []
        if path and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    results = results_from_jsonl(handle.read())
            except OSError as exc:
                module.fail_json(msg=f"Cannot read the results of {entry.get('profile')} at {path}: {exc.strerror}.")
        if entry.get("status") == "ok" and not results:
            entry["status"] = "failed"
            entry["error"] = entry.get("error") or "served, but bench_serving wrote no result"
        entry["results"] = results
        profiles.append(entry)
    stem = p["stem"] or time.strftime("bench-%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        report = build_report(p["host"], p["model"], profiles, p["slo_p99_itl_ms"], p["slo_p99_ttft_ms"],
                              **p["facts"])
        files = write_report(report, p["dest"], stem, plots=p["plots"])
    except BenchReportError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"Cannot write the report under {p['dest']}: {exc.strerror or exc}.")
    module.exit_json(changed=True, report=report, recommendation=report["recommendation"], files=files)


if __name__ == "__main__":
    main()
