#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: maintenance
short_description: Say in node_exporter's textfile directory that a moefleet run works on the host
description:
  - Writes C(moefleet_maintenance.prom) (C(moefleet_maintenance_start_timestamp_seconds{reason}), the run's start
    with O(state=started), 0 with O(state=ended)) into node_exporter's textfile directory. The alert rules'
    C(MoefleetInMaintenance) reads it and Alertmanager's inhibition keeps the host's other alerts from paging
    while a deploy, rollout or remediation works on it (docs/monitoring.md).
  - A host without that directory (no node_metrics role ran there) is left alone; nothing scrapes it.
options:
  reason:
    description: What the run does on the host.
    type: str
    choices: [deploy, rollout, remediate]
    required: true
  state:
    description: C(started) when the run begins working on the host, C(ended) when it is done (also on failure).
    type: str
    choices: [started, ended]
    required: true
  textfile_dir:
    description: node_exporter's textfile directory (the node_metrics role's node_metrics_textfile_dir).
    type: path
    required: true
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Say that a deploy works on the host
  moefleet.serving.maintenance:
    reason: deploy
    state: started
    textfile_dir: /var/lib/prometheus/node-exporter
"""

RETURN = r"""
path:
  description: The file written, or null when the directory does not exist.
  returned: always
  type: str
"""

import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils import fleet_metrics


def main() -> None:
    module = AnsibleModule(argument_spec={
        "reason": {"type": "str", "required": True, "choices": list(fleet_metrics.MAINTENANCE_REASONS)},
        "state": {"type": "str", "required": True, "choices": ["started", "ended"]},
        "textfile_dir": {"type": "path", "required": True},
    }, supports_check_mode=True)
    directory = module.params["textfile_dir"]
    if not os.path.isdir(directory):
        module.exit_json(changed=False, path=None, msg=f"{directory} does not exist: no node_exporter reads it")
    path = os.path.join(directory, fleet_metrics.MAINTENANCE_FILE)
    started = time.time() if module.params["state"] == "started" else 0
    if module.check_mode:
        module.exit_json(changed=True, path=path)
    # a rename, so node_exporter never reads half a file (it reads *.prom only)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".moefleet_maintenance.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(fleet_metrics.maintenance_text(module.params["reason"], started))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    module.exit_json(changed=True, path=path)


if __name__ == "__main__":
    main()
