#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_route
short_description: Wait until a model gateway routes real requests for a model to one worker
description:
  - Sends one-token chat completions for O(model) through the gateway at O(gateway_url), each with a prompt of
    its own, until the gateway answers one with status 200 and names O(worker_url) in its
    C(x-smg-routed-worker-id) response header (smg 1.13 sets it on every proxied response), or O(timeout) ends.
  - A worker the gateway lists C(ready) and healthy may still be unroutable for the model (smg registers a
    worker added without the key it needs under model C(unknown), and every request for the model then gets
    404 "No worker available for model"). Only a request the worker answered proves it is routed to.
  - Requests go out one after the other, each a new prompt, so a cache-aware policy (whose prefix tree sends a
    repeated prompt back where it went) sends them to the worker with the least cached, which a re-added one is.
  - Read-only for the gateway; runs in check mode too.
options:
  gateway_url:
    description: The gateway's base URL, e.g. C(http://127.0.0.1:30000).
    type: str
    required: true
  worker_url:
    description: The worker's URL as the gateway lists it (C(GET /workers)).
    type: str
    required: true
  model:
    description: The model name clients ask for (the worker's served model name).
    type: str
    required: true
  api_key:
    description: The key clients send the gateway (its C(--api-key)); empty when it has none.
    type: str
    default: ""
  timeout:
    description: Seconds to keep trying.
    type: int
    default: 60
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until the gateway routes kimi-k2.6 to the worker
  moefleet.serving.gateway_route:
    gateway_url: http://127.0.0.1:30000
    worker_url: http://10.0.0.7:30000
    model: kimi-k2.6
    api_key: "{{ sglang_router_worker_api_key }}"
  no_log: true
"""

RETURN = r"""
attempts:
  description: Requests sent.
  returned: always
  type: int
routed:
  description: How many requests each worker answered (by C(x-smg-routed-worker-id)), and C(error:<status>)
    for the requests the gateway refused.
  returned: always
  type: dict
last_error:
  description: The gateway's last refusal (status and the start of its body), if any.
  returned: always
  type: str
"""

import json
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

try:
    from urllib.error import HTTPError, URLError
except ImportError:  # pragma: no cover
    HTTPError = URLError = OSError


def route_once(gateway_url, model, api_key, prompt, opener=open_url):
    """(routed worker or None, error text or '') for one request through the gateway."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    try:
        resp = opener(gateway_url.rstrip("/") + "/v1/chat/completions", data=body, headers=headers, method="POST",
                      timeout=30)
        return resp.headers.get("x-smg-routed-worker-id"), ""
    except HTTPError as exc:
        text = exc.read()[:300].decode("utf-8", "replace") if hasattr(exc, "read") else ""
        return None, f"HTTP {exc.code}: {text}"
    except (URLError, OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def wait_routed(gateway_url, worker_url, model, api_key, timeout, opener=open_url, clock=time.monotonic,
                sleep=time.sleep):
    """Send requests until one is answered by ``worker_url`` or ``timeout`` seconds pass:
    (found, attempts, routed counts, last error)."""
    deadline = clock() + timeout
    routed, attempts, last_error = {}, 0, ""
    while True:
        attempts += 1
        # The random part first: a cache-aware policy matches prompts by prefix, and one shared with earlier
        # checks would send this one where they went.
        worker, error = route_once(gateway_url, model, api_key, f"{uuid.uuid4().hex} moefleet routing check", opener)
        key = worker or "error:" + (error.split(":", 1)[0] if error else "no routed-worker header")
        routed[key] = routed.get(key, 0) + 1
        if error:
            last_error = error
        if worker == worker_url:
            return True, attempts, routed, last_error
        if clock() >= deadline:
            return False, attempts, routed, last_error
        if error:
            sleep(1)  # a refusal: the gateway is not ready for the model yet; do not hammer it


def main():
    module = AnsibleModule(
        argument_spec={
            "gateway_url": {"type": "str", "required": True},
            "worker_url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    p = module.params
    found, attempts, routed, last_error = wait_routed(p["gateway_url"], p["worker_url"], p["model"], p["api_key"],
                                                      p["timeout"])
    result = {"changed": False, "attempts": attempts, "routed": routed, "last_error": last_error}
    if not found:
        module.fail_json(
            msg=(f"The gateway at {p['gateway_url']} did not route a request for {p['model']} to {p['worker_url']} "
                 f"in {p['timeout']} s ({attempts} requests; answered by: {routed}"
                 + (f"; last refusal: {last_error}" if last_error else "") + "). A 404 'No worker available for "
                 "model' means the gateway registered the worker without its model: the worker needs an API key "
                 "the gateway was not given (sglang_router_worker_api_key), or it serves another model name."),
            **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
