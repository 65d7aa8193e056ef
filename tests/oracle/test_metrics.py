"""The simulator's /metrics is SGLang's, as each supported release: every family the simulator exports as a release
is one that release's wheel defines, with its type, HELP text, label names and buckets; and for the same flags and
requests, SGLang's own collectors (one process per scheduler, one for the tokenizer, merged by prometheus_client's
multiprocess collector: tests/oracle/metrics_driver.py) answer with the same families and series — which schedulers
report, with which rank labels — and the same request counts (SERIES_RELEASES: the releases whose process layout and
collectors metrics_driver.py reproduces). The route needs no API key in both, and the content types are
prometheus_client's. The comparisons are shown to catch a wrong family, type, label or bucket."""

from __future__ import annotations

import copy
import functools
import json

import env
import oracle
import pytest
from exposition import parse
from metrics import compare_expositions, compare_families, family_of, simulator, wheel_families

NAME = "kimi-k2.6"
BASE = ["--model-path", "model", "--enable-metrics", "--served-model-name", NAME]
TP8 = ["--tp-size", "8", "--mem-fraction-static", "0.8"]
SCENARIOS = {
    "tp8ep4": [*BASE, *TP8, "--ep-size", "4", "--api-key", "sk-lab"],
    "tp8, all schedulers": [*BASE, *TP8, "--enable-metrics-for-all-schedulers"],
    "tp4pp2": [*BASE, "--tp-size", "4", "--pp-size", "2", "--mem-fraction-static", "0.80"],
    "ep8 dp8 DP attention": [*BASE, "--tp-size", "8", "--ep-size", "8", "--dp-size", "8", "--enable-dp-attention",
                             "--mem-fraction-static", "0.92", "--cuda-graph-max-bs", "64"],
}
# The same servers spelled for 0.5.23 (attention DP and the decode CUDA graph by their new names)
SCENARIOS_0_5_23 = {**SCENARIOS, "ep8 dp8 DP attention": [
    *BASE, "--tp-size", "8", "--ep-size", "8", "--attn-dp-size", "8", "--mem-fraction-static", "0.92",
    "--cuda-graph-max-bs-decode", "64"]}
SCENARIOS_BY_RELEASE = {"0.5.10": SCENARIOS, "0.5.23": SCENARIOS_0_5_23}
RELEASES = env.supported()
SERIES_RELEASES = ("0.5.10",)
REPORTING = {"tp8ep4": 1, "tp8, all schedulers": 8, "tp4pp2": 2, "ep8 dp8 DP attention": 8}
KEY = {"Authorization": "Bearer sk-lab"}
# The simulator's warm-up request as SGLang's tokenizer would have counted it (the simulator leaves its counts
# out: sim/sglang/README.md): 7 prompt tokens, 8 generated, not streamed.
WARMUP = {"prompt_tokens": 7, "completion_tokens": 8, "stream": False}
# What a Prometheus 2 scrape sends (OpenMetrics, no escaping parameter: prometheus_client picks underscores, and its
# sample lines then read sglang_token_usage: prometheus/client_python#1177), and one that asks for UTF-8 names
PROMETHEUS2 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
               "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
UTF8 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
ACCEPTS = ["", "text/plain", "text/plain;version=1.0.0", "text/plain;version=1.0.0;escaping=dots",
           "application/openmetrics-text", PROMETHEUS2, UTF8]
COMPARED = ("", "text/plain;version=1.0.0;escaping=dots", PROMETHEUS2, UTF8)
AUTH_PATHS = [("GET", "/metrics"), ("GET", "/metrics/anything"), ("POST", "/metrics"), ("GET", "/health"),
              ("GET", "/v1/models"), ("GET", "/server_info"), ("POST", "/generate")]
COUNTS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
          "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_count",
          "sglang:e2e_request_latency_seconds_count", "sglang:num_retractions_count")


def _meta(raw: bytes, stream: bool) -> dict:
    if not stream:
        return json.loads(raw)["meta_info"]
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: {")]
    return json.loads(events[-1])["meta_info"]


def _run(name: str, args: list[str], release: str) -> dict:
    """The scenario on the simulator as ``release``: its requests (those of the first scenario), its /metrics
    answers."""
    out = {"requests": [WARMUP], "auth": [], "answers": {}}
    with simulator(args, release) as sim:
        headers = KEY if "--api-key" in args else {}
        if name == "tp8ep4":
            for method, path in AUTH_PATHS:  # no key
                out["auth"].append(sim.request(method, path, {} if method == "POST" else None)[0] != 401)
            code, _, raw = sim.request("POST", "/v1/chat/completions", {
                "model": NAME, "messages": [{"role": "user", "content": "How are you?"}], "max_tokens": 8}, headers)
            usage = json.loads(raw)["usage"]
            out["requests"].append({"prompt_tokens": usage["prompt_tokens"],
                                    "completion_tokens": usage["completion_tokens"], "stream": False})
            for stream in (True, False):  # 120 tokens: streamed, each token an output; else one every 50
                code, _, raw = sim.request("POST", "/generate", {
                    "text": "Tell me a story", "stream": stream,
                    "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}}, headers)
                assert code == 200
                meta = _meta(raw, stream)
                out["requests"].append({"prompt_tokens": meta["prompt_tokens"],
                                        "completion_tokens": meta["completion_tokens"], "stream": stream})
        info = json.loads(sim.request("GET", "/server_info", headers=headers)[2])
        out["num_pages"] = info["max_total_num_tokens"] // (info.get("page_size") or 1)
        for accept in ACCEPTS:
            code, got, body = sim.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
            assert code == 200
            out["answers"][accept] = {"content_type": got["content-type"], "text": body.decode()}
    return out


def scenarios(release: str) -> dict[str, list[str]]:
    assert release in SCENARIOS_BY_RELEASE, f"SGLang {release}: spell the scenarios for it (SCENARIOS_BY_RELEASE)"
    return SCENARIOS_BY_RELEASE[release]


@functools.cache
def sim_runs(release: str) -> dict:
    """Each scenario on the simulator as ``release``."""
    return {name: _run(name, args, release) for name, args in scenarios(release).items()}


@functools.cache
def runs(release: str) -> dict:
    """Each scenario on the simulator as ``release`` and, in one driver run, that release's answers for the same
    flags and requests."""
    sims = sim_runs(release)
    asks = [{"op": "metrics", "argv": args, "model_config": oracle.model_config(oracle.SIM_K26_CONFIG),
             "requests": sims[name]["requests"], "num_pages": sims[name]["num_pages"], "accept": ACCEPTS}
            for name, args in scenarios(release).items()]
    asks.append({"op": "auth", "api_key": "sk-lab", "requests": [[m, p, None] for m, p in AUTH_PATHS]})
    asks += [{"op": "parse_metrics", "text": sims[name]["answers"][accept]["text"],
              "openmetrics": accept == UTF8} for name in SCENARIOS for accept in ("", UTF8)]
    answers = oracle.ask(asks, release)
    real = dict(zip(SCENARIOS, answers[:len(SCENARIOS)], strict=True))
    assert all(a.get("ok") for a in real.values()), [a.get("error") for a in real.values()]
    parsed = answers[len(SCENARIOS) + 1:]
    return {"release": release, "sim": sims, "real": real, "auth": answers[len(SCENARIOS)]["allowed"],
            "parsed": dict(zip([(n, a) for n in SCENARIOS for a in ("", UTF8)], parsed, strict=True))}


@pytest.fixture(scope="module", params=SERIES_RELEASES)
def both(request):
    return runs(request.param)


def _without_http(families: dict) -> dict:
    """The HTTP middleware's families count the requests each side happened to get (health probes while starting):
    compared by definition only."""
    return {n: f for n, f in families.items()
            if not n.replace("__", "_").startswith(("sglang:http_", "sglang:routing_keys_active"))}


@pytest.mark.parametrize("release", RELEASES)
def test_every_family_the_simulator_exports_is_one_the_wheel_defines(release):
    wheel = wheel_families(release)
    problems, seen = [], set()
    for name, sim in sim_runs(release).items():
        families = parse(sim["answers"][""]["text"])
        seen |= set(families)
        problems += [f"{name}: {p}" for p in compare_families(families, wheel)]
    assert not problems, "\n".join(problems)
    must = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens", "sglang:token_usage",
            "sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:max_total_num_tokens",
            "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
            "sglang:e2e_request_latency_seconds", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
            "sglang:num_requests_total", "sglang:http_requests_total"}
    assert must <= seen, must - seen
    assert {wheel[n]["type"] for n in must} == {"gauge", "histogram", "counter"}
    assert family_of("sglang:e2e_request_latency_seconds_bucket", wheel) == "sglang:e2e_request_latency_seconds"
    assert family_of("sglang:prompt_tokens_total", wheel) == "sglang:prompt_tokens_total"
    assert family_of("sglang:prompt_tokens", wheel) is None and family_of("sglang:num_running_requests", wheel) is None


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_same_server_answers_as_sglangs_collectors_do(both, name):
    """Same families, the same series (which schedulers report, their rank labels, the tokenizer's), the same
    request counts (SGLang's also counting the warm-up the simulator leaves out)."""
    sim, real = both["sim"][name], both["real"][name]
    for accept in COMPARED:
        ours = _without_http(parse(sim["answers"][accept]["text"]))
        theirs = parse(real["answers"][accept]["text"])
        problems = compare_expositions(ours, theirs)
        assert not problems, f"Accept {accept!r}:\n" + "\n".join(problems)
    ours, theirs = parse(sim["answers"][""]["text"]), parse(real["answers"][""]["text"])
    for sample in COUNTS:
        family = family_of(sample, wheel_families(both["release"]))
        mine = [v for s, _, v in ours.get(family, {"samples": []})["samples"] if s == sample]
        real_values = [v for s, _, v in theirs.get(family, {"samples": []})["samples"] if s == sample]
        warmup = {"sglang:prompt_tokens_total": 7, "sglang:generation_tokens_total": 8}.get(sample, 1)
        if sample == "sglang:inter_token_latency_seconds_count":
            warmup = 0  # 8 tokens, not streamed: one output, its first
        assert [v + warmup for v in mine] == real_values, sample
    reporting = [s for s in real["schedulers"] if s["enabled"]]
    assert len(reporting) == REPORTING[name]
    series = [labels for _, labels, _ in ours["sglang:num_running_reqs"]["samples"]]
    assert series == [s["labels"] for s in reporting]


def test_the_simulators_text_is_read_by_prometheus_clients_own_parsers(both):
    for (name, accept), answer in both["parsed"].items():
        assert answer.get("ok"), f"{name}, Accept {accept!r}: {answer.get('error')}"
        ours = parse(both["sim"][name]["answers"][accept]["text"])
        # the parsers name a counter's family without its _total, as OpenMetrics does
        assert set(answer["families"]) == {n.removesuffix("_total") if f["type"] == "counter" else n
                                           for n, f in ours.items()}


def test_content_types_are_prometheus_clients(both):
    for name in SCENARIOS:
        for accept in ACCEPTS:
            assert both["sim"][name]["answers"][accept]["content_type"] == \
                both["real"][name]["answers"][accept]["content_type"], (name, accept)


def test_a_prometheus_2_scrape_gets_underscored_sample_names_from_both(both):
    """prometheus/client_python#1177, in SGLang 0.5.10 with prometheus_client 0.26 and so in the simulator: an
    OpenMetrics answer with escaping=underscores names its samples sglang_..., its HELP/TYPE lines sglang:...; a
    scraper asking for allow-utf-8 names (or the plain text format) gets sglang:... throughout."""
    for side in ("sim", "real"):
        text = both[side]["tp8ep4"]["answers"][PROMETHEUS2]["text"]
        assert "# TYPE sglang:token_usage gauge\n" in text and "\nsglang_token_usage{" in text, side
        assert "\nsglang:token_usage{" not in text, side
        assert "\nsglang:token_usage{" in both[side]["tp8ep4"]["answers"][UTF8]["text"], side


def test_metrics_need_no_api_key_as_in_sglang(both):
    """utils/auth.py decide_request_auth: /health* and /metrics* are let in without the key, the rest is not."""
    assert both["sim"]["tp8ep4"]["auth"] == both["auth"]
    assert both["auth"][:4] == [True] * 4 and not any(both["auth"][4:])


def test_the_comparisons_catch_what_is_wrong(both):
    """A wrong name, type, HELP text, label, pid, bucket, or a scheduler too many: each is reported."""
    wheel = wheel_families(both["release"])
    good = parse(both["sim"]["tp8ep4"]["answers"][""]["text"])
    assert compare_families(good, wheel) == []
    cases = {}
    bad = copy.deepcopy(good)
    bad["sglang:num_running_requests"] = bad.pop("sglang:num_running_reqs")
    cases["sglang:num_running_requests: no such family"] = bad
    bad = copy.deepcopy(good)
    bad["sglang:num_queue_reqs"]["type"] = "counter"
    cases["sglang:num_queue_reqs: type counter"] = bad
    bad = copy.deepcopy(good)
    bad["sglang:token_usage"]["help"] = "Token usage."
    cases["sglang:token_usage: HELP"] = bad
    bad = copy.deepcopy(good)
    bad["sglang:num_requests_total"]["samples"][0][1]["engine_type"] = "unified"
    cases["sglang:num_requests_total: series labels"] = bad
    bad = copy.deepcopy(good)
    bad["sglang:num_paused_reqs"]["samples"][0][1].pop("pid")
    cases["sglang:num_paused_reqs: series"] = bad
    bad = copy.deepcopy(good)
    samples = bad["sglang:time_to_first_token_seconds"]["samples"]
    samples.remove(next(s for s in samples if s[1].get("le") == "0.4"))
    cases["sglang:time_to_first_token_seconds{'model_name': 'kimi-k2.6'}: buckets"] = bad
    for expected, families in cases.items():
        problems = compare_families(families, wheel)
        assert any(p.startswith(expected) for p in problems), (expected, problems)
    theirs = parse(both["real"]["tp8ep4"]["answers"][""]["text"])
    extra = copy.deepcopy(_without_http(good))
    name, labels, value = extra["sglang:gen_throughput"]["samples"][0]
    extra["sglang:gen_throughput"]["samples"].append((name, {**labels, "tp_rank": "1"}, value))
    assert any("tp_rank" in p and "only in ours" in p for p in compare_expositions(extra, theirs))
    fewer = copy.deepcopy(_without_http(good))
    fewer["sglang:prompt_tokens_total"]["samples"][0] = ("sglang:prompt_tokens_total", {"model_name": NAME}, 1.0)
    assert compare_expositions(fewer, theirs, values=("sglang:prompt_tokens_total",))
