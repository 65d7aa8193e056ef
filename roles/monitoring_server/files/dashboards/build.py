"""Writes moefleet's Grafana dashboards (moefleet-*.json beside this file) from the panel lists below.

    python3 roles/monitoring_server/files/dashboards/build.py          rewrite the JSON files
    python3 roles/monitoring_server/files/dashboards/build.py --check  exit 1 when a JSON file differs from this

The JSON files are what ships (Grafana imports them); this script is where they are edited, and a unit test fails
when the two disagree. Every query reads a metric SGLang 0.5.10, smg 1.13.0, node_exporter or moefleet's collectors
export (the oracle test checks the sglang: names against the wheel), by the labels the scrape targets add (host,
role). Each dashboard asks for its Prometheus datasource (a variable, no hard-coded uid).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
TEMPLATE_DATASOURCE = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                       "current": {}, "hide": 0, "refresh": 1}
TEMPLATE_HOST = {"name": "host", "label": "Host", "type": "query", "datasource": DS,
                 "query": {"query": 'label_values(up{job="node"}, host)', "refId": "host"},
                 "definition": 'label_values(up{job="node"}, host)', "current": {}, "hide": 0, "refresh": 2,
                 "sort": 1}


def p99(family: str, by: str, where: str = "") -> str:
    return f"histogram_quantile(0.99, sum by ({by}, le) (rate({family}_bucket{where}[$__rate_interval])))"


# (title, kind, unit, [(legend, expr)]) per panel; kind: timeseries, stat or table.
FLEET = [
    ("Workers answering", "stat", "none", [("answering", 'sum(up{job="sglang"})'),
                                           ("scraped", 'count(up{job="sglang"})')]),
    ("Hosts serving the asked profile", "stat", "none",
     [("as asked", 'sum(moefleet_serving_as_asked{role="worker"})'),
      ("workers", 'count(moefleet_serving_as_asked{role="worker"})')]),
    ("Alerts firing", "stat", "none", [("firing", 'count(ALERTS{alertstate="firing"}) or vector(0)')]),
    ("What each host serves", "table", "none",
     [("", 'moefleet_host_info{role="worker"}')]),
    ("Running requests", "timeseries", "none", [("{{host}}", "sum by (host) (sglang:num_running_reqs)")]),
    ("Queued requests", "timeseries", "none", [("{{host}}", "sum by (host) (sglang:num_queue_reqs)")]),
    ("KV cache use", "timeseries", "percentunit", [("{{host}}", "max by (host) (sglang:token_usage)")]),
    ("Generation throughput", "timeseries", "none",
     [("{{host}} tok/s", "sum by (host) (sglang:gen_throughput)")]),
    ("Time to first token, p99", "timeseries", "s",
     [("{{host}}", p99("sglang:time_to_first_token_seconds", "host"))]),
    ("Time between tokens, p99", "timeseries", "s",
     [("{{host}}", p99("sglang:inter_token_latency_seconds", "host"))]),
    ("Tokens per second (prompt, generated)", "timeseries", "none",
     [("{{host}} prompt", "sum by (host) (rate(sglang:prompt_tokens_total[$__rate_interval]))"),
      ("{{host}} generated", "sum by (host) (rate(sglang:generation_tokens_total[$__rate_interval]))")]),
    ("Failures while serving (kept)", "timeseries", "none",
     [("{{host}} {{state}}", 'sum by (host, state) (moefleet_runtime_failures{role="worker"})')]),
    ("Hottest GPU", "timeseries", "celsius", [("{{host}}", "max by (host) (DCGM_FI_DEV_GPU_TEMP)")]),
    ("Last Xid per host (0: none since boot)", "timeseries", "none",
     [("{{host}}", "max by (host) (DCGM_FI_DEV_XID_ERRORS)")]),
]

HOST = [
    ("What the host serves", "table", "none", [("", 'moefleet_host_info{host="$host"}')]),
    ("Last rollback", "stat", "dateTimeFromNow",
     [("", 'moefleet_last_rollback_timestamp_seconds{host="$host"} * 1000')]),
    ("Running and queued requests", "timeseries", "none",
     [("running", 'sum(sglang:num_running_reqs{host="$host"})'),
      ("queued", 'sum(sglang:num_queue_reqs{host="$host"})')]),
    ("KV cache use by rank", "timeseries", "percentunit",
     [("tp {{tp_rank}}", 'sglang:token_usage{host="$host"}')]),
    ("Prefix cache hit rate", "timeseries", "percentunit",
     [("tp {{tp_rank}}", 'sglang:cache_hit_rate{host="$host"}')]),
    ("Latency (p99): first token, between tokens, whole request", "timeseries", "s",
     [("first token", p99("sglang:time_to_first_token_seconds", "host", '{host="$host"}')),
      ("between tokens", p99("sglang:inter_token_latency_seconds", "host", '{host="$host"}')),
      ("request", p99("sglang:e2e_request_latency_seconds", "host", '{host="$host"}'))]),
    ("GPU temperature", "timeseries", "celsius", [("GPU {{gpu}}", 'DCGM_FI_DEV_GPU_TEMP{host="$host"}')]),
    ("GPU power", "timeseries", "watt", [("GPU {{gpu}}", 'DCGM_FI_DEV_POWER_USAGE{host="$host"}')]),
    ("GPU utilization", "timeseries", "percent", [("GPU {{gpu}}", 'DCGM_FI_DEV_GPU_UTIL{host="$host"}')]),
    ("GPU memory used", "timeseries", "mbytes", [("GPU {{gpu}}", 'DCGM_FI_DEV_FB_USED{host="$host"}')]),
    ("Failures while serving (kept)", "timeseries", "none",
     [("{{state}}", 'moefleet_runtime_failures{host="$host"}')]),
    ("CPU busy", "timeseries", "percentunit",
     [("cpu", '1 - avg(rate(node_cpu_seconds_total{host="$host", mode="idle"}[$__rate_interval]))')]),
    ("Memory available", "timeseries", "bytes", [("available", 'node_memory_MemAvailable_bytes{host="$host"}')]),
]

# smg 1.13.0 in HTTP mode (as moefleet runs it): no TTFT/TPOT families (smg_router_ttft_seconds is gRPC-only), so
# latency is the whole request's; a worker that never registered has no series (smg retries it every 30 s).
GATEWAY = [
    ("Gateways answering", "stat", "none", [("answering", 'sum(up{job="smg"})')]),
    ("Workers healthy / registered", "stat", "none",
     [("healthy", "sum(smg_worker_health)"), ("registered", "sum(smg_worker_pool_size)")]),
    ("Responses per second by status", "timeseries", "reqps",
     [("{{host}} {{status_code}}", "sum by (host, status_code) (rate(smg_http_responses_total[$__rate_interval]))")]),
    ("Request duration through the gateway, p99", "timeseries", "s",
     [("{{host}} {{endpoint}}", p99("smg_router_request_duration_seconds", "host, endpoint"))]),
    ("Requests in flight per worker", "timeseries", "none", [("{{worker}}", "smg_worker_requests_active")]),
    ("Worker health as the gateway sees it (1 healthy)", "timeseries", "none",
     [("{{worker}}", "smg_worker_health")]),
    ("Circuit breaker per worker (0 closed, 1 open, 2 half-open)", "timeseries", "none",
     [("{{worker}}", "smg_worker_cb_state")]),
]


def layout(panels: list) -> list[dict]:
    """Grid positions, left to right and top to bottom: stats a third of a row, tables a whole one, graphs half."""
    out, x, y, row_height = [], 0, 0, 0
    for _title, kind, _unit, _queries in panels:
        w, h = {"stat": (8, 4), "table": (24, 6)}.get(kind, (12, 8))
        if x + w > 24:
            x, y, row_height = 0, y + row_height, 0
        out.append({"h": h, "w": w, "x": x, "y": y})
        x, row_height = x + w, max(row_height, h)
    return out


def panel(index: int, grid: dict, title: str, kind: str, unit: str, queries: list[tuple[str, str]]) -> dict:
    return {
        "id": index + 1, "title": title, "type": kind, "datasource": DS, "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {} if kind != "table" else {"showHeader": True},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                     **({"format": "table", "instant": True} if kind == "table" else {})}
                    for i, (legend, expr) in enumerate(queries)],
    }


def dashboard(uid: str, title: str, panels: list, with_host: bool) -> dict:
    return {
        "uid": uid, "title": title, "tags": ["moefleet"], "timezone": "browser", "schemaVersion": 39,
        "editable": True, "refresh": "30s", "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [TEMPLATE_DATASOURCE] + ([TEMPLATE_HOST] if with_host else [])},
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "panels": [panel(i, grid, *spec) for i, (spec, grid) in enumerate(zip(panels, layout(panels), strict=True))],
    }


DASHBOARDS = {
    "moefleet-fleet.json": dashboard("moefleet-fleet", "moefleet: fleet", FLEET, False),
    "moefleet-host.json": dashboard("moefleet-host", "moefleet: one host", HOST, True),
    "moefleet-gateway.json": dashboard("moefleet-gateway", "moefleet: gateway", GATEWAY, False),
}


def text(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    stale = [name for name, data in DASHBOARDS.items()
             if not (HERE / name).exists() or (HERE / name).read_text(encoding="utf-8") != text(data)]
    if "--check" in argv:
        for name in stale:
            print(f"{name} differs from build.py; run python3 {Path(__file__)}", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        (HERE / name).write_text(text(DASHBOARDS[name]), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
