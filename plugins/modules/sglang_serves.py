#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_serves
short_description: Say whether the SGLang server on this host still serves, by the fault watcher's rule
description:
  - >-
    The rollout's gate between batches ("every host done so far still serves"). A server serves when its
    C(GET /health) answers 200, B(or) when it answers anything else while its scheduler prints progress lines. SGLang's
    C(/health) sends one token through the scheduler and answers 503 when nothing comes back within
    C(SGLANG_HEALTH_CHECK_TIMEOUT) (20 s), which one long prefill batch causes on a healthy server for as long as the
    prompt takes (minutes for a prompt as long as the KV cache holds).
  - >-
    So on a failed C(/health) the module reads the journal of the unit's current start (its C(InvocationID)) for a
    scheduler progress line (C(Prefill batch, #new-seq) or C(Decode batch, #running-req)) within the last
    O(hang_seconds); one there means busy, and serving. Without one it asks again every O(interval) seconds and
    fails once C(/health) has failed for O(hang_seconds) with no progress line in that time, the rule by which the
    fault watcher (roles/fault_watch) takes a host out for a hang.
  - A unit that is not active does not serve; the module fails at once.
  - Read-only; runs in check mode too. It reads the journal, as root or a member of C(systemd-journal).
options:
  url:
    description: The server's C(/health) URL, as the routers (or this host) reach it.
    type: str
    required: true
  unit:
    description: The systemd unit of the server.
    type: str
    default: sglang.service
  hang_seconds:
    description: How long a failing C(/health) with no progress line counts as a hang (the fault watcher's
      C(fault_watch_hang_seconds)).
    type: int
    default: 60
  interval:
    description: Seconds between two questions while C(/health) fails and no progress line shows.
    type: float
    default: 2
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that the server still serves (busy with a long prefill counts)
  moefleet.serving.sglang_serves:
    url: http://10.0.0.11:30000/health
    hang_seconds: 60
"""

RETURN = r"""
serves:
  description: Whether the server serves (C(/health) 200, or progress lines while it fails).
  returned: always
  type: bool
busy:
  description: True when C(/health) failed but the scheduler printed progress within O(hang_seconds).
  returned: always
  type: bool
reason:
  description: What was seen, in a sentence.
  returned: always
  type: str
"""

import subprocess
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.moefleet.serving.plugins.module_utils.host_faults import is_progress


def health_once(url: str, opener=open_url, answer_timeout: float = 10) -> tuple[int, str]:
    """(HTTP status or 0, what was got) for one GET of the /health URL."""
    try:
        with opener(url, timeout=answer_timeout) as resp:
            return resp.status, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, f"no answer ({getattr(exc, 'reason', exc)})"


def unit_state(unit: str, run=subprocess.run) -> tuple[str, str]:
    """(ActiveState, InvocationID) of the unit."""
    out = run(["systemctl", "show", unit, "--property=ActiveState,InvocationID"], capture_output=True, text=True,
              check=False).stdout
    props = dict(line.partition("=")[::2] for line in out.splitlines())
    return props.get("ActiveState", ""), props.get("InvocationID", "")


def progress_times(invocation: str, since: float | None, run=subprocess.run) -> list[float]:
    """Wall-clock times (s) of the scheduler's progress lines of that start of the unit, since ``since`` (all when
    None), from the journal."""
    cmd = ["journalctl", "--no-pager", "-q", "-o", "short-unix", f"_SYSTEMD_INVOCATION_ID={invocation}"]
    if since is not None:
        cmd.append(f"--since=@{since:.0f}")
    out = run(cmd, capture_output=True, text=True, check=False).stdout
    times = []
    for line in out.splitlines():
        stamp, _, message = line.partition(" ")
        try:
            at = float(stamp)
        except ValueError:
            continue
        if is_progress(message):
            times.append(at)
    return times


def judge(url: str, unit: str, hang_seconds: float, interval: float, *, health=health_once, state_of=unit_state,
          progress=progress_times, clock=time.monotonic, wall=time.time, sleep=time.sleep) -> dict:
    """Ask until the server is seen serving, or a hang by the watcher's rule: the module's result (no 'changed')."""
    failing_since = None
    while True:
        code, got = health(url)
        if code == 200:
            return {"serves": True, "busy": False, "reason": f"{url} answered 200"}
        state, invocation = state_of(unit)
        if state != "active" or not invocation:
            return {"serves": False, "busy": False,
                    "reason": f"{url} answered {got} and {unit} is {state or 'unknown'}: it does not serve"}
        now_wall = wall()
        recent = progress(invocation, now_wall - hang_seconds)
        if recent:
            ago = max(0.0, now_wall - max(recent))
            return {"serves": True, "busy": True,
                    "reason": f"{url} answered {got}, but the scheduler printed a progress line {ago:.0f} s ago: "
                              "busy (a batch longer than SGLang's health check timeout, such as a long prefill), "
                              "serving"}
        now = clock()
        failing_since = now if failing_since is None else failing_since
        if now - failing_since >= hang_seconds:
            break
        sleep(interval)
    if progress(invocation, None):
        why = (f"and the scheduler printed no progress line in {hang_seconds:.0f} s: hung (the fault watcher takes "
               "such a host out)")
    else:
        why = (f"and no progress line of this start of {unit} reached the journal (a --log-level above info hides "
               "them, and then a busy server cannot be told from a hung one)")
    return {"serves": False, "busy": False, "reason": f"{url} answered {got} for {hang_seconds:.0f} s {why}"}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "unit": {"type": "str", "default": "sglang.service"},
            "hang_seconds": {"type": "int", "default": 60},
            "interval": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = judge(params["url"], params["unit"], params["hang_seconds"], params["interval"])
    if not result["serves"]:
        module.fail_json(msg=f"The server of {params['unit']} does not serve: {result['reason']}.", changed=False,
                         **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
