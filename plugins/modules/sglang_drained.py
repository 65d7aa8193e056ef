#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_drained
short_description: Wait until the SGLang server that runs now on this host holds no request
description:
  - Asks the server as it runs now, not as the next deploy will configure it. Its address and port are read
    from the running process's own command line (C(/proc/<MainPID>/cmdline) of O(unit), its C(--host) and
    C(--port), else SGLang's defaults 127.0.0.1 and 30000), and its API key from the credential systemd handed
    it at its start (C(LoadCredential=), under C(/run/credentials/<unit>/)). So a run that changes the address
    (a worker that gets a gateway) or rotates the key drains the server with what it knows.
  - Polls SGLang's C(GET /v1/loads?include=core) on this host every O(interval) seconds until the requests running
    and waiting on every DP rank are 0 (0.5.10's C(aggregate.total_reqs); 0.5.23 has no aggregate, and the module
    sums each rank's C(num_running_reqs) and C(num_waiting_reqs)), or O(timeout) ends.
  - A unit that does not run, or stops meanwhile, holds no request. A port on which nothing listens (connection
    refused, the server is still loading or gone) holds none either. Any other answer (401, 404, a timeout, a
    count above 0) is not drained; after O(timeout) the module fails with what it last got.
  - Read-only; runs in check mode too. Needs root to read the credential.
options:
  unit:
    description: The systemd unit of the server.
    type: str
    default: sglang.service
  credential:
    description: The name of the credential (C(LoadCredential=NAME:...)) that holds the server's C(api-key)
      line; absent when the server runs without a key.
    type: str
    default: sglang-secrets.yaml
  timeout:
    description: Seconds to wait for 0 requests.
    type: int
    default: 120
  interval:
    description: Seconds between polls.
    type: float
    default: 2
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until the server that runs now holds no request
  moefleet.serving.sglang_drained:
    timeout: 300
  become: true
"""

RETURN = r"""
drained:
  description: Whether the server held no request (or none runs) before the timeout.
  returned: always
  type: bool
url:
  description: The URL asked (the running server's address and port as seen from this host); null when no server
    runs.
  returned: always
  type: str
requests:
  description: The last count of requests running and waiting; null when none was read.
  returned: always
  type: int
reason:
  description: Why it counts as drained, or what it last got.
  returned: always
  type: str
"""

import contextlib
import json
import os
import subprocess
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

# SGLang's defaults for --host and --port (ServerArgs, 0.5.10).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
# What a wildcard bind answers on, from the host itself.
_WILDCARD = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}


def main_pid(unit: str, run=subprocess.run) -> int:
    """The unit's main process while it is active, else 0."""
    out = run(["systemctl", "show", unit, "--property=ActiveState,MainPID"], capture_output=True, text=True,
              check=False).stdout
    props = dict(line.partition("=")[::2] for line in out.splitlines())
    if props.get("ActiveState") not in ("active", "reloading", "deactivating"):
        return 0
    try:
        return int(props.get("MainPID") or 0)
    except ValueError:
        return 0


def address(argv: list[str]) -> tuple[str, int]:
    """(host, port) of a launch_server command line; the last spelling wins, as argparse does."""
    host, port = DEFAULT_HOST, DEFAULT_PORT
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name not in ("--host", "--port"):
            continue
        if not eq:
            if i + 1 >= len(argv):
                continue
            value = argv[i + 1]
        if name == "--host":
            host = value
        else:
            with contextlib.suppress(ValueError):
                port = int(value)
    return host, port


def url_of(host: str, port: int) -> str:
    host = _WILDCARD.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def credential_key(path: str) -> str:
    """The api-key of a --config YAML file that holds it as the role writes it (a JSON string), or ''."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() != "api-key":
            continue
        value = value.strip()
        if value.startswith('"'):
            try:
                return str(json.loads(value))
            except ValueError:
                return ""
        return value.strip("'")
    return ""


def loads_once(url: str, key: str, opener=open_url, answer_timeout: float = 5) -> tuple[int | None, str, bool]:
    """(requests or None, what was got, whether nothing listens) for one GET /v1/loads."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with opener(url + "/v1/loads?include=core", headers=headers, timeout=answer_timeout) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        hint = " (the key the server was started with was refused)" if exc.code == 401 else ""
        return None, f"HTTP {exc.code}{hint}", False
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        return None, f"no answer: {exc.reason}", refused
    except ConnectionRefusedError as exc:
        return None, f"no answer: {exc}", True
    except (OSError, ValueError) as exc:
        return None, f"no answer: {exc}", False
    total = total_requests(body)
    if total is None:
        return None, ("an answer without aggregate.total_reqs or each rank's num_running_reqs and "
                      "num_waiting_reqs"), False
    return total, f"{total} running or waiting", False


def total_requests(body) -> int | None:
    """Requests running and waiting on every DP rank, from a /v1/loads answer of either release line: 0.5.10's
    ``aggregate.total_reqs`` (entrypoints/v1_loads.py, _compute_aggregate), or, where the answer has no aggregate
    (0.5.23 dropped it), the sum of each rank's ``num_running_reqs`` and ``num_waiting_reqs`` (its "core" fields,
    managers/load_snapshot.py). None when neither is there."""
    try:
        return int(body["aggregate"]["total_reqs"])
    except (KeyError, TypeError, ValueError):
        pass
    try:
        loads = body["loads"]
        if not isinstance(loads, list) or not loads:
            return None
        return sum(int(rank["num_running_reqs"]) + int(rank["num_waiting_reqs"]) for rank in loads)
    except (KeyError, TypeError, ValueError):
        return None


def read_cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read()


def wait(unit: str, credential: str, timeout: float, interval: float, *, pid_of=main_pid,
         cmdline=read_cmdline, opener=open_url,
         clock=time.monotonic, sleep=time.sleep, answer_timeout: float = 5) -> dict:
    """Poll the running server until it holds no request: the module's result (without 'changed')."""
    deadline = clock() + timeout
    result = {"drained": False, "url": None, "requests": None, "reason": ""}
    while True:
        pid = pid_of(unit)
        if not pid:
            result.update(drained=True, reason=f"{unit} does not run: no request to wait for")
            return result
        try:
            argv = [a.decode("utf-8", "replace") for a in cmdline(pid).split(b"\0") if a]
        except OSError:  # it ended between the two reads: the next round finds it stopped, or its successor
            if clock() + interval > deadline:
                result["reason"] = f"the command line of {unit}'s process {pid} could not be read"
                return result
            sleep(interval)
            continue
        result["url"] = url_of(*address(argv))
        key = credential_key(os.path.join("/run/credentials", unit, credential))
        requests, got, nothing_listens = loads_once(result["url"], key, opener, answer_timeout)
        result["requests"] = requests
        if nothing_listens:
            result.update(drained=True, reason=f"nothing listens on {result['url']} ({unit} runs but does not "
                                               "serve yet): it holds no request")
            return result
        if requests == 0:
            result.update(drained=True, reason="0 requests running or waiting")
            return result
        result["reason"] = got
        if clock() + interval > deadline:
            return result
        sleep(interval)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "sglang.service"},
            "credential": {"type": "str", "default": "sglang-secrets.yaml"},
            "timeout": {"type": "int", "default": 120},
            "interval": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = wait(params["unit"], params["credential"], params["timeout"], params["interval"])
    if not result["drained"]:
        module.fail_json(
            msg=f"The server of {params['unit']} did not report 0 requests on {result['url']}/v1/loads within "
                f"{params['timeout']} s ({result['reason']}).",
            changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
