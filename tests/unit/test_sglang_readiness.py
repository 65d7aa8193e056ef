"""The sglang_readiness module, run in-process as ceph-ansible's ca_test_common does (its arguments set, exit_json
and fail_json raising: tests/readiness_module.py), in a thread while the test writes its log file, against a tiny
HTTP server on a random local port. tests/bench/run.py runs it as Ansible does, as a child process.

The latency asserted here is generous (< 3 s) to stay clear of slow CI machines; the precise number
belongs to the benchmark.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from readiness_module import ModuleRun, run_module

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "data" / "sglang-logs"

# The module decides on the line (or the unit's death), not at its timeout (60 s in these tests): how fast is the
# bench's business (tests/bench/run.py part a measures detection latency); a loaded CI machine only gets slower.
ON_THE_LINE = 30


OOM_LOG = "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log"
RUNTIME_OOM_LOG = "24-oom_runtime-llama4-scout-h100-tp8-400k-prefill-embedding.log"
SERVER_INFO = {
    "tp_size": 8,
    "ep_size": 4,
    "pp_size": 1,
    "dp_size": 1,
    "enable_dp_attention": False,
    "served_model_name": "kimi-k2.6",
    "max_total_num_tokens": 46611,
}


class FakeSGLang:
    """/health_generate answers 503 until ready is set, then 200; /v1/models and /server_info answer."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.requests: list[tuple[str, str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                fake.requests.append((self.path, self.headers.get("Authorization")))
                if self.path == "/health_generate":
                    self._answer(200 if fake.ready.is_set() else 503, {})
                elif self.path == "/v1/models":
                    self._answer(200, {"data": [{"id": "kimi-k2.6"}]})
                elif self.path == "/server_info":
                    self._answer(200, SERVER_INFO)
                else:
                    self._answer(404, {})

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_server():
    server = FakeSGLang()
    yield server
    server.close()


def start_module(args: dict, check_mode: bool = False) -> ModuleRun:
    """The module running in a thread with these arguments."""
    return ModuleRun(args, check_mode).start()


def write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")
        handle.flush()


def split_at(name: str, marker: str) -> tuple[list[str], list[str]]:
    lines = (LOGS / name).read_text(encoding="utf-8").split("\n")
    cut = next(i for i, line in enumerate(lines) if marker in line)
    return lines[:cut], lines[cut:]


def test_ready_when_http_answers_and_the_args_match(tmp_path, fake_server):
    log = tmp_path / "server.log"
    before, after = split_at("18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log", "Uvicorn running on")
    write_lines(log, before)
    run = start_module({
            "log_path": str(log),
            "url": fake_server.url,
            "api_key": "s3cret",
            "sleep": 0.2,
            "expected_args": {
                "tp_size": "8",
                "ep_size": 4,
                "enable_dp_attention": False,
                "served_model_name": "kimi-k2.6",
            },
        },
    )
    time.sleep(1.0)
    write_lines(log, after)
    fake_server.ready.set()
    result, _ = run.finish()
    assert run.failed is False, result
    assert result["state"] == "ready" and not result.get("failed")
    assert result["changed"] is False
    assert result["mismatches"] == [] and result["server_info"]["tp_size"] == 8
    assert result["elapsed"] < 10
    assert any(line.endswith("The server is fired up and ready to roll!") for line in result["log_excerpt"])
    paths = [path for path, _ in fake_server.requests]
    assert paths.index("/health_generate") < paths.index("/v1/models") < paths.index("/server_info")
    assert all(auth == "Bearer s3cret" for _, auth in fake_server.requests)
    assert "s3cret" not in json.dumps(result)


def test_oom_is_reported_on_its_line_not_at_the_timeout(tmp_path, fake_server):
    log = tmp_path / "server.log"
    # SGLang writes the child's traceback as one record: "Scheduler hit an exception: ..." up to the OOM
    before, after = split_at(OOM_LOG, "Scheduler hit an exception")
    write_lines(log, before)
    run = start_module({"log_path": str(log), "url": fake_server.url, "timeout": 60})
    time.sleep(1.5)  # the module is following the file by now
    assert run.running(), "the module decided before the deciding line"
    written = time.monotonic()
    write_lines(log, after)
    result, ended = run.finish()
    assert ended - written < ON_THE_LINE
    assert run.failed is True and result["failed"] is True
    assert (result["state"], result["phase"]) == ("oom", "weight_load")
    assert result["oom"] == {
        "phase": "weight_load",
        "gpu": 0,
        "tried_to_allocate_mib": 114.0,
        "free_mib": 54.38,
        "capacity_gib": 15.58,
        "rank": "TP0",
    }
    assert "will not help" in result["msg"] and "GPU 0" in result["msg"]
    assert result["line"].startswith("torch.OutOfMemoryError")
    assert 0 < len(result["log_excerpt"]) <= 40
    assert {"elapsed", "cause", "advice", "log_excerpt", "phase"} <= set(result)
    # the record the role keeps in the host's history, as one value
    assert result["outcome"] == {"state": "oom", "phase": "weight_load", "cause": None, "oom": result["oom"],
                                 "advice": result["advice"]}


def test_sigquit_first_then_the_traceback(tmp_path, fake_server):
    """Log 24: the parent's sigquit comes before the child's traceback; the OOM still decides."""
    log = tmp_path / "server.log"
    write_lines(log, (LOGS / RUNTIME_OOM_LOG).read_text().split("\n"))
    run = start_module({"log_path": str(log), "url": fake_server.url, "timeout": 60})
    result, _ = run.finish()
    assert (result["state"], result["phase"], result["oom"]["gpu"]) == ("oom", "runtime", 5)


def test_a_hang_is_reported_with_its_phase(tmp_path, fake_server):
    log = tmp_path / "server.log"
    write_lines(log, (LOGS / "22-hang-rtx6000ada-tp2-stuck-nccl-init.log").read_text().split("\n"))
    run = start_module({"log_path": str(log), "url": fake_server.url, "hang_timeout": 1})
    result, _ = run.finish()
    assert run.failed is True
    assert (result["state"], result["phase"]) == ("hung", "nccl_init")
    assert "NCCL_P2P_DISABLE=1" in result["advice"]


def test_a_timeout_while_starting_fails_as_starting(tmp_path, fake_server):
    log = tmp_path / "server.log"
    write_lines(log, ["[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=93.61 GB"])
    run = start_module({"log_path": str(log), "url": fake_server.url, "timeout": 1, "sleep": 0.2})
    result, _ = run.finish()
    assert run.failed is True
    assert (result["state"], result["phase"]) == ("starting", "weight_load")
    assert "HTTP 503" in result["msg"]


def test_server_args_that_differ_fail_and_name_each(tmp_path, fake_server):
    log = tmp_path / "server.log"
    write_lines(log, (LOGS / "18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log").read_text().split("\n"))
    fake_server.ready.set()
    run = start_module({
            "log_path": str(log),
            "url": fake_server.url,
            "sleep": 0.2,
            "expected_args": {"tp_size": 4, "ep_size": 4, "moe_a2a_backend": "deepep"},
        },
    )
    result, _ = run.finish()
    assert run.failed is True and result["state"] == "mismatch"
    assert "tp_size: expected 4, server reports 8" in result["msg"]
    assert "moe_a2a_backend: expected 'deepep', server reports nothing" in result["msg"]
    assert [m["arg"] for m in result["mismatches"]] == ["tp_size", "moe_a2a_backend"]


def test_check_mode_returns_at_once_without_waiting(tmp_path):
    result, failed, _ = run_module({"log_path": str(tmp_path / "never.log"), "timeout": 600}, check_mode=True,
                                   timeout=15)
    assert failed is False
    assert result["skipped"] is True and result["changed"] is False
    assert result["elapsed"] == 0.0 and result["state"] == "unknown"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"timeout": 0}, "timeout must be a positive"),
        ({"url": "127.0.0.1:30000"}, "url must start with http"),
        ({"sleep": 0}, "sleep must be positive"),
    ],
)
def test_argument_errors_fail_before_any_waiting(tmp_path, args, words):
    started = time.monotonic()
    result, failed, ended = run_module({"log_path": str(tmp_path / "never.log"), **args}, timeout=15)
    assert failed is True and words in result["msg"]
    assert ended - started < 5


FAKE_SYSTEMCTL = """#!/bin/sh
# stands in for `systemctl show -p ... UNIT`: prints the state the test wrote
cat "$FAKE_UNIT_STATE"
"""
FAKE_JOURNALCTL = """#!/bin/sh
# stands in for journalctl: `--follow ... _SYSTEMD_INVOCATION_ID=...` records its args and follows
# $FAKE_JOURNAL (what a follow delivers); `--sync` succeeds; any other call prints the stored entries,
# $FAKE_JOURNAL_STORED (which may hold more than the follow has delivered yet).
case "$*" in
  *--follow*) echo "$@" > "$FAKE_JOURNAL_ARGS"; exec tail -n +1 -f "$FAKE_JOURNAL" ;;
  --sync) exit 0 ;;
  *) echo "$@" >> "$FAKE_JOURNAL_ARGS.stored"; exec cat "${FAKE_JOURNAL_STORED:-$FAKE_JOURNAL}" ;;
esac
"""


def fake_unit(tmp_path: Path, monkeypatch, active: str = "active", sub: str = "running") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "unit.state"
    set_unit_state(state, active, sub)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_UNIT_STATE", str(state))
    monkeypatch.setenv("FAKE_JOURNAL", str(tmp_path / "journal.log"))
    monkeypatch.setenv("FAKE_JOURNAL_ARGS", str(tmp_path / "journalctl.args"))
    (tmp_path / "journal.log").write_text("")
    return state


def set_unit_state(path: Path, active: str, sub: str, result: str = "success", status: str = "0") -> None:
    path.write_text(
        f"ActiveState={active}\nSubState={sub}\nResult={result}\nExecMainStatus={status}\n"
        "InvocationID=0123456789abcdef0123456789abcdef\n"
    )


def test_follows_the_units_current_invocation(tmp_path, fake_server, monkeypatch):
    """Log 34: sigquit, then a traceback cut before its exception line. The marker decides after a
    short grace (the exception line that would say why never comes)."""
    fake_unit(tmp_path, monkeypatch)
    lines = (LOGS / "34-crash_other-rtxpro6000-glm52-nvfp4-sigquit-first-cuda-graph-init.log").read_text()
    run = start_module({"unit": "sglang.service", "url": fake_server.url, "timeout": 60})
    time.sleep(1.5)
    assert run.running()
    written = time.monotonic()
    write_lines(tmp_path / "journal.log", lines.split("\n"))
    result, ended = run.finish()
    assert ended - written < ON_THE_LINE
    assert (result["state"], result["phase"], result["cause"]) == ("crashed", "cuda_graph", "other")
    assert (result["outcome"]["state"], result["outcome"]["cause"]) == ("crashed", "other")
    assert result["line"].endswith("Received sigquit from a child process. It usually means the child failed.")
    assert result["invocation_id"] == "0123456789abcdef0123456789abcdef"
    args = (tmp_path / "journalctl.args").read_text()
    assert "_SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef" in args and "--follow" in args


def test_a_unit_that_dies_silently_is_a_crash_that_names_its_state(tmp_path, fake_server, monkeypatch):
    state = fake_unit(tmp_path, monkeypatch)
    write_lines(tmp_path / "journal.log", ["[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=93.61 GB"])
    run = start_module({"unit": "sglang.service", "url": fake_server.url, "timeout": 60})
    time.sleep(1.0)
    died = time.monotonic()
    set_unit_state(state, "inactive", "dead", result="success", status="0")  # some versions exit 0
    result, ended = run.finish()
    assert ended - died < ON_THE_LINE
    assert run.failed is True
    assert (result["state"], result["cause"]) == ("crashed", "other")
    assert result["line"] == (
        "sglang.service stopped: ActiveState=inactive SubState=dead Result=success ExecMainStatus=0"
    )


def test_lines_the_journal_stores_after_the_unit_died_still_decide(tmp_path, fake_server, monkeypatch):
    """The race seen on the lab: the follow never delivers the OOM lines, and journald stores them only
    after systemd has recorded the death. The verdict reads the invocation's stored entries until they
    settle, so the KV-pool OOM is reported, not a silent crash."""
    state = fake_unit(tmp_path, monkeypatch)
    stored = tmp_path / "journal.stored"
    monkeypatch.setenv("FAKE_JOURNAL_STORED", str(stored))
    begin = [
        "[2025-02-17 10:13:20 TP4] Load weight begin. avail mem=93.61 GB",
        "[2025-02-17 10:13:45 TP4] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=2.10 GB, mem usage=91.51 GB.",
    ]
    rest = (LOGS / "06-oom_kv_cache-deepseek-r1-tke-not-enough-memory.log").read_text().split("\n")
    write_lines(tmp_path / "journal.log", begin)
    write_lines(stored, begin)
    run = start_module({"unit": "sglang.service", "url": fake_server.url, "timeout": 60})
    time.sleep(1.0)
    set_unit_state(state, "failed", "failed", result="signal", status="9")
    time.sleep(0.6)  # journald lags behind the death
    write_lines(stored, rest)
    result, _ = run.finish()
    assert (result["state"], result["phase"]) == ("oom", "kv_cache"), result["msg"]
    assert any("Not enough memory" in line for line in result["log_excerpt"])
    assert "_SYSTEMD_INVOCATION_ID=0123456789abcdef0123456789abcdef" in (
        tmp_path / "journalctl.args.stored"
    ).read_text()
