"""The rollout's gate between batches (plugins/modules/sglang_serves.py): a server serves when /health answers 200, or
while /health fails and its scheduler prints progress (a long prefill on a healthy host); it fails on a failing
/health with no progress line for the fault watcher's hang window, and at once on a unit that is not active."""

from __future__ import annotations

import http.server
import subprocess
import threading

import pytest
from ansible_collections.moefleet.serving.plugins.modules import sglang_serves

URL = "http://10.0.0.11:30000/health"
INVOCATION = "5f1c0e3a9b2d4c6e8f0a1b2c3d4e5f60"
# SGLang 0.5.10's scheduler lines as the journal holds them (journalctl -o short-unix), and lines that are not
# progress: an access-log line of a health poll, a warning.
PREFILL = ("1764900000.250000 rtrt-1 python[3525]: [2026-12-05 06:40:00 TP0] Prefill batch, #new-seq: 1, "
           "#new-token: 8192, #cached-token: 0, token usage: 0.05, #running-req: 0, #queue-req: 0, ")
ACCESS = ('1764900001.000000 rtrt-1 python[3525]: INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 '
          "Service Unavailable")
WARNING = ("1764900002.000000 rtrt-1 python[3525]: [2026-12-05 06:40:02] Health check failed. Server couldn't get a "
           "response")


class Clock:
    def __init__(self, wall: float = 1764900010.0) -> None:
        self.now, self.wall0 = 0.0, wall

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall0 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def judge(codes, *, state=("active", INVOCATION), progress_at=(), hang=20.0):
    """judge() with a /health that answers ``codes`` in turn (the last one from then on), and a journal whose
    progress lines were written at the wall-clock times ``progress_at``."""
    clock, asked, journal = Clock(), [], []
    codes = list(codes)

    def health(url):
        asked.append(url)
        code = codes.pop(0) if len(codes) > 1 else codes[0]
        return code, f"HTTP {code}" if code else "no answer (Connection refused)"

    def progress(invocation, since):
        journal.append((invocation, since))
        return [t for t in progress_at if since is None or t >= since]

    result = sglang_serves.judge(URL, "sglang.service", hang, 2, health=health, state_of=lambda unit: state,
                                 progress=progress, clock=clock, wall=clock.wall, sleep=clock.sleep)
    return result, asked, journal, clock


def test_a_200_serves_without_reading_the_journal():
    result, asked, journal, _ = judge([200])
    assert result == {"serves": True, "busy": False, "reason": f"{URL} answered 200"}
    assert asked == [URL] and journal == []


def test_a_long_prefill_serves_busy_at_once():
    """The healthy host that looks most like a hang: /health 503, a prefill chunk's progress line 4 s ago."""
    result, asked, journal, clock = judge([503], progress_at=[1764900006.0])
    assert result["serves"] and result["busy"], result
    assert "progress line 4 s ago" in result["reason"] and "HTTP 503" in result["reason"], result
    assert journal == [(INVOCATION, 1764900010.0 - 20)]  # this start's lines, within the hang window
    assert clock.now == 0 and len(asked) == 1


def test_a_hang_fails_after_the_window_with_the_watchers_reason():
    """The fault: /health 503 and the last progress line older than the window (the scheduler stopped)."""
    result, asked, _, clock = judge([503], progress_at=[1764899900.0])
    assert not result["serves"], result
    assert clock.now >= 20 and len(asked) == 11, (clock.now, asked)  # asked every 2 s through the window
    assert "answered HTTP 503 for 20 s" in result["reason"] and "hung" in result["reason"], result


def test_no_progress_line_ever_names_the_log_level():
    result, _, _, _ = judge([503], progress_at=[])
    assert not result["serves"] and "--log-level" in result["reason"], result


def test_a_failing_health_that_recovers_within_the_window_serves():
    result, asked, _, _ = judge([503, 503, 0, 200])
    assert result["serves"] and not result["busy"] and len(asked) == 4, (result, asked)


@pytest.mark.parametrize("state", [("inactive", ""), ("failed", ""), ("activating", INVOCATION)])
def test_a_unit_that_is_not_active_fails_at_once(state):
    result, asked, journal, clock = judge([0], state=state)
    assert not result["serves"] and f"sglang.service is {state[0]}" in result["reason"], result
    assert clock.now == 0 and journal == []


def test_progress_lines_are_read_from_the_journal_of_this_start():
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "\n".join([PREFILL, ACCESS, WARNING, "-- No entries --"]), "")

    assert sglang_serves.progress_times(INVOCATION, 1764899990.4, run=run) == [1764900000.25]
    assert f"_SYSTEMD_INVOCATION_ID={INVOCATION}" in seen[0] and "--since=@1764899990" in seen[0]
    assert sglang_serves.progress_times(INVOCATION, None, run=run) == [1764900000.25]
    assert not any(a.startswith("--since") for a in seen[1])  # every line of this start


def test_health_once_reads_a_503_and_a_refused_port():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_error(503 if self.path == "/health" else 404)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        assert sglang_serves.health_once(f"http://127.0.0.1:{port}/health", answer_timeout=5) == (503, "HTTP 503")
    finally:
        httpd.shutdown()
        httpd.server_close()
    code, got = sglang_serves.health_once(f"http://127.0.0.1:{port}/health", answer_timeout=5)
    assert code == 0 and got.startswith("no answer"), got
