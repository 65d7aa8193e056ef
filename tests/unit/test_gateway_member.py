"""Putting a worker back behind the gateway: the routing check (modules/gateway_route.py) and the gateway's
launcher leaving out the workers a rollout took out (roles/sglang_router/files/smg-launch)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import urllib.error
from pathlib import Path

from ansible_collections.moefleet.serving.plugins.modules import gateway_route

ROOT = Path(__file__).resolve().parents[2]
WORKER = "http://10.0.0.11:30000"
OTHER = "http://10.0.0.12:30000"


class FakeGateway:
    """smg 1.13 as the check sees it: each answer names the worker in x-smg-routed-worker-id, or is refused."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.requests = list(answers), []

    def __call__(self, url, data=None, headers=None, method=None, timeout=None):
        self.requests.append({"url": url, "body": json.loads(data), "headers": headers})
        answer = self.answers.pop(0) if self.answers else OTHER
        if answer.startswith("HTTP "):
            code = int(answer.split()[1])
            body = io.BytesIO(b'{"error": "No worker available for model"}')
            raise urllib.error.HTTPError(url, code, "refused", {}, body)

        class Response:
            headers = {"x-smg-routed-worker-id": answer}

        return Response()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def wait(gateway: FakeGateway, timeout: int = 10, key: str = "k-123"):
    clock = Clock()
    return gateway_route.wait_routed("http://127.0.0.1:30000", WORKER, "kimi-k2.6", key, timeout, opener=gateway,
                                     clock=clock, sleep=clock.sleep)


def test_ready_only_once_a_request_is_answered_by_the_worker():
    gateway = FakeGateway([OTHER, OTHER, WORKER])
    found, attempts, routed, _ = wait(gateway)
    assert found and attempts == 3 and routed == {OTHER: 2, WORKER: 1}
    # every request asks for the served model with the client key, each with a prompt of its own
    assert {r["body"]["model"] for r in gateway.requests} == {"kimi-k2.6"}
    assert {r["headers"]["Authorization"] for r in gateway.requests} == {"Bearer k-123"}
    assert len({r["body"]["messages"][0]["content"] for r in gateway.requests}) == 3


def test_a_gateway_that_answers_404_for_the_model_never_counts_as_routed():
    """A worker registered without its key: listed ready, but every request for the model gets 404."""
    found, attempts, routed, last_error = wait(FakeGateway(["HTTP 404"] * 100))
    assert not found and attempts > 1 and routed == {"error:HTTP 404": attempts}
    assert last_error.startswith("HTTP 404") and "No worker available" in last_error


def test_no_key_sends_no_authorization_header():
    gateway = FakeGateway([WORKER])
    assert wait(gateway, key="")[0]
    assert "Authorization" not in gateway.requests[0]["headers"]


def _launcher():
    loader = importlib.machinery.SourceFileLoader("smg_launch", str(ROOT / "roles/sglang_router/files/smg-launch"))
    spec = importlib.util.spec_from_loader("smg_launch", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_restarted_gateway_leaves_out_the_workers_a_rollout_left_out(tmp_path):
    launch = _launcher()
    left_out = tmp_path / "workers-left-out"
    args = ["--host", "0.0.0.0", "--worker-urls", WORKER, OTHER, "--policy", "cache_aware"]
    assert launch.without_left_out(args, launch.read_left_out(str(left_out))) == args  # no file: all of them
    left_out.write_text(f"{WORKER}\n")
    assert launch.without_left_out(args, launch.read_left_out(str(left_out))) == [
        "--host", "0.0.0.0", "--worker-urls", OTHER, "--policy", "cache_aware"]
    # a value equal to a left-out URL but under another flag stays
    assert launch.without_left_out(["--host", WORKER], {WORKER}) == ["--host", WORKER]
