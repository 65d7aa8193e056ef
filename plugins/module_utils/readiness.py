"""How the sglang_readiness module (plugins/modules/sglang_readiness.py, which documents the behaviour) waits for an
SGLang start: the log sources (the unit's journal for its current invocation, or a log file), the HTTP probe of
its endpoints, the comparison of the server arguments it reports, and the wait loop that feeds each log line to
the classifier (module_utils/sglang_log.py) and ends within a tick of the line that decides."""

from __future__ import annotations

import collections
import gc
import json
import os
import select
import subprocess
import threading
import time
import urllib.error

from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import LogFollower

EXCERPT_LINES = 40
READ_TICK = 0.1  # seconds one read of the log waits for a line: a journal's select() returns as soon as one comes
FILE_POLL = 0.005  # seconds between looks at a log file (no select() on a file): how late a deciding line is seen
MARKER_GRACE = 0.5  # after "Received sigquit", how long to wait for the exception line that says why
UNIT_POLL = 0.5  # seconds between systemctl show calls
# Once the unit is dead, the verdict is taken from the invocation's stored journal entries, not from the
# follow: journald may store a dying process's last lines after systemd has already recorded its death
# (measured on the lab: 8 OOM lines stored 7 ms before the SIGKILL was, and not delivered by a follow
# within 0.3 s). The stored entries are read again until they stop growing for SETTLE seconds (or a
# line decides), at most SETTLE_MAX seconds after the death.
SETTLE = 1.0
SETTLE_MAX = 5.0


class LineSource:
    """Bytes from a pipe or a file, cut into lines; a partial last line is kept until it ends."""

    def __init__(self) -> None:
        self._buffer = b""

    def _split(self, data: bytes) -> list[str]:
        self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in complete]

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer, b""
        return [rest.decode("utf-8", errors="replace")] if rest.strip() else []


class JournalSource(LineSource):
    """journalctl --follow for one invocation, read without blocking."""

    def __init__(self, journalctl: str, invocation_id: str) -> None:
        super().__init__()
        self._ended = False
        self._journalctl = journalctl
        self._match = f"_SYSTEMD_INVOCATION_ID={invocation_id}"
        self._env = {**os.environ, "LC_ALL": "C", "SYSTEMD_PAGER": ""}
        # Popen, not run_command: run_command waits for the command to end, and a follow never ends.
        self._proc = subprocess.Popen(
            [journalctl, "--follow", "--lines=all", "--output=cat", "--no-pager", self._match],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=self._env,
        )
        self._fd = self._proc.stdout.fileno()

    def read(self, wait: float) -> list[str]:
        if self._ended:
            time.sleep(wait)
            return []
        lines = []
        deadline = time.monotonic() + wait
        while True:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return lines
            data = os.read(self._fd, 65536)
            if not data:  # journalctl ended
                self._ended = True
                return lines + self.flush()
            lines.extend(self._split(data))
            wait = 0.0
            deadline = time.monotonic()

    def stored(self) -> list[str] | None:
        """Every line the journal holds for the invocation now (no follow), after asking journald to
        write out what it has received; None when the journal cannot be read."""
        # --sync needs privileges a non-root caller may lack; the stored read works without it.
        subprocess.run(
            [self._journalctl, "--sync"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            env=self._env, timeout=10,
        )
        done = subprocess.run(
            [self._journalctl, "--lines=all", "--output=cat", "--no-pager", self._match],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=False,
            env=self._env, timeout=60,
        )
        if done.returncode != 0:
            return None
        text = done.stdout.decode("utf-8", errors="replace")
        return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()


class FileSource(LineSource):
    """A log file read from its beginning as it grows; it may not exist yet, and may be truncated."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._handle = None

    def read(self, wait: float) -> list[str]:
        """What the file gained, as soon as it gains something within wait seconds: a file offers no
        select(), so it is looked at every FILE_POLL seconds (a write is seen that late at most, not a whole
        tick late)."""
        deadline = time.monotonic() + wait
        while True:
            lines = self._read_once()
            left = deadline - time.monotonic()
            if lines or left <= 0:
                return lines
            time.sleep(min(FILE_POLL, left))

    def _read_once(self) -> list[str]:
        if self._handle is None:
            try:
                self._handle = open(self._path, "rb")  # noqa: SIM115 - held open across reads
            except FileNotFoundError:
                return []
        if os.fstat(self._handle.fileno()).st_size < self._handle.tell():
            self._handle.seek(0)  # truncated: a new start rewrote it
        return self._split(self._handle.read())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class HttpProbe(threading.Thread):
    """Polls /health_generate, then /v1/models, then /server_info, in a thread so that a slow request
    never delays reading the log."""

    def __init__(self, url: str, api_key: str | None, expected: dict, every: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self._url = url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._expected = expected
        self._every = every
        self._timeout = timeout
        self._stop = threading.Event()
        self.result: dict | None = None  # set once, when every endpoint answered
        self.last_status = "not polled yet"

    def stop(self) -> None:
        self._stop.set()

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with open_url(self._url + path, headers=self._headers, timeout=self._timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, b""
        except (urllib.error.URLError, UrlConnectionError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            self.last_status = f"{path}: {reason}"
            return 0, b""

    def _poll_once(self) -> bool:
        for path in ("/health_generate", "/v1/models"):
            status, _ = self._get(path)
            if status != 200:
                if status:
                    self.last_status = f"{path}: HTTP {status}"
                return False
        status, body = self._get("/server_info")
        if status == 404:
            status, body = self._get("/get_server_info")
        if status != 200:
            if status:
                self.last_status = f"/server_info: HTTP {status}"
            return False
        try:
            info = json.loads(body)
        except ValueError:
            self.last_status = "/server_info: not JSON"
            return False
        self.result = compare_server_args(self._expected, info if isinstance(info, dict) else {})
        self.last_status = "all endpoints answered"
        return True

    def run(self) -> None:
        while not self._stop.is_set():
            if self._poll_once():
                return
            self._stop.wait(self._every)


def _same(expected, actual) -> bool:
    if isinstance(actual, bool):
        return str(expected).strip().lower() in (("true", "yes", "1", "on") if actual else ("false", "no", "0", "off"))
    if isinstance(actual, (int, float)) and not isinstance(expected, bool):
        try:
            return float(expected) == float(actual)
        except (TypeError, ValueError):
            return False
    if isinstance(actual, list) and not isinstance(expected, list):
        return [str(expected)] == [str(item) for item in actual]
    return str(expected) == str(actual) if not isinstance(expected, list) else expected == actual


def compare_server_args(expected: dict, info: dict) -> dict:
    """What /server_info reports for each expected argument, and the differences."""
    reported = {**info.get("server_args", {}), **info} if isinstance(info.get("server_args"), dict) else info
    seen, mismatches = {}, []
    for name, want in expected.items():
        if name not in reported:
            mismatches.append({"arg": name, "expected": want, "reported": None, "why": "not reported"})
            continue
        seen[name] = reported[name]
        if not _same(want, reported[name]):
            mismatches.append({"arg": name, "expected": want, "reported": reported[name], "why": "differs"})
    return {"server_info": seen, "mismatches": mismatches}


def _unit_state(module, systemctl: str, unit: str) -> dict:
    props = "ActiveState,SubState,Result,ExecMainStatus,InvocationID"
    rc, out, _ = module.run_command([systemctl, "show", "-p", props, unit], environ_update={"LC_ALL": "C"})
    state = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        state[key.strip()] = value.strip()
    return state


def _unit_died(state: dict, invocation_id: str) -> bool:
    if state.get("InvocationID") and state["InvocationID"] != invocation_id:
        return True  # restarted: the start we followed is over
    active, sub = state.get("ActiveState"), state.get("SubState")
    return active in ("failed", "inactive") or sub == "auto-restart"


def _describe(unit: str | None, verdict: dict, http_status: str) -> str:
    who = unit or "the SGLang server"
    state, oom = verdict["state"], verdict["oom"]
    if state == "oom":
        where = f" on GPU {oom['gpu']}" if oom["gpu"] is not None else ""
        sizes = ""
        if oom["tried_to_allocate_mib"] is not None:
            sizes = f" (tried to allocate {oom['tried_to_allocate_mib']} MiB"
            if oom["free_mib"] is not None:
                sizes += f", {oom['free_mib']} MiB free"
            if oom["capacity_gib"] is not None:
                sizes += f" of {oom['capacity_gib']} GiB"
            sizes += ")"
        return f"{who} ran out of GPU memory during {oom['phase']}{where}{sizes}. {verdict['advice']}"
    if state == "crashed":
        return f"{who} crashed ({verdict['cause']}) in phase {verdict['phase']}: {verdict['line']}. {verdict['advice']}"
    if state == "hung":
        return f"{who} made no progress in phase {verdict['phase']} for too long. {verdict['advice']}"
    return f"{who} was not ready in time (phase {verdict['phase']}; last HTTP answer: {http_status})."


def settle_after_death(source, follower: LogFollower, excerpt: collections.deque) -> dict:
    """The verdict of a start whose unit is dead, from everything the journal stores for it.

    The follow may not have delivered the last lines yet (they can reach the journal after systemd
    records the death), so the stored entries are read until a line decides or they stop growing.
    A log file (no journal) is final as read."""
    if not isinstance(source, JournalSource):
        return follower.finish().to_dict()
    died = time.monotonic()
    stored, changed_at = None, died
    while True:
        lines = source.stored()
        now = time.monotonic()
        # The stored record is used once it holds at least what the follow saw.
        if lines is not None and len(lines) >= follower.lines_seen and (stored is None or len(lines) > len(stored)):
            stored, changed_at = lines, now
            probe = LogFollower(started_at=died)
            verdict = probe.feed_many(stored, now=died)
            if verdict.failed and verdict.final:
                break
        if now - changed_at >= SETTLE or now - died >= SETTLE_MAX:
            break
        time.sleep(READ_TICK * 2)
    if stored is None:  # the journal could not be read back: keep what the follow saw
        return follower.finish().to_dict()
    excerpt.clear()
    excerpt.extend(stored[-EXCERPT_LINES:])
    final = LogFollower(started_at=died)
    final.feed_many(stored, now=died)
    return final.finish().to_dict()


OUTCOME_KEYS = ("state", "phase", "cause", "oom", "advice")


def with_outcome(result: dict) -> dict:
    """The result with the start's outcome as one record (RETURN's outcome), as the role keeps it."""
    return {**result, "outcome": {key: result.get(key) for key in OUTCOME_KEYS}}


def run(module) -> None:
    """The module's work, given its AnsibleModule: check the arguments, wait, exit_json or fail_json."""
    params = module.params
    started = time.monotonic()
    result = {
        "changed": False,
        "elapsed": 0.0,
        "state": "unknown",
        "phase": None,
        "oom": None,
        "cause": None,
        "line": None,
        "advice": None,
        "log_excerpt": [],
        "unit_state": {},
        "mismatches": [],
    }

    # Argument errors fail here, before any waiting.
    for name in ("timeout", "hang_timeout", "http_timeout"):
        if params[name] <= 0:
            module.fail_json(msg=f"{name} must be a positive number of seconds, got {params[name]}.",
                             **with_outcome(result))
    if params["sleep"] <= 0 or params["delay"] < 0:
        module.fail_json(msg="sleep must be positive and delay zero or more.", **with_outcome(result))
    if not params["url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"url must start with http:// or https://, got {params['url']!r}.", **with_outcome(result))
    unit = params["unit"] if params["unit"] is not None else (None if params["log_path"] else "sglang.service")
    if unit is not None and not unit.strip():
        module.fail_json(msg="unit must name a systemd unit, such as sglang.service.", **with_outcome(result))
    systemctl = journalctl = invocation_id = None
    if unit:
        systemctl = module.get_bin_path("systemctl", required=True)
        if not params["log_path"]:
            journalctl = module.get_bin_path("journalctl", required=True)

    if module.check_mode:
        module.exit_json(skipped=True, msg="Check mode: readiness was not waited for.", **with_outcome(result))

    if unit:
        state = _unit_state(module, systemctl, unit)
        invocation_id = state.get("InvocationID", "")
        result["unit_state"] = {k: v for k, v in state.items() if k != "InvocationID"}
        if not invocation_id:
            module.fail_json(msg=f"{unit} has no current invocation: it has not been started.", **with_outcome(result))
        result["invocation_id"] = invocation_id

    if params["delay"]:
        time.sleep(params["delay"])

    source = FileSource(params["log_path"]) if params["log_path"] else JournalSource(journalctl, invocation_id)
    follower = LogFollower(started_at=time.monotonic())
    excerpt = collections.deque(maxlen=EXCERPT_LINES)
    probe = HttpProbe(
        params["url"], params["api_key"], params["expected_args"], params["sleep"], params["http_timeout"]
    )
    probe.start()
    deadline = started + params["timeout"]
    next_unit_poll = time.monotonic() + UNIT_POLL
    verdict = None
    dead_state = None

    def take(lines: list[str]) -> None:
        for line in lines:
            excerpt.append(line)
            follower.feed(line, now=time.monotonic())

    try:
        while True:
            take(source.read(READ_TICK))
            now = time.monotonic()
            current = follower.verdict(now=now, hang_seconds=params["hang_timeout"])
            if current.failed and current.final:
                verdict = current.to_dict()
                break
            if follower.pending_kind == "marker" and now - follower.pending_since >= MARKER_GRACE:
                verdict = follower.finish().to_dict()
                break
            if probe.result is not None:
                verdict = current.to_dict()
                verdict.update(state="ready", phase=None, advice="The server is ready.")
                break
            if unit and now >= next_unit_poll:
                next_unit_poll = now + UNIT_POLL
                state = _unit_state(module, systemctl, unit)
                result["unit_state"] = {k: v for k, v in state.items() if k != "InvocationID"}
                if _unit_died(state, invocation_id):
                    dead_state = state
                    take(source.read(0.0))
                    take(source.flush())
                    verdict = settle_after_death(source, follower, excerpt)
                    break
            if now >= deadline:
                verdict = follower.verdict(now=now).to_dict()
                break
    finally:
        probe.stop()
        source.close()
    # The decision is made and the process ends right after it returns: without this, Python's shutdown spends
    # ~20 ms of the latency in a last cyclic-GC pass over every object ansible-core's imports made (measured:
    # ~25 ms from the result written to the process gone, ~7 ms with it). Frozen objects are only never
    # collected, and the process is ending.
    gc.freeze()

    result["elapsed"] = round(time.monotonic() - started, 2)
    result["log_excerpt"] = list(excerpt)
    if dead_state is not None and verdict["state"] not in ("oom", "crashed", "hung"):
        summary = " ".join(
            f"{k}={dead_state.get(k, '')}" for k in ("ActiveState", "SubState", "Result", "ExecMainStatus")
        )
        verdict.update(
            state="crashed",
            cause="other",
            line=f"{unit} stopped: {summary}",
            advice="The unit stopped without a line that says why: read the log excerpt and the unit's journal.",
        )
    for key in ("state", "phase", "oom", "cause", "line", "advice"):
        result[key] = verdict.get(key)

    if verdict["state"] == "ready":
        check = probe.result
        result["server_info"] = check["server_info"]
        result["mismatches"] = check["mismatches"]
        if check["mismatches"]:
            differ = "; ".join(
                f"{m['arg']}: expected {m['expected']!r}, server reports "
                + ("nothing" if m["why"] == "not reported" else repr(m["reported"]))
                for m in check["mismatches"]
            )
            result["state"] = "mismatch"
            result["advice"] = (
                "The server runs with other arguments than the unit was rendered with: "
                "re-render and restart the unit, or fix expected_args."
            )
            module.fail_json(
                msg=params["msg"] or f"{unit or 'The server'} serves with other arguments: {differ}.",
                **with_outcome(result),
            )
        module.exit_json(msg=f"{unit or 'The server'} is ready after {result['elapsed']} s.", **with_outcome(result))
    module.fail_json(msg=params["msg"] or _describe(unit, verdict, probe.last_status), **with_outcome(result))
