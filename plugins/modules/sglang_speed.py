#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

"""Ansible module: a short benchmark of the SGLang server that serves now (an upgrade's before and after)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_speed
short_description: Measure the time to first token and the output throughput of the SGLang server that serves now
description:
  - Asks the server its release (C(/server_info)'s C(version)), then, O(runs) times in a row, sends the first 4 prompts
    alone one after the other (the median time to first token) and then O(prompts) streamed C(/generate) requests of
    O(input_tokens) prompt tokens and O(output_tokens) generated tokens each, O(concurrency) at a time (the output
    throughput); each run's figures come back in RV(runs).
  - The prompts are the same token ids on every run and every release (a fixed seed), greedy, C(ignore_eos).
  - With O(unless_release), a server that already runs that release is not measured (RV(measured) false), so that an
    upgrade measures the release it replaces only.
  - The judgement (is the new release slower?) is C(plugins/module_utils/release_compare.py)'s, through the filter
    C(moefleet.serving.release_compare).
version_added: "0.3.0"
author: moefleet maintainers (!UNKNOWN)
options:
  url:
    description: The server's base URL.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: The server's API key, sent as a bearer token.
    type: str
  prompts:
    description: Requests per run.
    type: int
    default: 16
  concurrency:
    description: Requests in flight at once.
    type: int
    default: 4
  input_tokens:
    description: Prompt tokens of each request.
    type: int
    default: 512
  output_tokens:
    description: Tokens each request generates.
    type: int
    default: 128
  runs:
    description: Runs in a row; the best is the figure, the second best measures the run-to-run noise.
    type: int
    default: 3
  unless_release:
    description: Measure nothing when the server already runs this release (its public version, e.g. C(0.5.23)).
    type: str
  timeout:
    description: Seconds one request may take.
    type: int
    default: 600
notes:
  - Check mode sends nothing.
"""

EXAMPLES = r"""
- name: Measure the release that serves before the upgrade replaces it
  moefleet.serving.sglang_speed:
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_service_api_key }}"
    unless_release: "0.5.23"
  register: before
"""

RETURN = r"""
release:
  description: The release the server reports (C(/server_info) C(version), without a local label), or null.
  returned: always
  type: str
measured:
  description: Whether the runs were made (false in check mode, or when the server runs O(unless_release)).
  returned: always
  type: bool
runs:
  description: >-
    Each run with C(requests) (the probes alone included), C(failed), C(wall_s) (of the concurrent part), and when
    requests completed C(ttft_ms) (the median of the probes) and C(output_tok_s); C(error) is the first failed
    request's.
  returned: always
  type: list
  elements: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.release_compare import prompt_ids, run_once

ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "prompts": {"type": "int", "default": 16},
    "concurrency": {"type": "int", "default": 4},
    "input_tokens": {"type": "int", "default": 512, "no_log": False},  # a count of tokens, not a token
    "output_tokens": {"type": "int", "default": 128, "no_log": False},
    "runs": {"type": "int", "default": 3},
    "unless_release": {"type": "str"},
    "timeout": {"type": "int", "default": 600},
}


def server_release(url: str, api_key: str | None, timeout: float) -> str | None:
    """The release the server says it runs; None when it does not answer."""
    from ansible.module_utils.urls import open_url  # noqa: PLC0415

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for path in ("/server_info", "/get_server_info"):  # 0.5.x has both; older releases the second only
        try:
            with open_url(url.rstrip("/") + path, headers=headers, timeout=timeout) as response:
                version = json.loads(response.read()).get("version")
        except Exception:  # noqa: BLE001,S112  (not answering here: try the other path, else unknown)
            continue
        if version:
            return str(version).split("+", 1)[0]
    return None


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    for name in ("prompts", "concurrency", "input_tokens", "output_tokens", "runs", "timeout"):
        if p[name] < 1:
            module.fail_json(msg=f"{name} is {p[name]}; give a whole number of 1 or more.", release=None,
                             measured=False, runs=[])
    if module.check_mode:
        module.exit_json(changed=False, release=None, measured=False, runs=[], msg="Check mode: nothing was sent.")
    release = server_release(p["url"], p["api_key"], min(30, p["timeout"]))
    if p["unless_release"] and release == p["unless_release"].split("+", 1)[0]:
        module.exit_json(changed=False, release=release, measured=False, runs=[])
    prompts = prompt_ids(p["prompts"], p["input_tokens"])
    runs = [run_once(p["url"], p["api_key"], prompts, p["output_tokens"], p["concurrency"], p["timeout"])
            for _ in range(p["runs"])]
    module.exit_json(changed=False, release=release, measured=True, runs=runs)


if __name__ == "__main__":
    main()
