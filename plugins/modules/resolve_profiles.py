#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: resolve_profiles
short_description: Validate the profile catalog and resolve each host's profile, on the controller
description:
  - Merges the shipped catalog with the operator's additions, validates it against its JSON Schema
    and its cross-references (flag invariants, NCCL sets, fallbacks), and resolves the profile every
    host is to serve (C(-e profile=NAME) overrides the hosts' C(sglang_profile)).
  - Checks the rules between each host's inputs that the roles' argument specs cannot state and the roles would
    otherwise meet only on the host, after installing the driver, CUDA, SGLang and the model; safe profile names,
    bounds of every numeric flag, the GPUs each profile on the host's fallback ladder starts against
    C(nvidia_driver_expected_gpu_count), the port's range, the extra SGLang flags and the model source. Types,
    booleans and choices are the argument specs' (C(ansible.builtin.validate_argument_spec) in playbooks/validate.yml).
  - Every problem is reported as a sentence (schema errors as C(path) colon message, after the file and
    line it was written at), before any host is touched.
  - "Runs on the controller (C(hosts: localhost)); it changes nothing."
options:
  catalog_path:
    description: The shipped catalog file (profiles/catalog.yml) on the controller; read here, so errors name its lines.
    type: path
    required: true
  schema:
    description: The catalog's JSON Schema (schemas/profile_catalog.schema.json, parsed).
    type: dict
    required: true
  extra_profiles:
    description: Operator additions, a mapping of name to profile or a catalog-shaped mapping.
    type: raw
  extra_profiles_origins:
    description:
      - Where each path of O(extra_profiles) was written (C(FILE, line N)), from the
        P(moefleet.serving.origins#filter) filter.
    type: dict
    default: {}
  requested:
    description: The profile given with C(-e profile=NAME); overrides every host's own.
    type: raw
  host_profiles:
    description: Each target host's C(sglang_profile) (null or empty when it sets none), keyed by host name.
    type: dict
    default: {}
  host_inputs:
    description:
      - Per host, the variables it defines that the checks read (inventory and C(-e)), from the
        P(moefleet.serving.host_inputs#filter) filter; the HF token only as C(sglang_model_hf_token_set).
    type: dict
    default: {}
  role_defaults:
    description: The roles' defaults for those variables, laid under each host's inputs.
    type: dict
    default: {}
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Validate the catalog and resolve profiles
  moefleet.serving.resolve_profiles:
    catalog_path: profiles/catalog.yml
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.profiles import (
    ProfileError,
    catalog_origins,
    extra_var_problem,
    host_problems,
    load_yaml_lines,
    merge_catalog,
    resolve_profile,
    validate_catalog,
)


def read_catalog(path):
    """The shipped catalog and the line each of its paths was written at."""
    source = os.path.normpath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ProfileError(f"The profile catalog {source} cannot be read ({exc.strerror}); restore it.") from None
    return load_yaml_lines(text, source)


def resolve(params):
    extra = params["extra_profiles"]
    if extra is not None:
        problem = extra_var_problem("moefleet_extra_profiles", extra, dict)
        if problem:
            raise ProfileError(problem)
    shipped, shipped_origins = read_catalog(params["catalog_path"])
    catalog = merge_catalog(shipped, extra)
    origins = catalog_origins(shipped_origins, extra, params["extra_profiles_origins"])
    validate_catalog(catalog, params["schema"], origins)
    requested = params["requested"]
    if requested is not None:
        problem = extra_var_problem("profile", requested, str)
        if problem:
            raise ProfileError(problem)
    hosts = {}
    for host, own in sorted(params["host_profiles"].items()):
        name = requested if requested is not None else (own or None)
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
    problems = []
    for host, profile in hosts.items():
        inputs = {**params["role_defaults"], **(params["host_inputs"].get(host) or {})}
        problems += host_problems(host, inputs, catalog, profile["name"])
    if problems:
        raise ProfileError("\n".join(problems))
    return catalog, hosts


def main():
    module = AnsibleModule(
        argument_spec={
            "catalog_path": {"type": "path", "required": True},
            "schema": {"type": "dict", "required": True},
            "extra_profiles": {"type": "raw"},
            "extra_profiles_origins": {"type": "dict", "default": {}},
            "requested": {"type": "raw"},
            "host_profiles": {"type": "dict", "default": {}},
            "host_inputs": {"type": "dict", "default": {}},
            "role_defaults": {"type": "dict", "default": {}},
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
