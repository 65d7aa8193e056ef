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
  - Sends a few small chat requests to a server that is ready and judges the answers, in order; the first wrong
    answer fails the module with the check's name and the bad answer quoted.
  - C(thinking) (with O(reasoning)) a thinking-mode answer has content and reasoning_content, apart;
    C(instant) an answer with thinking off has content and no reasoning; C(tool_call) (with O(tool_calls)) a
    tool with a hyphenated name comes back as a parsed tool call with JSON arguments; C(known_answer) 17 + 25 is 42.
  - Every answer is searched for garbage, runs of C(!) (NaN logits), replacement characters, a word repeated on and
    on, and raw special tokens in content (a parser that did not apply).
  - Each request samples as O(sampling) says for its mode; without it the server's sampling defaults apply.
  - An answer the token budget cut (C(finish_reason) C(length)) before it held what the check looks for is asked
    once more with twice the budget; cut again, or unanswered within O(timeout), the check is inconclusive (listed
    in RV(inconclusive), a warning) and the module still passes.
  - A request the server never answers because it went away (connection refused, reset or closed without a
    response) fails the module with RV(server_gone) true and no judgement of the answers; the server's log says why.
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
  sampling:
    description:
      - The sampling fields of each mode's requests, C(thinking) (the C(thinking) check) and C(instant) (the others),
        each a dict of C(temperature), C(top_p), C(top_k), C(min_p); the served model's entry in the role's
        C(sglang_service_models) gives them. A mode without fields gets the server's sampling defaults.
    type: dict
    default: {}
  timeout:
    description: Seconds one check may take, its retry included (the wall-time cap of each check).
    type: int
    default: 600
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
    sampling:
      thinking: {temperature: 1.0, top_p: 0.95}
      instant: {temperature: 0.6, top_p: 0.95}
    timeout: 600
"""

RETURN = r"""
passed:
  description: Whether every check passed.
  returned: always
  type: bool
checks:
  description: >-
    Each check run, in order, with C(name), C(state) (C(passed), C(wrong_output), C(inconclusive), or C(unanswered)
    when the server went away), C(passed), C(problem), C(max_tokens) (the last budget asked), C(tries) and
    C(seconds).
  returned: always
  type: list
  elements: dict
failed_check:
  description: The name of the check that failed, or during which the server went away.
  returned: always
  type: str
evidence:
  description: Why it failed, with the answer quoted.
  returned: always
  type: str
inconclusive:
  description: The checks that were inconclusive (cut by the budget twice, or unanswered within O(timeout)).
  returned: always
  type: list
  elements: str
server_gone:
  description: Whether a request got no answer because the server went away; RV(error) says how.
  returned: always
  type: bool
error:
  description: The connection error of a server that went away, or null.
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
    "sampling": {"type": "dict", "default": {}},
    "timeout": {"type": "int", "default": 600},
}


def main() -> None:
    run(AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True))


if __name__ == "__main__":
    main()
