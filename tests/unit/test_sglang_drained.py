"""The drain's question to a worker (plugins/modules/sglang_drained.py): asked of the server as it runs now - its
running command line's address, the key systemd handed it - and failing out on an answer that never comes."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import jinja2
import pytest
from ansible.plugins.filter.core import to_json
from ansible_collections.moefleet.serving.plugins.modules import sglang_drained

ROOT = Path(__file__).resolve().parents[2]
KEY = 'old-key "with" quotes: and colons'


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def loads(total: int, release: str) -> dict:
    """A /v1/loads?include=core answer holding ``total`` requests, in the release's shape: 0.5.10 adds an aggregate
    (entrypoints/v1_loads.py, _compute_aggregate); 0.5.23 lists each DP rank's core fields only
    (managers/load_snapshot.py LoadSnapshot.to_dict), here two ranks that share the requests."""
    if release == "0.5.10":
        return {"dp_rank_count": 1, "loads": [{"dp_rank": 0, "num_running_reqs": total, "num_waiting_reqs": 0,
                                              "num_total_reqs": total}], "aggregate": {"total_reqs": total}}
    first = total // 2
    return {"version": release, "num_accelerators": 8, "loads": [
        {"dp_rank": 0, "num_running_reqs": first, "num_waiting_reqs": 0, "token_usage": 0.1},
        {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": total - first, "token_usage": 0.0}]}


class Server:
    """SGLang's /v1/loads as the drain sees it: a key it requires, and the counts it reports in turn."""

    def __init__(self, counts: list[int], key: str = "", status: int = 200, silent: bool = False,
                 release: str = "0.5.10") -> None:
        self.counts, self.key, self.status, self.silent, self.asked = list(counts), key, status, silent, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.asked.append((self.path, self.headers.get("Authorization")))
                if outer.silent:
                    threading.Event().wait(1.5)  # longer than the wait for an answer (0.5 s here, 5 s in the module)
                if outer.key and self.headers.get("Authorization") != f"Bearer {outer.key}":
                    self.send_error(401)
                    return
                if outer.status != 200 or self.path != "/v1/loads?include=core":
                    self.send_error(outer.status if outer.status != 200 else 404)
                    return
                total = outer.counts.pop(0) if len(outer.counts) > 1 else outer.counts[0]
                body = json.dumps(loads(total, release)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.block_on_close = False
        self.httpd.handle_error = lambda *args: None  # a client that gave up on the silent answer
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def credential(tmp_path, monkeypatch):
    """The credential as the sglang_service role writes it (its template), where systemd exposes it."""
    env = jinja2.Environment(autoescape=False)
    env.filters["to_json"] = to_json
    env.filters["comment"] = lambda text: "# " + text
    rendered = env.from_string((ROOT / "roles/sglang_service/templates/etc/sglang/secrets.yaml.j2").read_text())
    directory = tmp_path / "run/credentials/sglang.service"
    directory.mkdir(parents=True)
    (directory / "sglang-secrets.yaml").write_text(rendered.render(sglang_service_api_key=KEY, ansible_managed="x"))
    real_join = sglang_drained.os.path.join
    monkeypatch.setattr(sglang_drained.os.path, "join",
                        lambda *parts: real_join(str(tmp_path), *parts[0].lstrip("/").split("/"), *parts[1:])
                        if parts and parts[0] == "/run/credentials" else real_join(*parts))
    return directory


def drain(port: int | None, timeout: float = 10, running: bool = True, host: str = "0.0.0.0") -> dict:
    clock = Clock()
    argv = ["/usr/libexec/moefleet/sglang-redact", "/run/credentials/sglang.service/sglang-secrets.yaml", "--",
            "/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/k2",
            "--host", host, "--port", str(port), "--tp-size", "8",
            "--config", "/run/credentials/sglang.service/sglang-secrets.yaml"]
    return sglang_drained.wait(
        "sglang.service", "sglang-secrets.yaml", timeout, 2,
        pid_of=lambda unit: 4242 if running else 0,
        cmdline=lambda pid: "\0".join(argv).encode() + b"\0",
        clock=clock, sleep=clock.sleep, answer_timeout=0.5,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_address_is_read_from_the_running_command_line():
    assert sglang_drained.address(["python", "-m", "sglang.launch_server"]) == ("127.0.0.1", 30000)
    assert sglang_drained.address(["--host=10.0.0.5", "--port", "31000"]) == ("10.0.0.5", 31000)
    assert sglang_drained.address(["--port", "1", "--port=2"]) == ("127.0.0.1", 2)
    assert sglang_drained.url_of("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert sglang_drained.url_of("::", 30000) == "http://[::1]:30000"
    assert sglang_drained.url_of("fd00::7", 30000) == "http://[fd00::7]:30000"


def test_the_key_the_server_was_started_with_drains_it(credential):
    server = Server([3, 1, 0], key=KEY)
    try:
        result = drain(server.port)
    finally:
        server.close()
    assert result["drained"] and result["requests"] == 0, result
    assert result["url"] == f"http://127.0.0.1:{server.port}"
    assert [auth for _, auth in server.asked] == [f"Bearer {KEY}"] * 3


def test_a_server_that_refuses_the_key_is_not_drained(credential):
    server = Server([0], key="another key")
    try:
        result = drain(server.port, timeout=6)
    finally:
        server.close()
    assert not result["drained"] and "HTTP 401" in result["reason"], result
    assert len(server.asked) == 4  # polled every 2 s until the 6-s timeout, not given up at the first answer


def test_requests_that_never_finish_are_not_drained():
    server = Server([2])
    try:
        result = drain(server.port, timeout=4)
    finally:
        server.close()
    assert not result["drained"] and result["requests"] == 2 and result["reason"] == "2 running or waiting"


def test_an_answer_that_never_comes_is_not_drained():
    server = Server([0], silent=True)
    try:
        result = drain(server.port, timeout=1)
    finally:
        server.close()
    assert not result["drained"] and result["reason"].startswith("no answer"), result


def test_a_404_is_not_drained():
    server = Server([0], status=404)
    try:
        result = drain(server.port, timeout=2)
    finally:
        server.close()
    assert not result["drained"] and result["reason"] == "HTTP 404", result


def test_a_port_with_no_listener_holds_no_request():
    result = drain(free_port())
    assert result["drained"] and "nothing listens" in result["reason"], result


def test_a_unit_that_does_not_run_holds_no_request():
    result = drain(free_port(), running=False)
    assert result["drained"] and result["url"] is None and "does not run" in result["reason"]


def test_the_unit_state_is_read_from_systemctl():
    def systemctl(active: str, pid: str):
        class Done:
            stdout = f"MainPID={pid}\nActiveState={active}\n"

        return lambda *args, **kwargs: Done()

    assert sglang_drained.main_pid("sglang.service", systemctl("active", "77")) == 77
    assert sglang_drained.main_pid("sglang.service", systemctl("activating", "77")) == 0  # loading: no requests
    assert sglang_drained.main_pid("sglang.service", systemctl("inactive", "0")) == 0


def test_a_0_5_23_answer_without_an_aggregate_is_summed_over_its_ranks(credential):
    """SGLang 0.5.23's /v1/loads has no aggregate: the drain sums each rank's running and waiting requests."""
    server = Server([3, 1, 0], key=KEY, release="0.5.23")
    try:
        result = drain(server.port)
    finally:
        server.close()
    assert result["drained"] and result["requests"] == 0, result
    assert len(server.asked) == 3, server.asked


def test_an_answer_with_neither_shape_is_not_drained():
    assert sglang_drained.total_requests({"loads": []}) is None
    assert sglang_drained.total_requests({"loads": [{"dp_rank": 0, "num_running_reqs": 0}]}) is None
    assert sglang_drained.total_requests({"aggregate": {}, "loads": [{"num_running_reqs": 1,
                                                                      "num_waiting_reqs": 2}]}) == 3
