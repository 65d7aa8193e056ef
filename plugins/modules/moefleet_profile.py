#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: moefleet_profile
short_description: Validate the profile catalog and resolve each host's profile, on the controller
description:
  - Merges the shipped catalog with the operator's additions, validates it against its JSON Schema
    and its cross-references (flag invariants, NCCL sets, fallbacks), and resolves the profile every
    host is to serve (C(-e profile=NAME) overrides the hosts' C(sglang_profile)).
  - Every problem is reported as a sentence (schema errors as C(path) colon message), before any host is touched.
  - Runs on the controller (C(hosts: localhost)); it changes nothing.
options:
  catalog:
    description: The shipped catalog (profiles/catalog.yml, parsed).
    type: dict
    required: true
  schema:
    description: The catalog's JSON Schema (schemas/profile_catalog.schema.json, parsed).
    type: dict
    required: true
  extra_profiles:
    description: Operator additions, a mapping of name to profile or a catalog-shaped mapping.
    type: raw
  requested:
    description: The profile given with C(-e profile=NAME); overrides every host's own.
    type: raw
  host_profiles:
    description: Each target host's C(sglang_profile) (or null), keyed by host name.
    type: dict
    default: {}
author: moefleet
"""

EXAMPLES = r"""
- name: Validate the catalog and resolve profiles
  moefleet_profile:
    catalog: "{{ lookup('file', 'profiles/catalog.yml') | from_yaml }}"
    schema: "{{ lookup('file', 'schemas/profile_catalog.schema.json') | from_json }}"
    requested: "{{ profile | default(omit) }}"
    host_profiles:
      gpu-node-01: tp2ep4
      gpu-node-02: null
"""

RETURN = r"""
catalog:
  description: The merged, validated catalog.
  returned: success
  type: dict
hosts:
  description: Per host, the resolved profile (its catalog entry) with its C(name).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.profiles import (
    ProfileError,
    extra_var_problem,
    merge_catalog,
    resolve_profile,
    validate_catalog,
)


def resolve(params):
    extra = params["extra_profiles"]
    if extra is not None:
        problem = extra_var_problem("moefleet_extra_profiles", extra, dict)
        if problem:
            raise ProfileError(problem)
    catalog = merge_catalog(params["catalog"], extra)
    validate_catalog(catalog, params["schema"])
    requested = params["requested"]
    if requested is not None:
        problem = extra_var_problem("profile", requested, str)
        if problem:
            raise ProfileError(problem)
    hosts = {}
    for host, own in sorted(params["host_profiles"].items()):
        name = requested if requested is not None else own
        if name is None:
            raise ProfileError(
                f"{host} has no profile: pass -e profile=NAME or set sglang_profile for it in inventory."
            )
        try:
            profile = resolve_profile(catalog, name)
        except ProfileError as exc:
            source = "-e profile" if requested is not None else f"sglang_profile of {host}"
            raise ProfileError(f"{source}: {exc}") from None
        profile["name"] = name
        hosts[host] = profile
    return catalog, hosts


def main():
    module = AnsibleModule(
        argument_spec={
            "catalog": {"type": "dict", "required": True},
            "schema": {"type": "dict", "required": True},
            "extra_profiles": {"type": "raw"},
            "requested": {"type": "raw"},
            "host_profiles": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    try:
        catalog, hosts = resolve(module.params)
    except ProfileError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, catalog=catalog, hosts=hosts)


if __name__ == "__main__":
    main()
