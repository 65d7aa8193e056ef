#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: GPU facts from nvidia-smi
description:
  - Runs C(nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap)
    and returns the host's GPUs under C(ansible_facts.nvidia_gpus) with count, name, memory, driver
    branch, compute capability and the GPU memory already in use.
  - Read-only; runs in check mode too.
options:
  nvidia_smi:
    description: The nvidia-smi command.
    type: path
    default: nvidia-smi
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  moefleet.serving.nvidia_gpu_facts:

- name: Show the GPU count
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpus.count }} x {{ ansible_facts.nvidia_gpus.name }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add.
  returned: always
  type: dict
  contains:
    nvidia_gpus:
      description:
        - C(count), C(name), C(uniform), C(memory_total_mib) (smallest), C(memory_used_mib_max),
          C(driver_version), C(driver_branch), C(compute_cap), and C(gpus) (one entry per GPU).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.gpu_facts import (
    QUERY_FIELDS,
    GpuFactsError,
    parse_gpu_csv,
    summarize,
)


def main():
    module = AnsibleModule(argument_spec={"nvidia_smi": {"type": "path", "default": "nvidia-smi"}},
                           supports_check_mode=True)
    smi = module.get_bin_path(module.params["nvidia_smi"])
    if not smi:
        module.fail_json(msg="nvidia-smi is not installed: install the NVIDIA driver (role nvidia_driver) first.")
    rc, out, err = module.run_command(
        [smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"],
        environ_update={"LC_ALL": "C"},
    )
    if rc != 0:
        module.fail_json(msg=f"nvidia-smi failed ({err.strip() or out.strip()}); is the driver loaded?", rc=rc)
    try:
        facts = summarize(parse_gpu_csv(out))
    except GpuFactsError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"nvidia_gpus": facts})


if __name__ == "__main__":
    main()
