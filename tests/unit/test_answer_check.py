"""The correctness gate's judgement (plugins/module_utils/answer_check.py): each kind of wrong answer a broken server
gives fails the check it reaches, with a sentence that quotes it; right answers pass. An answer the token budget cut
is asked again with more budget and, cut again, is inconclusive, never wrong; a server that went away is no wrong
answer; each request samples as the served model's entry in the role's table says."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import answer_check as A
from role_defaults import role_defaults

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = role_defaults("sglang_service")
K26_SAMPLING = DEFAULTS["sglang_service_models"]["kimi-k2.6"]["sampling"]


def answer(content=None, reasoning=None, calls=None, finish="stop"):
    return {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, "reasoning_content": reasoning,
                                     "tool_calls": calls}}]}


def call(name="get-weather", arguments='{"city": "Paris"}'):
    return [{"id": f"functions.{name}:0", "index": 0, "type": "function",
             "function": {"name": name, "arguments": arguments}}]


def test_the_requests_follow_the_models_parsers():
    both = A.requests("kimi-k2.6", reasoning=True, tool_calls=True)
    assert [c for c, _ in both] == list(A.CHECKS)
    bodies = dict(both)
    assert "chat_template_kwargs" not in bodies["thinking"]
    off = ("instant", "tool_call", "known_answer")
    assert all(bodies[c]["chat_template_kwargs"] == {"thinking": False} for c in off)
    assert bodies["tool_call"]["tools"][0]["function"]["name"] == "get-weather"
    assert all(b["model"] == "kimi-k2.6" and b["stream"] is False for b in bodies.values())
    plain = dict(A.requests("deepseek-v3", reasoning=False, tool_calls=False))
    assert list(plain) == ["instant", "known_answer"] and "chat_template_kwargs" not in plain["instant"]


def test_the_thinking_budget_covers_real_thoughts():
    bodies = dict(A.requests("kimi-k2.6", reasoning=True, tool_calls=True))
    assert bodies["thinking"]["max_tokens"] >= 16384  # Moonshot's floor for K2.6's thinking mode


def test_each_request_samples_as_the_model_entry_of_the_role_says():
    assert K26_SAMPLING == {"thinking": {"temperature": 1.0, "top_p": 0.95},
                            "instant": {"temperature": 0.6, "top_p": 0.95}}
    bodies = dict(A.requests("kimi-k2.6", reasoning=True, tool_calls=True, sampling=K26_SAMPLING))
    assert (bodies["thinking"]["temperature"], bodies["thinking"]["top_p"]) == (1.0, 0.95)
    for check in ("instant", "tool_call", "known_answer"):
        assert (bodies[check]["temperature"], bodies[check]["top_p"]) == (0.6, 0.95), check


def test_a_model_without_sampling_gets_the_servers_defaults():
    for sampling in (None, {}):
        bodies = dict(A.requests("deepseek-v3", reasoning=False, tool_calls=True, sampling=sampling))
        assert all("temperature" not in b and "top_p" not in b for b in bodies.values())
    assert "sampling" not in DEFAULTS["sglang_service_models"]["deepseek-v3"]


@pytest.mark.parametrize(("sampling", "sentence"), [
    ({"reasoning": {"temperature": 1.0}}, "a mode 'reasoning'; the modes are thinking and instant"),
    ({"thinking": {"temp": 1.0}}, "a field 'temp'"),
    ({"instant": {"temperature": "hot"}}, "sampling.instant.temperature must be a number, got 'hot'"),
    ({"instant": 0.6}, "sampling.instant must map fields to numbers"),
])
def test_a_sampling_entry_the_gate_cannot_send_is_refused_with_a_sentence(sampling, sentence):
    with pytest.raises(ValueError, match=sentence):
        A.requests("m", reasoning=True, tool_calls=False, sampling=sampling)


@pytest.mark.parametrize(("check", "given"), [
    ("thinking", answer("Rayleigh scattering.", "Short wavelengths scatter more.")),
    ("instant", answer("Rayleigh scattering.")),
    ("tool_call", answer(None, None, call(), "tool_calls")),
    ("known_answer", answer("42")),
    ("known_answer", answer("The answer is 42.")),
    ("known_answer", answer("17 + 25 = **42**")),
    ("thinking", answer("Rayleigh scattering.", "Short wavelengths scatter more.", finish="length")),
    ("instant", answer("Sunlight scatters off air molecules, and blue", finish="length")),
])
def test_right_answers_pass(check, given):
    assert A.judge(check, given) is None


@pytest.mark.parametrize(("check", "given", "sentence"), [
    ("thinking", answer("!!!!!!!!!!!!!!!!"), "content is garbage, a run of '!' (what NaN logits decode to): '!!!!!!"),
    ("instant", answer("the sky \ufffd\ufffd blue"), "U+FFFD replacement characters"),
    ("instant", answer(" ".join(["blue"] * 12)), "the word 'blue' 12 times in a row"),
    ("thinking", answer("<think>hmm</think>The sky."), "content holds the model's raw tokens (<think>)"),
    ("tool_call", answer("<|tool_calls_section_begin|><|tool_call_begin|>functions.get-weather:0"),
     "content holds the model's raw tokens (<|tool_calls_section_begin|>)"),
    ("thinking", answer("The sky is blue."), "a thinking-mode answer without reasoning_content"),
    ("thinking", answer(None, "I think the sky"), "reasoning only, no content; reasoning_content: 'I think the sky'"),
    ("instant", answer(None, "The sky is blue."), "reasoning_content with thinking off (the answer leaks into it)"),
    ("instant", answer(""), "an empty answer"),
    ("tool_call", answer("I would call get-weather."), "no parsed tool_calls for a request that offers one tool"),
    ("tool_call", answer(None, None, call("get_weather")), "the tool call names 'get_weather', not 'get-weather'"),
    ("tool_call", answer(None, None, call(arguments="{city: Paris")), "arguments are no JSON"),
    ("tool_call", answer(None, None, call(arguments="[1]")), "arguments are no JSON object"),
    ("known_answer", answer("41"), "asked 'What is 17 + 25? Answer with the number only.', answered '41'"),
    ("known_answer", answer("420"), "answered '420'"),
    ("known_answer", answer("142"), "answered '142'"),
    ("known_answer", answer("-42"), "answered '-42'"),
    ("known_answer", {"error": "bad"}, "no chat message in the answer"),
])
def test_each_wrong_answer_fails_with_its_evidence(check, given, sentence):
    problem = A.judge(check, given)
    assert problem is not None and sentence in problem, problem


def test_evidence_is_cut_to_a_quote():
    problem = A.judge("instant", answer("!" * 5000))
    assert len(problem) < 300 and problem.endswith("…'")
    assert json.dumps(problem)  # it goes into facts and reports


# A thought the budget cut: all reasoning, content empty, finish_reason length (SGLang with the kimi_k2 parser).
CUT_THOUGHT = answer("", "The user asks why the sky is blue. Rayleigh scattering goes as", finish="length")


@pytest.mark.parametrize(("check", "given"), [
    ("thinking", CUT_THOUGHT),
    ("thinking", answer(None, "Let me think", finish="length")),
    ("instant", answer("", finish="length")),
    ("tool_call", answer("I will call", finish="length")),
    ("known_answer", answer("Adding 17 and 25 step by step: 17 + 20 is 37, and", finish="length")),
])
def test_an_answer_the_budget_cut_before_it_said_anything_wrong_is_cut_not_wrong(check, given):
    state, problem = A.assess(check, given)
    assert state == A.CUT and problem


@pytest.mark.parametrize(("check", "given", "sentence"), [
    ("thinking", answer("", "I think " + "!" * 20, finish="length"), "reasoning_content is garbage"),
    ("thinking", answer("<think>hmm", None, finish="length"), "content holds the model's raw tokens (<think>)"),
    ("thinking", answer("The sky.", None, finish="length"), "a thinking-mode answer without reasoning_content"),
    ("thinking", answer("", "<think>nested", finish="length"), "reasoning_content holds think tags"),
    ("instant", answer(None, "The sky is", finish="length"), "reasoning_content with thinking off"),
    ("tool_call", answer("<|tool_calls_section_begin|><|tool_call_begin|>functions.get-weather:0", finish="length"),
     "raw tokens"),
    ("known_answer", answer("41", finish="stop"), "answered '41'"),
    ("thinking", answer(None, "I think the sky", finish="stop"), "reasoning only, no content"),
])
def test_structural_failures_stay_wrong_output_cut_or_not(check, given, sentence):
    state, problem = A.assess(check, given)
    assert state == A.WRONG and sentence in problem, problem


class Server:
    """A stand-in for the server's answers to ask_check: each call answers with the next item (an answer dict, or
    an exception to raise), and records the body asked."""

    def __init__(self, monkeypatch, *replies):
        self.replies, self.bodies = list(replies), []
        monkeypatch.setattr(A, "ask", self)

    def __call__(self, url, body, api_key, timeout):
        self.bodies.append(body)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return (200, reply, "") if isinstance(reply, dict) else reply


def clock(*readings):
    """A clock that reads these seconds in turn, then the last for ever."""
    seen = list(readings)
    return lambda: seen.pop(0) if len(seen) > 1 else seen[0]


def thinking_body():
    return dict(A.requests("kimi-k2.6", True, True, K26_SAMPLING))["thinking"]


def test_a_cut_thought_is_asked_again_with_twice_the_budget_and_then_judged(monkeypatch):
    server = Server(monkeypatch, CUT_THOUGHT, answer("Rayleigh scattering.", "Short wavelengths scatter more."))
    done = A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0))
    assert done["state"] == A.PASSED and done["tries"] == 2
    assert [b["max_tokens"] for b in server.bodies] == [16384, 32768]
    assert all(b["temperature"] == 1.0 for b in server.bodies)
    assert done["max_tokens"] == 32768


def test_a_thought_cut_twice_is_inconclusive_not_wrong(monkeypatch):
    Server(monkeypatch, CUT_THOUGHT, CUT_THOUGHT)
    done = A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0))
    assert done["state"] == A.INCONCLUSIVE and done["tries"] == 2
    assert "cut at 32768 tokens (finish_reason length)" in done["problem"]
    assert "the first answer was cut at 16384 tokens too" in done["problem"]


def test_a_cut_answer_then_a_wrong_one_is_wrong(monkeypatch):
    Server(monkeypatch, CUT_THOUGHT, answer("!!!!!!!!!!!!", "x"))
    assert A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0))["state"] == A.WRONG


def test_no_retry_past_the_wall_time_cap(monkeypatch):
    server = Server(monkeypatch, CUT_THOUGHT)
    done = A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0, 1, 601))
    assert done["state"] == A.INCONCLUSIVE and len(server.bodies) == 1
    assert "no time left within 600 s to ask again with 32768 tokens" in done["problem"]


def test_the_retry_gets_only_the_time_left_of_the_cap(monkeypatch):
    timeouts = []
    monkeypatch.setattr(A, "ask", lambda url, body, key, timeout: (timeouts.append(timeout), (200, CUT_THOUGHT, ""))[1])
    A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0, 0, 450, 450))
    assert timeouts == [600, 150]


def test_no_answer_within_the_cap_is_inconclusive(monkeypatch):
    Server(monkeypatch, A.NoAnswerInTime("no answer within 600 s"))
    done = A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0))
    assert done["state"] == A.INCONCLUSIVE and done["problem"].startswith("no answer within 600 s")


def test_an_http_error_is_a_wrong_answer(monkeypatch):
    Server(monkeypatch, (400, None, "HTTP 400: 'model not found'"))
    done = A.ask_check("http://x", "instant", dict(A.requests("m", False, False))["instant"], None, 600, clock(0))
    assert done == {"name": "instant", "state": A.WRONG, "problem": "no answer (HTTP 400: 'model not found')",
                    "max_tokens": 256, "tries": 1}


def test_a_server_that_went_away_is_no_judgement(monkeypatch):
    Server(monkeypatch, A.ServerGone("Remote end closed connection without response"))
    with pytest.raises(A.ServerGone, match="Remote end closed"):
        A.ask_check("http://x", "thinking", thinking_body(), None, 600, clock(0))


# ask() against real sockets: how each way of getting no answer is told apart.

def _serve(handler):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    held = []

    def loop():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)
            handler(conn)

    threading.Thread(target=loop, daemon=True).start()
    return sock, held


def _read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += conn.recv(65536)


def test_ask_a_server_that_dies_with_the_request_is_server_gone():
    sock, _ = _serve(lambda conn: (_read_request(conn), conn.close()))
    try:
        with pytest.raises(A.ServerGone, match="Remote end closed connection without response"):
            A.ask(f"http://127.0.0.1:{sock.getsockname()[1]}", {"model": "m"}, None, 30)
    finally:
        sock.close()


def test_ask_a_server_that_is_not_there_is_server_gone():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens: connection refused
    with pytest.raises(A.ServerGone, match="refused"):
        A.ask(f"http://127.0.0.1:{port}", {"model": "m"}, None, 30)


def test_ask_a_server_that_does_not_answer_in_time_is_no_answer_in_time():
    sock, held = _serve(_read_request)  # reads the request, never answers
    try:
        with pytest.raises(A.NoAnswerInTime, match="no answer within"):
            A.ask(f"http://127.0.0.1:{sock.getsockname()[1]}", {"model": "m"}, None, 0.5)
    finally:
        sock.close()
        for conn in held:
            conn.close()


def test_ask_an_http_error_keeps_its_status_and_quotes_its_body():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"object": "error", "message": "The model m does not exist."}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        status, got, why = A.ask(f"http://127.0.0.1:{srv.server_address[1]}", {"model": "m"}, None, 30)
    finally:
        srv.shutdown()
    assert (status, got) == (404, None) and why.startswith("HTTP 404: ") and "does not exist" in why


# The module's run(): what the role reads from its result.

class Done(Exception):
    pass


class FakeModule:
    check_mode = False

    def __init__(self, **params):
        self.params = {"url": "http://x", "api_key": None, "model": "kimi-k2.6", "reasoning": True,
                       "tool_calls": True, "sampling": K26_SAMPLING, "timeout": 600, **params}
        self.warnings, self.result = [], None

    def warn(self, text):
        self.warnings.append(text)

    def exit_json(self, **result):
        self.result = {"failed": False, **result}
        raise Done

    def fail_json(self, **result):
        self.result = {"failed": True, **result}
        raise Done


def run(module):
    with pytest.raises(Done):
        A.run(module)
    return module.result


RIGHT = [answer("Rayleigh scattering.", "Short wavelengths scatter more."), answer("Rayleigh scattering."),
         answer(None, None, call(), "tool_calls"), answer("42")]


def test_run_passes_every_right_answer(monkeypatch):
    Server(monkeypatch, *RIGHT)
    result = run(FakeModule())
    assert not result["failed"] and result["passed"] and result["inconclusive"] == [] and not result["server_gone"]
    assert [c["state"] for c in result["checks"]] == [A.PASSED] * 4


def test_run_passes_with_a_warning_when_a_check_is_inconclusive(monkeypatch):
    Server(monkeypatch, CUT_THOUGHT, CUT_THOUGHT, *RIGHT[1:])
    module = FakeModule()
    result = run(module)
    assert not result["failed"] and result["passed"] and result["inconclusive"] == ["thinking"]
    assert result["checks"][0]["state"] == A.INCONCLUSIVE and not result["checks"][0]["passed"]
    assert "inconclusive" in result["msg"] and module.warnings and "thinking" in module.warnings[0]


def test_run_a_server_gone_during_the_gate_is_not_wrong_output(monkeypatch):
    Server(monkeypatch, RIGHT[0], A.ServerGone("Remote end closed connection without response"))
    result = run(FakeModule())
    assert result["failed"] and result["server_gone"] and not result["passed"]
    assert result["failed_check"] == "instant" and result["error"] == "Remote end closed connection without response"
    assert result["checks"][-1]["state"] == "unanswered"
    assert "answers wrongly" not in result["msg"]


def test_run_a_wrong_answer_fails_at_its_check(monkeypatch):
    Server(monkeypatch, RIGHT[0], answer("!!!!!!!!!!!!"))
    result = run(FakeModule())
    assert result["failed"] and not result["server_gone"] and result["failed_check"] == "instant"
    assert "a run of '!'" in result["evidence"]


def test_run_refuses_a_sampling_entry_before_asking(monkeypatch):
    server = Server(monkeypatch)
    result = run(FakeModule(sampling={"thinking": {"temp": 1}}))
    assert result["failed"] and "cannot be asked" in result["msg"] and server.bodies == []
