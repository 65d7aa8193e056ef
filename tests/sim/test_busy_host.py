"""Healthy hosts that look sick, as SGLang 0.5.10 shows them: a long prefill in chunks (one scheduler line per chunk,
decoding and /health waiting behind each batch), decode lines every --decode-log-interval batches, Kimi K2.6
thoughts of realistic length that share max_tokens, and prompts longer than the server holds refused.

Speeds are the simulator's knobs: SGLANG_SIM_SERVE_TIME_SCALE=60 runs requests in real time, so a prompt of N
tokens at SGLANG_SIM_PREFILL_TOKENS_PER_S=S prefills in N/S wall seconds; no assertion reads a clock."""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.error
import urllib.request

from sglang._sim import chat as C

TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")
PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
REAL_TIME = {"SGLANG_SIM_SERVE_TIME_SCALE": "60"}
PREFILL = re.compile(r"^\[[^\]]* TP0\] Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: 0, "
                     r"token usage: \d+\.\d\d, #running-req: \d+, #queue-req: \d+, cuda graph: False, "
                     r"input throughput \(token/s\): \d+\.\d\d$", re.M)
DECODE = re.compile(r"^\[[^\]]* TP0\] Decode batch, #running-req: \d+, #token: \d+, token usage: \d+\.\d\d, "
                    r"cuda graph: (True|False), gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$", re.M)


def post(srv, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url(path), data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def in_background(srv, path: str, body: dict) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(post(srv, path, body)), daemon=True)
    t.start()
    return t, out


def long_prompt(tokens: int) -> dict:
    """A prompt of `tokens` tokens, cheap to send: /generate with input_ids (a chat message of 4*tokens characters,
    e.g. "word " repeated, counts the same)."""
    return {"input_ids": [0] * tokens, "sampling_params": {"max_new_tokens": 4}}


def prompt_chunks(log: str) -> list[int]:
    """#new-token of every prefill batch but /health's own one-token ones and the warm-up's."""
    return [int(n) for _, n in PREFILL.findall(log) if int(n) not in (1, 7)]


def wait_prefill_lines(srv, count: int) -> None:
    end = time.time() + 30
    while len(prompt_chunks(srv.log)) < count and time.time() < end:
        time.sleep(0.02)


def wait_taken(srv) -> None:
    """Until the server has the request (/v1/loads counts it)."""
    end = time.time() + 30
    while json.loads(srv.get("/v1/loads")[1])["aggregate"]["total_running_reqs"] < 1 and time.time() < end:
        time.sleep(0.01)


# ---- chunked prefill ---------------------------------------------------------------------------------


def test_a_long_prompt_prefills_in_chunks_one_line_each_and_health_stays_up_between_them(lab, monkeypatch):
    """7500 tokens in chunks of 1000 = 8 batches of 0.3 s: /health (timeout 2 s) is answered after the next chunk
    (the scheduler's maybe_send_health_check_signal), 200 throughout."""
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2")
    srv = lab.start(*TP8, "--chunked-prefill-size", "1000",
                    env={**REAL_TIME, "SGLANG_SIM_PREFILL_TOKENS_PER_S": "3000"})
    srv.wait_ready()
    t, out = in_background(srv, "/generate", long_prompt(7500))
    wait_prefill_lines(srv, 1)
    assert srv.get("/health")[0] == 200  # during the prefill: no new-seq line of its own, it rode a chunk
    t.join(30)
    assert out[0][0] == 200 and out[0][1]["meta_info"]["prompt_tokens"] == 7500
    assert prompt_chunks(srv.log) == [1000] * 7 + [500]  # ceil(7500 / 1000) lines
    assert len(prompt_chunks(srv.log)) == math.ceil(7500 / 1000)


def test_one_prefill_batch_longer_than_the_health_timeout_fails_health_until_it_ends(lab, monkeypatch):
    """Unchunked (--chunked-prefill-size -1), 7500 tokens at 2500 tok/s is one 3 s batch: /health's one-token
    request waits behind it and nothing comes back within SGLANG_HEALTH_CHECK_TIMEOUT (1 s): 503 with SGLang's
    line. Once the batch is over, 200 again."""
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")
    srv = lab.start(*TP8, "--chunked-prefill-size", "-1",
                    env={**REAL_TIME, "SGLANG_SIM_PREFILL_TOKENS_PER_S": "2500"})
    srv.wait_ready()
    t, out = in_background(srv, "/generate", long_prompt(7500))
    wait_taken(srv)
    assert srv.get("/health")[0] == 503
    assert "Health check failed. Server couldn't get a response from detokenizer for last 1 seconds." in srv.log
    t.join(30)
    assert out[0][0] == 200
    assert prompt_chunks(srv.log) == [7500]
    assert srv.get("/health")[0] == 200


def test_with_health_generation_off_health_is_a_plain_200_even_behind_a_long_batch(lab, monkeypatch):
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")
    srv = lab.start(*TP8, "--chunked-prefill-size", "-1",
                    env={**REAL_TIME, "SGLANG_SIM_PREFILL_TOKENS_PER_S": "2500",
                         "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"})
    srv.wait_ready()
    t, out = in_background(srv, "/generate", long_prompt(7500))
    wait_taken(srv)
    assert srv.get("/health")[0] == 200
    assert "Health check failed" not in srv.log
    assert srv.get("/health_generate")[0] == 503  # the switch is /health's only
    t.join(30)
    assert out[0][0] == 200
    assert PREFILL.findall(srv.log)[-1] == ("1", "7500")  # /health_generate's request rode the same batch


def test_an_idle_servers_health_check_is_a_one_token_prefill(lab):
    srv = lab.start(*TP8)
    srv.wait_ready()
    before = len(PREFILL.findall(srv.log))
    assert srv.get("/health")[0] == 200
    lines = PREFILL.findall(srv.log)
    assert len(lines) == before + 1 and lines[-1] == ("1", "1")


def test_a_200k_token_prompt_prefills_where_the_kv_pool_holds_it_and_is_refused_where_not(lab):
    """K2.6's context is 262144; the KV pool of TP8 on 96 GB GPUs holds 32809 tokens, so SGLang refuses a 200k
    prompt there (max_req_input_len); 8x H200 hold it, in ceil(200000 / 8192) chunks."""
    srv = lab.start(*TP8)
    srv.wait_ready()
    code, body = post(srv, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "word " * 160000}], "max_tokens": 8})
    assert code == 400
    assert body["message"].startswith("Input length (200000 tokens) exceeds the maximum allowed length (")
    srv.stop()
    lab.spec.write_text(json.dumps({"count": 8, "name": "NVIDIA H200", "memory_total_mib": 143771,
                                    "torch_total_gib": 139.8, "compute_cap": "9.0", "pcie_only": False}))
    big = lab.start(*TP8)
    big.wait_ready()
    code, body = post(big, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "word " * 160000}], "max_tokens": 8,
                       "chat_template_kwargs": {"thinking": False}})
    assert code == 200 and body["usage"]["prompt_tokens"] == 200000
    assert prompt_chunks(big.log) == [8192] * 24 + [200000 - 24 * 8192]
    code, body = post(big, "/generate", long_prompt(262144))
    assert code == 400 and "longer than the model's context length (262144 tokens)" in body["error"]["message"]


# ---- decode lines ---------------------------------------------------------------------------------------


def test_decode_lines_come_every_decode_log_interval_batches(lab):
    srv = lab.start(*TP8, "--decode-log-interval", "10")
    srv.wait_ready()
    code, _ = post(srv, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}})
    assert code == 200
    lines = DECODE.findall(srv.log)
    assert len(lines) == 200 // 10  # one request: each of its tokens is one decode batch
    assert set(lines) == {"True"}


def test_no_decode_line_before_decode_log_interval_batches(lab):
    srv = lab.start(*TP8)  # the default, 40
    srv.wait_ready()
    code, _ = post(srv, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}})
    assert code == 200
    assert DECODE.findall(srv.log) == []


# ---- K2.6 thoughts ----------------------------------------------------------------------------------


def test_thought_lengths_follow_the_distribution_and_the_temperature():
    greedy = {"temperature": 0}
    assert C.thought_tokens(greedy, "p") == C.thought_tokens(greedy, "p")
    sampled = [C.thought_tokens({"temperature": 1.0, "seed": s}, "p") for s in range(2001)]
    assert sorted(sampled)[1000] in range(1000, 1400)  # median ~1200
    assert min(sampled) >= C.THOUGHT_MIN and max(sampled) <= C.THOUGHT_MAX
    assert sum(n > 4096 for n in sampled) > 50  # a 4096 budget is eaten now and then
    assert C.thought_tokens({"temperature": 1.0, "seed": 7}, "p") == C.thought_tokens({"temperature": 1.0, "seed": 7},
                                                                                        "p")
    assert len({C.thought_tokens({"temperature": 1.0}, "p") for _ in range(20)}) > 1  # no seed: sampled


def test_a_thought_cut_by_max_tokens_is_all_reasoning_and_finishes_by_length(lab):
    srv = lab.start(*TP8, *PARSERS)
    srv.wait_ready()
    code, body = post(srv, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 60,
                       "temperature": 0})
    assert code == 200
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert len(choice["message"]["reasoning_content"].split()) == 60 == body["usage"]["completion_tokens"]


def test_at_temperature_0_the_thought_is_the_same_and_realistic_and_then_answers(lab):
    srv = lab.start(*TP8, *PARSERS)
    srv.wait_ready()
    ask = {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 32768, "temperature": 0}
    answers = [post(srv, "/v1/chat/completions", ask)[1] for _ in range(2)]
    assert answers[0]["usage"] == answers[1]["usage"]
    message = answers[0]["choices"][0]["message"]
    assert answers[0]["choices"][0]["finish_reason"] == "stop" and message["content"] == "42"
    assert len(message["reasoning_content"].split()) >= C.THOUGHT_MIN


def test_instant_mode_stays_short(lab):
    srv = lab.start(*TP8, *PARSERS)
    srv.wait_ready()
    code, body = post(srv, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4096,
                       "chat_template_kwargs": {"thinking": False}})
    assert code == 200 and body["choices"][0]["message"]["reasoning_content"] is None
    assert body["usage"]["completion_tokens"] <= 40
