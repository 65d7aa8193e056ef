"""The simulator's /metrics (sim/sglang/sglang/_sim/metrics.py) as SGLang 0.5.10 serves it with --enable-metrics:
Prometheus text from prometheus_client's multiprocess collector, no API key needed, figures that follow the
requests served, and one set of scheduler series per scheduler that reports (attention-TP rank 0, or every one
with --enable-metrics-for-all-schedulers); the last test, where 0.5.23's collectors differ, as 0.5.23.
tests/oracle/test_metrics.py holds the families against each release's wheel."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from exposition import parse

TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")
EP8DPA = ("--tp-size", "8", "--ep-size", "8", "--dp-size", "8", "--enable-dp-attention", "--mem-fraction-static",
          "0.92", "--cuda-graph-max-bs", "64")
TP4PP2 = ("--tp-size", "4", "--pp-size", "2", "--mem-fraction-static", "0.80")
NAME = "kimi-k2.6"
PLAIN = "text/plain; version=0.0.4; charset=utf-8"
# Requests decode at this time scale (start-up stays at the lab's 0.05): a 1000-token request lasts seconds
SLOW = {"SGLANG_SIM_SERVE_TIME_SCALE": "5.0"}
LONG = {"text": "a long answer", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}




def value(families: dict, sample: str, **labels) -> float:
    family = next(f for n, f in families.items() if sample == n or sample.startswith(n + "_"))
    found = [v for name, lab, v in family["samples"] if name == sample and all(lab.get(k) == w
                                                                               for k, w in labels.items())]
    assert len(found) == 1, (sample, labels, found)
    return found[0]


def series(families: dict, name: str) -> list[dict]:
    return [labels for _, labels, _ in families[name]["samples"]]


def scrape(srv, headers: dict | None = None) -> dict:
    code, body = srv.get("/metrics", headers)
    assert code == 200, body[:500]
    return parse(body.decode())


def post(srv, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url(path), data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            return r.status, (json.loads(raw) if not body.get("stream") else raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chat(srv, content: str, **extra) -> tuple[int, dict]:
    return post(srv, "/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": content}],
                                              **extra})


# --- tests ----------------------------------------------------------------------------------------------------

def test_without_enable_metrics_there_is_no_metrics_route(lab):
    srv = lab.start(*TP8)
    srv.wait_ready()
    for path in ("/metrics", "/metrics/"):
        code, body = srv.get(path)
        assert (code, json.loads(body)) == (404, {"detail": "Not Found"})


def test_metrics_need_no_api_key_and_other_routes_still_do(lab):
    srv = lab.start(*TP8, "--enable-metrics", "--api-key", "sk-lab", "--served-model-name", NAME)
    srv.wait_ready()
    assert srv.get("/v1/models")[0] == 401
    req = urllib.request.Request(srv.url("/metrics"))
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and r.headers["content-type"] == PLAIN
        families = parse(r.read().decode())
    assert srv.get("/metrics", {"Authorization": "Bearer wrong"})[0] == 200
    assert srv.get("/v1/models", {"Authorization": "Bearer sk-lab"})[0] == 200
    assert post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})[0] == 401
    # the metrics middleware runs inside the API-key one: a refused request is not counted
    families = scrape(srv)
    counted = {(lab_["endpoint"], lab_["method"]) for lab_ in series(families, "sglang:http_requests_total")}
    assert ("/v1/models", "GET") in counted and ("/v1/chat/completions", "POST") not in counted
    assert value(families, "sglang:http_responses_total", endpoint="/v1/models", method="GET",
                 status_code="200") == 1


def test_counters_and_histograms_follow_the_requests_served(lab):
    srv = lab.start(*TP8, "--ep-size", "4", "--enable-metrics", "--served-model-name", NAME)
    srv.wait_ready()
    before = scrape(srv)
    # after the warm-up the tokenizer's families are there (its counts are left out), the schedulers' too
    assert value(before, "sglang:num_requests_total", model_name=NAME) == 0
    assert "sglang:inter_token_latency_seconds" not in before  # the warm-up was not streamed, 8 tokens
    assert before["sglang:prompt_tokens_total"]["type"] == "counter"
    assert before["sglang:time_to_first_token_seconds"]["type"] == "histogram"
    assert before["sglang:num_running_reqs"]["type"] == "gauge"
    code, answer = chat(srv, "How are you?", max_tokens=8)
    assert code == 200
    streamed = post(srv, "/generate", {"text": "Tell me a story", "stream": True,
                                       "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})[1]
    assert streamed.rstrip().endswith("data: [DONE]")
    # The middleware counts a streamed response once its last chunk is written, in the server's thread, which may
    # come after the client read [DONE] (as in SGLang, whose middleware counts in a finally after the stream): the
    # scrape is asked again until it did, a second at most.
    scrapes, deadline = 2, time.monotonic() + 1.0
    after = scrape(srv)
    while value(after, "sglang:http_responses_total", endpoint="/generate", method="POST",
                status_code="200") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        after, scrapes = scrape(srv), scrapes + 1
    usage = answer["usage"]
    prompt = usage["prompt_tokens"] + (len("Tell me a story") + 3) // 4
    assert value(after, "sglang:prompt_tokens_total", model_name=NAME) == prompt
    assert value(after, "sglang:generation_tokens_total", model_name=NAME) == usage["completion_tokens"] + 120
    assert value(after, "sglang:num_requests_total", model_name=NAME) == 2
    assert value(after, "sglang:e2e_request_latency_seconds_count", model_name=NAME) == 2
    assert value(after, "sglang:time_to_first_token_seconds_count", model_name=NAME) == 2
    # the streamed request outputs every token: 119 after its first; the 8-token one only at its end
    assert value(after, "sglang:inter_token_latency_seconds_count", model_name=NAME) == 119
    assert 0 < value(after, "sglang:inter_token_latency_seconds_sum", model_name=NAME) < \
        value(after, "sglang:e2e_request_latency_seconds_sum", model_name=NAME)
    for name, family in after.items():
        if family["type"] != "histogram":
            continue
        buckets = [(labels["le"], v) for s, labels, v in family["samples"] if s == name + "_bucket"]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == "+Inf", name
        assert buckets[-1][1] == value(after, name + "_count", model_name=NAME), name
    assert value(after, "sglang:http_requests_total", endpoint="/v1/chat/completions", method="POST") == 1
    assert value(after, "sglang:http_responses_total", endpoint="/generate", method="POST", status_code="200") == 2
    assert value(after, "sglang:http_requests_total", endpoint="/metrics", method="GET") == scrapes  # this one too
    assert value(after, "sglang:num_running_reqs", tp_rank="0") == 0
    max_tokens = value(after, "sglang:max_total_num_tokens", tp_rank="0")
    info = json.loads(srv.get("/server_info")[1])
    assert max_tokens == info["max_total_num_tokens"] > 0
    assert value(after, "sglang:cache_config_info", page_size="1", num_pages=str(int(max_tokens))) == 1


def test_running_requests_show_in_the_scheduler_gauges(lab):
    srv = lab.start(*TP8, "--enable-metrics", "--served-model-name", NAME, env=SLOW)
    srv.wait_ready()
    worker = threading.Thread(target=post, args=(srv, "/generate", LONG))
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            families = scrape(srv)
            used = value(families, "sglang:num_used_tokens", tp_rank="0")
            if used > 10 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert value(families, "sglang:num_running_reqs", tp_rank="0") == 1
        assert value(families, "sglang:num_queue_reqs", tp_rank="0") == 0
        total = value(families, "sglang:max_total_num_tokens", tp_rank="0")
        assert value(families, "sglang:token_usage", tp_rank="0") == pytest.approx(used / total)
        assert value(families, "sglang:gen_throughput", tp_rank="0") > 0
        assert value(families, "sglang:http_requests_active", endpoint="/generate", method="POST") == 1
    finally:
        worker.join(60)
    families = scrape(srv)
    assert value(families, "sglang:num_running_reqs", tp_rank="0") == 0
    assert value(families, "sglang:num_used_tokens", tp_rank="0") == 0
    assert value(families, "sglang:gen_throughput", tp_rank="0") == 0
    assert value(families, "sglang:http_requests_active", endpoint="/generate", method="POST") == 0


SCHEDULER_LABELS = ["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"]


@pytest.mark.parametrize("flags, expected", [
    # no DP attention: attention TP spans the 8 ranks, only TP0 reports
    (TP8, [{"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}]),
    ((*TP8, "--enable-metrics-for-all-schedulers"),
     [{"tp_rank": str(t), "pp_rank": "0", "moe_ep_rank": "0"} for t in range(8)]),
    # each pipeline stage has its TP0
    (TP4PP2, [{"tp_rank": "0", "pp_rank": str(p), "moe_ep_rank": "0"} for p in range(2)]),
    # DP attention over 8: attention TP size 1, every rank is attention-TP rank 0 (the flag changes nothing)
    (EP8DPA, [{"tp_rank": str(t), "pp_rank": "0", "moe_ep_rank": str(t), "dp_rank": str(t)} for t in range(8)]),
], ids=["tp8", "tp8-all-schedulers", "tp4pp2", "ep8-dp8-dp-attention"])
def test_which_schedulers_report(lab, flags, expected):
    srv = lab.start(*flags, "--enable-metrics", "--served-model-name", NAME)
    srv.wait_ready(40)
    families = scrape(srv)
    for name in ("sglang:num_running_reqs", "sglang:max_total_num_tokens", "sglang:token_usage"):
        got = series(families, name)
        assert got == [{"model_name": NAME, "engine_type": "unified", **e} for e in expected], name
    assert [sorted(s) for s in series(families, "sglang:num_retracted_reqs")] == \
        [sorted([*SCHEDULER_LABELS, *(["dp_rank"] if "dp_rank" in expected[0] else []), "pid"])] * len(expected)
    assert len(series(families, "sglang:routing_key_all_req_count")) == 11 * len(expected)
    assert len(series(families, "sglang:cache_config_info")) == 1
    # /server_info reports both switches as SGLang's does (every ServerArgs field): the readiness check compares
    # the unit's metrics flags with it, and a field left out is a start that never counts as ready (ep8dpa's)
    info = json.loads(srv.get("/server_info")[1])
    assert (info["enable_metrics"], info["enable_metrics_for_all_schedulers"]) == (
        True, "--enable-metrics-for-all-schedulers" in flags)


def test_dp_ranks_take_requests_in_turn(lab):
    srv = lab.start(*EP8DPA, "--enable-metrics", "--served-model-name", NAME, env=SLOW)
    srv.wait_ready(40)
    body = {**LONG, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # 65 tok/s each here
    workers = [threading.Thread(target=post, args=(srv, "/generate", body)) for _ in range(3)]
    for w in workers:
        w.start()
        time.sleep(0.2)
    try:
        families = scrape(srv)
        running = {s["dp_rank"]: v for _, s, v in families["sglang:num_running_reqs"]["samples"]}
        assert running == {str(d): (1.0 if d < 3 else 0.0) for d in range(8)}
        loads = json.loads(srv.get("/v1/loads")[1])
        assert [e["num_running_reqs"] for e in loads["loads"]] == [1, 1, 1, 0, 0, 0, 0, 0]
    finally:
        for w in workers:
            w.join(60)


def test_openmetrics_and_gzip_as_prometheus_client_negotiates_them(lab):
    srv = lab.start(*TP8, "--enable-metrics", "--served-model-name", NAME)
    srv.wait_ready()
    # what Prometheus 2 sends: OpenMetrics without an escaping parameter, gzip
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    req = urllib.request.Request(srv.url("/metrics"), headers={"Accept": accept, "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["content-type"] == \
            "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
        assert r.headers["content-encoding"] == "gzip"
        text = gzip.decompress(r.read()).decode()
    assert text.endswith("# EOF\n")
    # prometheus_client 0.26 (so SGLang 0.5.10) escapes the samples' names, not the HELP/TYPE lines' (#1177)
    assert "# TYPE sglang:prompt_tokens counter\n" in text and f'\nsglang_prompt_tokens_total{{model_name="{NAME}"}}' \
        in text
    assert parse(text)["sglang:num_running_reqs"]["type"] == "gauge"
    code, utf8 = srv.get("/metrics", {"Accept": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"})
    assert code == 200 and f'\nsglang:prompt_tokens_total{{model_name="{NAME}"}}' in utf8.decode()
    code, plain = srv.get("/metrics", {"Accept": "text/plain;version=1.0.0"})
    assert code == 200 and "# TYPE sglang:prompt_tokens_total counter\n" in plain.decode()


def test_a_client_that_goes_away_leaves_no_request_running_and_none_finished(lab):
    srv = lab.start(*TP8, "--enable-metrics", "--served-model-name", NAME, env=SLOW)
    srv.wait_ready()
    body = json.dumps({**LONG, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert b"200 OK" in conn.recv(4096)
        time.sleep(0.3)
        families = scrape(srv)
        assert value(families, "sglang:num_running_reqs", tp_rank="0") == 1
    deadline = time.monotonic() + 20
    while value(scrape(srv), "sglang:num_running_reqs", tp_rank="0") and time.monotonic() < deadline:
        time.sleep(0.1)
    families = scrape(srv)
    assert value(families, "sglang:num_running_reqs", tp_rank="0") == 0
    assert value(families, "sglang:num_requests_total", model_name=NAME) == 0  # aborted, not finished
    assert value(families, "sglang:http_requests_active", endpoint="/generate", method="POST") == 0
    assert value(families, "sglang:http_responses_total", endpoint="/generate", method="POST", status_code="200") == 2


def test_as_0_5_23_the_families_are_that_releases(lab):
    """0.5.23's collectors: every scheduler emits its constants at start (max_total_num_tokens, memory by kind,
    graph memory by phase, page_size, num_pages, context_len; no cache_config_info), only the reporting one its
    stats; the tokenizer's series carry engine_type, the request families is_streaming, a finished request is also
    a TPOT and three token-count observations, and there is no num_retractions."""
    srv = lab.start(*TP8, "--enable-metrics", "--served-model-name", NAME, release="0.5.23")
    srv.wait_ready()
    before = scrape(srv)
    assert "sglang:cache_config_info" not in before and "sglang:num_retractions" not in before
    ranks = [{"model_name": NAME, "engine_type": "unified", "tp_rank": str(t), "pp_rank": "0", "moe_ep_rank": "0"}
             for t in range(8)]
    assert series(before, "sglang:max_total_num_tokens") == ranks
    assert series(before, "sglang:num_running_reqs") == ranks[:1]  # log_stats: attention-TP rank 0
    assert len(series(before, "sglang:graph_memory_usage_gb")) == 6 * 8
    info = json.loads(srv.get("/server_info")[1])
    max_tokens = value(before, "sglang:max_total_num_tokens", tp_rank="3")
    assert max_tokens == info["max_total_num_tokens"] == value(before, "sglang:num_pages", tp_rank="3")
    assert value(before, "sglang:page_size", tp_rank="0") == 1
    assert value(before, "sglang:context_len", tp_rank="0") == info["context_length"]
    assert value(before, "sglang:weight_memory_usage_gb", tp_rank="0") > 0
    assert value(before, "sglang:graph_memory_usage_gb", tp_rank="0", phase="decode") > 0
    tokenizer = {"model_name": NAME, "engine_type": "unified"}
    assert series(before, "sglang:num_requests_total") == [{**tokenizer, "is_streaming": "false"}]  # the warm-up
    code, answer = chat(srv, "How are you?", max_tokens=8)
    assert code == 200
    post(srv, "/generate", {"text": "Tell me a story", "stream": True,
                            "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})
    after = scrape(srv)
    for streamed in ("false", "true"):
        assert value(after, "sglang:num_requests_total", is_streaming=streamed) == 1
        assert value(after, "sglang:time_to_first_token_seconds_count", is_streaming=streamed) == 1
        assert value(after, "sglang:request_time_per_output_token_seconds_count", is_streaming=streamed) == 1
    assert value(after, "sglang:generation_tokens_total", is_streaming="true") == 120
    assert [labels for s, labels, _ in after["sglang:inter_token_latency_seconds"]["samples"]
            if s.endswith("_count")] == [tokenizer]
    assert value(after, "sglang:inter_token_latency_seconds_count") == 119
    assert value(after, "sglang:prompt_tokens_histogram_count") == 2
    assert value(after, "sglang:generation_tokens_histogram_sum") == 120 + answer["usage"]["completion_tokens"]
