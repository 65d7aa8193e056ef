#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

"""Ansible module: check what a client of an SGLang server gets (the correctness gate)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_answers
short_description: Check that an SGLang server answers correctly, not only that it is up
description:
  - Sends a few small chat requests to a server that is ready and judges the answers, in order; the first failure
    fails the module with the check's name and the bad answer quoted.
  - C(thinking) (with O(reasoning)) a thinking-mode answer has content and reasoning_content, apart;
    C(instant) an answer with thinking off has content and no reasoning; C(tool_call) (with O(tool_calls)) a
    tool with a hyphenated name comes back as a parsed tool call with JSON arguments; C(known_answer) 17 + 25 is 42.
  - Every answer is searched for garbage, runs of C(!) (NaN logits), replacement characters, a word repeated on and
    on, and raw special tokens in content (a parser that did not apply).
  - The checks and their judgement are in C(plugins/module_utils/answer_check.py).
version_added: "0.2.0"
author: moefleet maintainers (!UNKNOWN)
options:
  url:
    description: The server's base URL.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: The server's API key, sent as a bearer token.
    type: str
  model:
    description: The served model name (the requests' C(model)).
    type: str
    required: true
  reasoning:
    description:
      - Whether the server runs a reasoning parser (checks C(thinking); C(instant) is sent with thinking off).
    type: bool
    default: false
  tool_calls:
    description: Whether the server runs a tool-call parser (checks C(tool_call)).
    type: bool
    default: false
  timeout:
    description: Seconds one request may take.
    type: int
    default: 120
notes:
  - Check mode sends nothing.
"""

EXAMPLES = r"""
- name: Check what clients get
  moefleet.serving.sglang_answers:
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_service_api_key }}"
    model: kimi-k2.6
    reasoning: true
    tool_calls: true
"""

RETURN = r"""
passed:
  description: Whether every check passed.
  returned: always
  type: bool
checks:
  description: Each check run, in order, with C(name), C(passed), C(problem) and C(seconds).
  returned: always
  type: list
  elements: dict
failed_check:
  description: The name of the check that failed.
  returned: always
  type: str
evidence:
  description: Why it failed, with the answer quoted.
  returned: always
  type: str
elapsed:
  description: Seconds all checks took.
  returned: when a check ran
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.answer_check import run

ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "model": {"type": "str", "required": True},
    "reasoning": {"type": "bool", "default": False},
    "tool_calls": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 120},
}


def main() -> None:
    run(AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True))


if __name__ == "__main__":
    main()
