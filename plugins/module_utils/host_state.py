"""What a host says about itself: the local facts the sglang_service role writes after each run, and the
status entry `moefleet status` shows for a host. Both documents have a JSON Schema in schemas/
(local_facts.schema.json, status.schema.json); the tests validate what these functions build against them.
Pure Python: the filters (moefleet.serving.local_facts, .status_entry) and the tests call the same code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils.rollback import attempt_only, history_entries

HISTORY_KEPT = 50
SERVER_ARGS = ("tp_size", "ep_size", "pp_size", "dp_size", "enable_dp_attention")
# A worker's state in the routers (roles/sglang_router; smg's GET /workers), most to least available.
ROUTER_STATES = ("ready", "draining", "out", "unroutable", "unknown")
# What `moefleet status` says of a host now (its outcome column, the entry's "state"): only "ready" is a host
# that serves what it was asked.
HOST_STATES = ("ready", "degraded", "restored", "failed", "down", "unknown")
# What `moefleet status` shows of the P2P preflight's last verdict (the role's record, ansible_local.moefleet_p2p).
P2P_STATUS_KEYS = ("verdict", "reason", "fix", "bandwidths", "cached", "when", "nccl_set", "pinned", "contradiction")
# Live figures `moefleet status` shows with Prometheus (playbooks/status.yml asks these, each by host label).
LIVE_QUERIES = {
    "running_requests": "sum by (host) (sglang:num_running_reqs)",
    "kv_usage": "max by (host) (sglang:token_usage)",
    "ttft_p99_seconds": ("histogram_quantile(0.99, sum by (host, le) "
                         "(rate(sglang:time_to_first_token_seconds_bucket[5m])))"),
}


def local_facts(
    previous: Mapping[str, Any] | None,
    asked_profile: str,
    asked_fingerprint: str,
    outcome: Mapping[str, Any],
    attempt: Mapping[str, Any],
    attempts: Sequence[Mapping[str, Any]],
    reason: str,
    now: str,
) -> dict[str, Any]:
    """The host's local facts (ansible_local.moefleet) after a run.

    ``previous`` is what the file held before (or empty); ``outcome`` is rollback.summarize's result;
    ``attempt`` the attempt that serves now (or was restored); ``attempts`` this run's starts with their
    outcomes; ``reason`` the rollback's last sentence (kept with the rollback record when this run rolled back).
    """
    previous = previous or {}
    rolled_back = len(attempts) > 1 or outcome.get("outcome") == "restored"
    last_rollback = ({"time": now, "from": asked_profile, "to": outcome.get("serving_profile"), "reason": reason or ""}
                     if rolled_back else previous.get("last_rollback"))
    history = list(previous.get("history") or []) + history_entries(attempts, now)
    return {
        "asked_profile": asked_profile,
        "asked_fingerprint": asked_fingerprint,
        "serving_profile": outcome.get("serving_profile"),
        "outcome": outcome.get("outcome"),
        "ooms": int(outcome.get("ooms") or 0),
        "attempt": attempt_only(attempt),
        "updated": now,
        "last_rollback": last_rollback,
        "history": history[-HISTORY_KEPT:],
    }


def live_figures(answers: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, float | None]]:
    """``{host: {figure: value}}`` from Prometheus's answers to LIVE_QUERIES (the uri results of playbooks/status.yml,
    each with ``item.key`` the figure and ``json.data.result`` its vector); a figure Prometheus has no series for is
    None (NaN, a p99 without requests in the window, too)."""
    out: dict[str, dict[str, float | None]] = {}
    for answer in answers or []:
        figure = (answer.get("item") or {}).get("key")
        result = ((answer.get("json") or {}).get("data") or {}).get("result") or []
        for series in result:
            host = (series.get("metric") or {}).get("host")
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if host and figure in LIVE_QUERIES:
                out.setdefault(host, {})[figure] = None if value != value else value  # NaN
    return {host: {figure: figures.get(figure) for figure in LIVE_QUERIES} for host, figures in out.items()}


def status_entry(
    host: str,
    reachable: bool,
    local: Mapping[str, Any] | None,
    runtime: Mapping[str, Any] | None,
    unit_state: str | None,
    health_code: int | None,
    server_info: Mapping[str, Any] | None,
    router: str | None = None,
    answers: Mapping[str, Any] | None = None,
    live: Mapping[str, Any] | None = None,
    fault: Mapping[str, Any] | None = None,
    p2p: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One host's line of the status document (playbooks/status.yml; `moefleet status` prints it).

    ``health`` is ``serving`` (/health answers 200), ``starting`` (503, or the unit is on its way up),
    ``down`` or ``unreachable``; ``state`` what the host is now (host_outcome); ``server_args`` the
    parallelism /server_info reports, null when it did not answer. ``router`` (router_state's answer) is
    added only for a fleet with routers. ``answers`` (the correctness gate's result, ``moefleet status --probe``)
    adds ``answers`` (passed, the failed check, its evidence); a server that answers wrongly has the health
    ``wrong_output``, so it does not count as serving. ``live`` (live_figures' entry for the host, with Prometheus)
    adds ``live``: running requests, KV-cache use and TTFT p99 as Prometheus has them. ``fault`` (the fault watcher's
    record, ansible_local.moefleet_health): a host it found unfit (or that needs hardware attention) has the state
    ``unhealthy`` and a ``fault`` entry (its state, the reason, since when), whatever else it reports. ``p2p`` (the
    P2P preflight's last verdict, ansible_local.moefleet_p2p, roles/sglang_service) adds ``p2p``: P2P_STATUS_KEYS of
    it."""
    local, runtime = (local or {}, runtime or {}) if reachable else ({}, {})
    unit = unit_state or "unknown"
    if not reachable:
        health = "unreachable"
    elif health_code == 200:
        health = "serving"
    elif health_code == 503 or unit in ("activating", "active", "reloading"):
        health = "starting"
    else:
        health = "down"
    probed = None
    if answers is not None and reachable:
        probed = {"passed": bool(answers.get("passed")), "failed_check": answers.get("failed_check"),
                  "evidence": answers.get("evidence")}
        if health == "serving" and not probed["passed"]:
            health = "wrong_output"
    info = server_info or {}
    unfit = None
    if reachable and (fault or {}).get("state") in ("unfit", "hardware"):
        unfit = {"state": fault["state"], "reason": fault.get("reason"), "since": fault.get("since")}
    return {
        "host": host,
        "health": health,
        "state": "unhealthy" if unfit else host_outcome(
            health, local.get("outcome"), local.get("serving_profile"), local.get("asked_profile")),
        "unit": unit,
        "serving_profile": local.get("serving_profile"),
        "asked_profile": local.get("asked_profile"),
        "outcome": local.get("outcome"),
        "updated": local.get("updated"),
        "server_args": {arg: info.get(arg) for arg in SERVER_ARGS} if info else None,
        # the SGLang release the server runs, as it reports itself (/server_info's version)
        "release": info.get("version") if info else None,
        "last_rollback": local.get("last_rollback"),
        "runtime_ooms": int(runtime.get("ooms") or 0),
        "last_runtime_failure": runtime.get("last"),
    } | ({"router": router} if router is not None else {}) | ({"answers": probed} if probed is not None else {}) | (
        {"live": {figure: live.get(figure) for figure in LIVE_QUERIES}} if live is not None else {}) | (
        {"fault": unfit} if unfit else {}) | (
        {"p2p": {key: p2p.get(key) for key in P2P_STATUS_KEYS}} if reachable and p2p and p2p.get("verdict") else {})


def host_outcome(health: str, recorded: str | None, serving: str | None, asked: str | None) -> str:
    """What a host is now, from its health and what its local facts recorded (``outcome``, serving and asked
    profile): ``ready`` (serves the profile it was asked), ``degraded`` (a fallback serves), ``restored`` (the
    last unit that served runs again, not the asked one), ``failed`` (the last run left nothing serving), ``down``
    (not serving, whatever the last run recorded), ``unknown`` (unreachable, or no moefleet facts to compare)."""
    if health == "unreachable" or (recorded is None and asked is None):
        return "unknown"
    if health != "serving":
        return "failed" if recorded == "failed" else "down"
    if recorded in ("restored", "degraded", "failed"):
        return recorded
    return "ready" if serving is not None and serving == asked else "degraded"


def router_workers(answers: Sequence[Mapping[str, Any]] | None) -> list[list[Mapping[str, Any]] | None]:
    """Each router's GET /workers list from the uri results of playbooks/status.yml (None: it did not answer)."""
    listings: list[list[Mapping[str, Any]] | None] = []
    for answer in answers or []:
        body = answer.get("json") if isinstance(answer, Mapping) and answer.get("status") == 200 else None
        workers = body.get("workers") if isinstance(body, Mapping) else None
        listings.append(list(workers) if isinstance(workers, list) else None)
    return listings


def router_state(worker_url: str, listings: Sequence[Sequence[Mapping[str, Any]] | None],
                 model: str | None = None) -> str | None:
    """The worker's state across the routers, from each router's GET /workers list (None: it did not answer).

    ``ready``: every router lists it ready and healthy (each routes to it); ``draining``: a router is
    draining it (no new requests, in-flight ones finishing); ``out``: a router does not route to it (not
    listed, or listed but unhealthy or still pending); ``unroutable``: a router lists it ready and healthy under
    another model than ``model``, the one the worker serves (smg registers a worker added without the key it
    needs under model ``unknown``, and answers every request for the model with 404); ``unknown``: a router
    did not answer. None without routers."""
    if not listings:
        return None
    states = []
    for workers in listings:
        if workers is None:
            states.append("unknown")
            continue
        entry = next((w for w in workers if w.get("url") == worker_url), None)
        if entry is None:
            states.append("out")
        elif entry.get("status") == "draining":
            states.append("draining")
        elif entry.get("status") == "ready" and entry.get("is_healthy"):
            states.append("ready" if not model or entry.get("model_id") == model else "unroutable")
        else:
            states.append("out")
    order = {"draining": 0, "unknown": 1, "unroutable": 2, "out": 3, "ready": 4}
    return min(states, key=order.__getitem__)
