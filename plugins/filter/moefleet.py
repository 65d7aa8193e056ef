"""Jinja2 filters over the shared moefleet logic (plugins/module_utils), so playbooks plan, render profiles and decide
rollbacks with the very code the CLI runs: moefleet.serving.plan, .profile_args, .sglang_release and .release_flags
(the target SGLang release and its spelling of the flags), .sglang_cuda_toolkit and .sglang_cuda_toolkits (the CUDA
toolkits releases are built for), .fallback_ladder, .opening_attempt, .next_step, .rollback_summary, .history,
.attempt; .p2p_preflight_step, what a deploy does with the P2P preflight's verdict, and .nccl_uses_p2p;
.unit_with_credential and .unit_without_credential, the restored unit with today's key; the documents a host keeps
and reports, .local_facts and .status_entry; .worker_url, the one composition of an SGLang server's URL;
.model_flags, the served model's parsers and sampling flags; .metrics_flags, SGLang's metrics flags; .scrape_targets,
Prometheus's targets from the inventory; and for the controller checks moefleet.serving.host_inputs, .origins,
.playbook_input_problems, .input_problems and .outage."""

from __future__ import annotations

import functools
import os
import urllib.parse

import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.moefleet.serving.plugins.module_utils import (
    extra_flags,
    gpu_memory,
    host_faults,
    host_state,
    planner,
    playbook_inputs,
    profiles,
    release_compare,
    rollback,
    serving_model,
    sglang_releases,
)


def plan(model_config, gpus, gpu_memory_gib, flags, catalog=None, gpu_memory_mib=None, release=None):
    """Plan one layout: ``{{ config | moefleet.serving.plan(8, 94.97, profile.flags, catalog) }}`` -> dict.
    ``gpu_memory_mib`` is nvidia-smi's memory.total (what SGLang sizes its default fraction from); with
    ``gpu_memory_gib`` none, PyTorch's capacity comes from it through the known-GPU table (module_utils/gpu_memory.py),
    the one conversion ``moefleet plan --gpu``/``--gpu-memory-mib`` uses too."""
    known = (catalog or {}).get("profiles") if isinstance(catalog, dict) else None
    try:
        smi_mib = float(gpu_memory_mib) if gpu_memory_mib not in (None, "") else None
        if gpu_memory_gib in (None, ""):
            if smi_mib is None:
                raise ValueError("give gpu_memory_gib (PyTorch's capacity) or gpu_memory_mib (nvidia-smi's total)")
            gpu_memory_gib = gpu_memory.torch_capacity_gib(smi_mib)
        # numbers written as text (from -e or sglang_service_extra_flags) as SGLang reads them
        if release is None:
            raise ValueError("give release= (sglang_package_spec | moefleet.serving.sglang_release), the SGLang "
                             "release whose parser reads the flags")
        flags = extra_flags.typed(flags, release) if isinstance(flags, dict) else flags
        flags = sglang_releases.canonical(flags, release) if isinstance(flags, dict) else flags
        return planner.plan(model_config, int(gpus), float(gpu_memory_gib), flags, known, smi_mib,
                            release=release).to_dict()
    except gpu_memory.UnknownGpu as exc:
        raise AnsibleFilterError(
            f"moefleet.serving.plan: {exc} On a host, set moefleet_gpu_memory_gib to PyTorch's figure."
        ) from None
    except (planner.PlanError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"moefleet.serving.plan: {exc}") from None


def profile_args(profile, release):
    """A profile's flags as SGLang ``release``'s arguments: ``["--tp-size", "8", "--ep-size", "4"]``
    (``{{ profile | moefleet.serving.profile_args(sglang_package_spec | moefleet.serving.sglang_release) }}``)."""
    try:
        return profiles.sglang_args(profile, release)
    except profiles.ProfileError as exc:
        raise AnsibleFilterError(f"moefleet.serving.profile_args: {exc}") from None


def release_flags(flags, release):
    """Flags in moefleet's vocabulary as SGLang ``release`` names them (what its /server_info reports them as):
    ``{{ flags | moefleet.serving.release_flags(release) }}``."""
    return sglang_releases.spelled_for(flags, release)


def sglang_release(spec):
    """The SGLang release a ``sglang_package_spec`` pins (``sglang[all]==0.5.10`` -> ``0.5.10``); a release moefleet
    has no data for fails with the sentence that names the supported ones (playbooks/validate.yml refuses it
    first, before any host changes)."""
    problem = sglang_releases.release_problem(spec)
    if problem:
        raise AnsibleFilterError(f"moefleet.serving.sglang_release: {problem}")
    return sglang_releases.release_of(spec)


def sglang_cuda_toolkit(release):
    """The CUDA toolkit release (X.Y) a supported SGLang release is built for (``0.5.23`` -> ``13.0``): the default of
    cuda_toolkit_version, so that an upgrade installs the new release's toolkit beside the old one."""
    if release not in sglang_releases.STACK:
        raise AnsibleFilterError(f"moefleet.serving.sglang_cuda_toolkit: no CUDA toolkit is known for SGLang "
                                 f"{release!r}; supported: {', '.join(sglang_releases.SUPPORTED)}.")
    return sglang_releases.toolkit_for(release)


def sglang_cuda_toolkits(releases):
    """The CUDA toolkit releases (X.Y, sorted, once each) the given SGLang releases are built for; ``'supported'``:
    those of every release moefleet supports (``'supported' | moefleet.serving.sglang_cuda_toolkits``), for the
    uninstall, which removes whichever an upgrade left beside the pinned release's."""
    if releases == "supported":
        releases = sglang_releases.SUPPORTED
    if isinstance(releases, str) or not isinstance(releases, (list, tuple)):
        raise AnsibleFilterError(f"moefleet.serving.sglang_cuda_toolkits: give a list of SGLang releases or "
                                 f"'supported', not {releases!r}.")
    return sorted({sglang_cuda_toolkit(release) for release in releases})


def release_compare_filter(before, after, tolerance, host="the host"):
    """An upgrade's judgement: ``{{ before | moefleet.serving.release_compare(after, 0.1, inventory_hostname) }}``,
    the two sglang_speed results; ``verdict`` slower, not_slower or unmeasured, with its ``reason``
    (plugins/module_utils/release_compare.py)."""
    try:
        share = float(tolerance)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"moefleet.serving.release_compare: tolerance {tolerance!r} is not a number") from None
    if not isinstance(before, dict) or not isinstance(after, dict):
        raise AnsibleFilterError("moefleet.serving.release_compare: give it two sglang_speed results (dicts)")
    return release_compare.compare(before, after, share, str(host))


def fallback_ladder(catalog, name):
    """The profile names from ``name`` down its fallbacks to the end of the ladder."""
    try:
        return profiles.fallback_ladder(catalog, name)
    except profiles.ProfileError as exc:
        raise AnsibleFilterError(f"moefleet.serving.fallback_ladder: {exc}") from None


def opening_attempt(previous, profile, fingerprint, nccl_set, catalog, retry=False):
    """The attempt a run starts with: ``{attempt, kept}`` (kept: the host stays on what it recorded last)."""
    return rollback.opening_attempt(previous, profile, fingerprint, nccl_set, catalog, bool(retry))


def next_step(attempts, ladder, catalog, flags=None, gpu_memory_mib=None, release=None):
    """What to try after the attempts so far: ``{action: done|start|restore, attempt, reason}``;
    ``gpu_memory_mib`` (nvidia-smi's memory.total) sizes the KV-pool retune, by the reserve of SGLang ``release``."""
    try:
        if release is None:
            raise rollback.RollbackError("give the SGLang release the host runs (sglang_package_spec | "
                                         "moefleet.serving.sglang_release): the KV-pool retune is sized by its reserve")
        flags = sglang_releases.canonical(flags, release) if isinstance(flags, dict) else flags
        return rollback.next_step(ladder, attempts, catalog, flags, gpu_memory_mib, release=release)
    except rollback.RollbackError as exc:
        raise AnsibleFilterError(f"moefleet.serving.next_step: {exc}") from None


def p2p_preflight_step(result, attempt, pinned, profile_flags, host):
    """What the deploy does with the P2P preflight's verdict before the model load (rollback.p2p_preflight_step):
    ``{action: keep|switch|stop, attempt, message, warn, record}``."""
    if not isinstance(result, dict) or not isinstance(attempt, dict):
        raise AnsibleFilterError("moefleet.serving.p2p_preflight_step: give the p2p_preflight module's result and the "
                                 "attempt (dicts)")
    return rollback.p2p_preflight_step(result, attempt, bool(pinned), profile_flags if isinstance(profile_flags, dict)
                                       else {}, str(host))


def local_facts(previous, asked_profile, asked_fingerprint, outcome, attempt, attempts, reason, now):
    """The host's local facts after a run (schemas/local_facts.schema.json)."""
    return host_state.local_facts(previous, asked_profile, asked_fingerprint, outcome, attempt, attempts, reason, now)


def status_entry(host, reachable, local, runtime, unit_state, health_code, server_info, router=None, answers=None,
                 live=None, fault=None, p2p=None):
    """One host's entry of the status document (schemas/status.schema.json). ``router``, for a fleet with
    routers: ``{'url': the worker's URL as the routers list it, 'answers': the uri results of each router's
    GET /workers}``; the entry's router state is host_state.router_state's answer (none without routers), for the
    model the server says it serves (``served_model_name`` of its /server_info). ``answers``: the sglang_answers
    result of ``moefleet status --probe`` (none when it did not run). ``live``: the uri results of Prometheus's
    answers to host_state.LIVE_QUERIES (none without Prometheus): the host's live figures. ``fault``: the fault
    watcher's record (ansible_local.moefleet_health). ``p2p``: the P2P preflight's last verdict
    (ansible_local.moefleet_p2p)."""
    code = int(health_code) if health_code not in (None, "") else None
    state = None
    if isinstance(router, dict) and router.get("answers"):
        state = host_state.router_state(str(router.get("url")), host_state.router_workers(router["answers"]),
                                        (server_info or {}).get("served_model_name"))
    probe = answers if isinstance(answers, dict) and "passed" in answers else None
    figures = host_state.live_figures(live).get(host, {}) if live else None
    return host_state.status_entry(host, bool(reachable), local, runtime, unit_state, code, server_info, router=state,
                                   answers=probe, live=figures, fault=fault if isinstance(fault, dict) else None,
                                   p2p=p2p if isinstance(p2p, dict) else None)


def live_query_urls(prometheus):
    """``{figure: URL}``: Prometheus's instant-query URL of each of host_state.LIVE_QUERIES at the base URL
    ``prometheus`` (playbooks/status.yml asks them)."""
    base = str(prometheus).rstrip("/")
    return {figure: f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}"
            for figure, q in host_state.LIVE_QUERIES.items()}


def rollback_summary(attempts, requested, restored=None):
    """The host's end state: asked and serving profile, outcome (ready/degraded/restored/failed), OOMs."""
    return rollback.summarize(requested, attempts, restored)


def history(attempts, now):
    """History records of the attempts (time, profile, tuning, NCCL set, outcome, phase, cause)."""
    return rollback.history_entries(attempts, now)


def attempt(record):
    """What a unit runs (profile, tuning, NCCL set), without outcome and bookkeeping."""
    return rollback.attempt_only(record)


_CREDENTIAL = "sglang-secrets.yaml"


def unit_with_credential(text, source, redact):
    """A sglang.service text (the role's template's shape) that serves with the API key credential: LoadCredential=
    of SOURCE where the template writes it (before the first ExecStartPre= or ExecStart=), and an ExecStart= whose
    command runs behind the output filter REDACT and reads the key with --config.
    A text that has the credential already comes back as it is. For the restore of a unit rendered while no key was
    set (roles/sglang_service/tasks/restore.yml): without these lines it would serve without the key."""
    lines = str(text).split("\n")
    if any(line.startswith(f"LoadCredential={_CREDENTIAL}:") for line in lines):
        return text
    starts = [n for n, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(starts) != 1:
        raise AnsibleFilterError(f"unit_with_credential: the unit has {len(starts)} ExecStart= lines, not one")
    n = starts[0]
    lines[n] = f"ExecStart={redact} %d/{_CREDENTIAL} -- {lines[n][len('ExecStart='):]} --config %d/{_CREDENTIAL}"
    first = next(k for k, line in enumerate(lines) if line.startswith(("ExecStartPre=", "ExecStart=")))
    lines.insert(first, f"LoadCredential={_CREDENTIAL}:{source}")
    return "\n".join(lines)


def unit_without_credential(text, redact):
    """A sglang.service text that serves without an API key: no LoadCredential= of the key, no output filter REDACT
    before the command, no --config of the credential. The inverse of unit_with_credential, for the restore of a
    unit rendered while a key was set, now that none is (LoadCredential= would fail on the removed file)."""
    prefix = f"ExecStart={redact} %d/{_CREDENTIAL} -- "
    suffix = f" --config %d/{_CREDENTIAL}"
    out = []
    for line in str(text).split("\n"):
        if line.startswith(f"LoadCredential={_CREDENTIAL}:"):
            continue
        if line.startswith(prefix):
            line = "ExecStart=" + line[len(prefix):]
            if line.endswith(suffix):
                line = line[:-len(suffix)]
        out.append(line)
    return "\n".join(out)


def host_inputs(hosts, hostvars, names):
    """Per host, the variables of ``names`` it defines (inventory, -e), for the controller checks:
    ``{{ groups['blackwell'] | moefleet.serving.host_inputs(hostvars, [...]) }}``. The HF token never leaves here:
    a host whose sglang_model_gated is true gets ``sglang_model_hf_token_set`` (whether it is non-empty)."""
    inputs = {}
    for host in hosts:
        own = hostvars[host]
        values = {name: own[name] for name in names if name in own}
        if playbook_inputs.confirmed(values.get("sglang_model_gated", False)):
            values["sglang_model_hf_token_set"] = bool(own.get("sglang_model_hf_token") or "")
        inputs[host] = values
    return inputs


def origins(value):
    """Where each path inside ``value`` (``mine/flags/tp_size``) was written, as ``FILE, line N`` (or
    ``<CLI option '-e'>``), from the origin ansible-core 2.19 tags data with; empty where it keeps none."""
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # another ansible-core: messages then name the path only
        return {}
    origins = {}

    def walk(current, path):
        if not isinstance(current, dict):
            return
        for key, child in current.items():
            here = f"{path}/{key}" if path else str(key)
            origin = Origin.get_tag(key) or Origin.get_tag(child)
            if origin is not None:
                origins[here] = f"{origin.path}, line {origin.line_num}" if origin.line_num else str(origin)
            walk(child, here)

    walk(value, "")
    return origins


def _extra_vars():
    """The run's -e values as ansible-playbook parsed them (ansible.utils.vars.load_extra_vars keeps what it parsed
    when the run started; a task's worker process inherits it), or None outside a command-line run."""
    try:
        from ansible import context
        from ansible.parsing.dataloader import DataLoader
        from ansible.utils.vars import load_extra_vars

        if not context.CLIARGS:
            return None
        return dict(load_extra_vars(DataLoader()))
    except Exception:  # noqa: BLE001 - another ansible-core, or -e values it cannot read again: compare views instead
        return None


def playbook_input_problems(hostvars, hosts, controller="localhost", catalog=None):
    """The problems of the playbooks' own inputs (module_utils/playbook_inputs.py: batch sizes, confirm, apply,
    the benchmark sweep's, ...), as sentences; [] when there are none: ``{{ hostvars |
    moefleet.serving.playbook_input_problems(groups['blackwell'], catalog=moefleet_validated.catalog) }}``. The
    values are checked as the controller sees them (-e); each host's own values too; a run-level input set in the
    inventory is refused, naming the hosts. ``catalog``: the validated one, for the profile names (profiles) and
    NCCL sets (bench_service_extra_env) an input names."""
    names = list(playbook_inputs.INPUTS)
    views = {}
    for host in [controller, *hosts]:
        own = hostvars[host]
        views[host] = {name: own[name] for name in names if name in own}
    extra = _extra_vars()
    outside = playbook_inputs.outside_extra_vars(extra, views, play_view=controller)
    values = views.pop(controller)
    return playbook_inputs.problems(values, views, outside, everyone=controller, catalog=catalog)


@functools.cache
def _main_options(path):
    """A role's main entry point options, read once per run (the filter runs for every host)."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)["argument_specs"]["main"].get("options") or {}
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise AnsibleFilterError(f"moefleet.serving.input_problems: cannot read {path}: {exc}") from None


def input_problems(roles, host_vars, roles_dir, extra_options=None, host=None, catalog=None):
    """Sentences for the host's role inputs that the argument specs let through (module_utils/playbook_inputs.py
    input_problems: booleans `| bool` misreads, each option's declared type, the RULES table, the NCCL set and the
    environment against ``catalog``): ``{{ moefleet_host_roles | moefleet.serving.input_problems(
    hostvars[inventory_hostname], playbook_dir ~ '/../roles', moefleet_host_inputs_spec, inventory_hostname,
    catalog) }}``; [] when there are none. The options are each role's own meta/argument_specs.yml (main entry
    point) and ``extra_options``; only the variables the host sets (inventory, -e) are checked."""
    options = dict(extra_options or {})
    for role in roles:
        options.update(_main_options(os.path.join(roles_dir, role, "meta", "argument_specs.yml")))
    values = {name: host_vars[name] for name in options if name in host_vars}
    return playbook_inputs.input_problems(values, options, host, catalog)


def input_value_problem(value, name):
    """The sentence refusing ``value`` for the playbooks' input ``name`` (module_utils/playbook_inputs.py INPUTS:
    confirm, apply, batch sizes, ...), '' when it is fine: ``{{ confirm | moefleet.serving.input_value_problem(
    'confirm') }}``."""
    return playbook_inputs.value_problem(name, value) or ""


def confirmed(value):
    """Whether a boolean input reads as yes (playbook_inputs.confirmed, the project's one reader of them)."""
    return playbook_inputs.confirmed(value)


def outage(hostvars, workers, play_hosts, routers, plays, playbook, controller="localhost"):
    """``{'refusal': sentence or '', 'notice': sentence or ''}``: whether serve.yml's play, as ``plays`` (the
    running playbook's parsed YAML) import it with the run's -e over its vars, would stop requests through the
    routers (module_utils/playbook_inputs.py outage)."""
    values = playbook_inputs.serve_play_vars(plays)
    seen = hostvars[controller]
    for name in [*playbook_inputs.INPUTS, "profile"]:
        if name in seen:
            values[name] = seen[name]
    refusal, notice = playbook_inputs.outage(values, list(workers or []), list(play_hosts or []),
                                             list(routers or []), playbook)
    return {"refusal": refusal or "", "notice": notice or ""}


# Addresses that name no reachable host from elsewhere: SGLang binds every address, or only the loopback.
_WILDCARDS = ("0.0.0.0", "::")
_LOOPBACKS = ("127.0.0.1", "localhost", "::1")


def worker_url(host, port, reach=None):
    """The URL of an SGLang server that binds HOST (sglang_service_host) on PORT (sglang_service_port).

    Without REACH, as the host itself reaches it: loopback (127.0.0.1) when it binds every address (0.0.0.0 or ::).
    With REACH (the host's address as other hosts know it: ansible_host, else inventory_hostname), as a router
    reaches it: REACH when it binds every address or only the loopback, which another host cannot reach.
    An IPv6 address is written in brackets; one given in brackets is taken as the address inside them."""
    addr = str(host).strip()
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
    if not addr:
        raise AnsibleFilterError("worker_url: the address is empty (sglang_service_host)")
    if reach is not None and addr in _WILDCARDS + _LOOPBACKS:
        addr = str(reach).strip()
        if addr.startswith("[") and addr.endswith("]"):
            addr = addr[1:-1]
    elif addr in _WILDCARDS:
        addr = "127.0.0.1"
    return f"http://{'[' + addr + ']' if ':' in addr else addr}:{int(port)}"


def model_flags(models, model, tool_call_parser="auto", reasoning_parser="auto", sampling_defaults="",
                context_length=0):
    """The served model's SGLang flags (module_utils/serving_model.py): ``{{ sglang_service_models |
    moefleet.serving.model_flags(sglang_service_model, ...) }}`` -> dict."""
    try:
        return serving_model.model_flags(models, model, tool_call_parser, reasoning_parser, sampling_defaults,
                                         context_length)
    except serving_model.ServingModelError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def metrics_flags(enabled, flags=None):
    """SGLang's metrics flags for the attempt's flags (module_utils/serving_model.py): ``{{ sglang_service_metrics |
    moefleet.serving.metrics_flags(_sglang_service_flags) }}`` -> dict."""
    return serving_model.metrics_flags(bool(enabled), flags)


def xid_codes(unfit):
    """The Xids of the fault watcher's table (host_faults.XID) that make a host unfit (``true``) or that it only
    records or leaves to SGLang's restart (``false``), in order: ``{{ true | moefleet.serving.xid_codes }}`` (the
    alert rules page for the first only)."""
    return sorted(code for code, (_, makes_unfit, _) in host_faults.XID.items() if makes_unfit == bool(unfit))


# Scrape jobs of moefleet's Prometheus (roles/monitoring_server) and the role each group's hosts have in them.
SCRAPE_JOBS = ("sglang", "smg", "node", "dcgm")


def scrape_targets(hostvars, workers, routers, monitoring, defaults):
    """Prometheus file_sd target lists by job, from the inventory: ``{{ hostvars | moefleet.serving.scrape_targets(
    groups.blackwell, groups.routers, groups.monitoring, {'sglang_service_port': ..., ...}) }}``
    -> ``{job: [{"targets": ["addr:port"], "labels": {"host", "role"}}], ..., "unreachable": [worker, ...]}``.

    sglang: each worker with sglang_service_metrics on, at the address the routers reach it at (worker_url);
    smg: each router's --prometheus-port; node: node_exporter on every host (a host in several groups once, as worker,
    else gateway, else monitoring); dcgm: workers with node_metrics_gpu_collector dcgm. ``unreachable``: workers
    bound to the loopback, whose /metrics no other host can scrape. ``defaults`` holds, by variable name, the value for
    what a host's variables leave unset (the fleet's defaults, roles/moefleet_defaults)."""
    def var(host, name):
        hv = hostvars[host]
        return hv[name] if name in hv else defaults[name]

    def reach(host):
        return hostvars[host].get("ansible_host", host)

    def entry(host, role, address, port):
        return {"targets": [f"{'[' + address + ']' if ':' in str(address) else address}:{int(port)}"],
                "labels": {"host": host, "role": role}}

    workers, routers, monitoring = list(workers or []), list(routers or []), list(monitoring or [])
    out = {job: [] for job in SCRAPE_JOBS} | {"unreachable": []}
    for host in workers:
        if playbook_inputs.parse_bool(var(host, "sglang_service_metrics")):
            bound = str(var(host, "sglang_service_host")).strip("[]")
            if bound in _LOOPBACKS:
                out["unreachable"].append(host)
            url = worker_url(bound, var(host, "sglang_service_port"), reach(host))
            out["sglang"].append({"targets": [url.removeprefix("http://")], "labels": {"host": host, "role": "worker"}})
        if var(host, "node_metrics_gpu_collector") == "dcgm":
            out["dcgm"].append(entry(host, "worker", reach(host), var(host, "node_metrics_dcgm_port")))
    for host in routers:
        out["smg"].append(entry(host, "gateway", reach(host),
                                var(host, "sglang_router_prometheus_port")))
    seen = set()
    for hosts, role in ((workers, "worker"), (routers, "gateway"), (monitoring, "monitoring")):
        for host in hosts:
            if host not in seen:
                seen.add(host)
                out["node"].append(entry(host, role, reach(host), var(host, "node_metrics_port")))
    return out


class FilterModule:
    """moefleet filters, called as moefleet.serving.<name>."""

    def filters(self):
        return {
            "plan": plan,
            "profile_args": profile_args,
            "sglang_release": sglang_release,
            "sglang_cuda_toolkit": sglang_cuda_toolkit,
            "sglang_cuda_toolkits": sglang_cuda_toolkits,
            "release_compare": release_compare_filter,
            "release_flags": release_flags,
            "fallback_ladder": fallback_ladder,
            "opening_attempt": opening_attempt,
            "next_step": next_step,
            "p2p_preflight_step": p2p_preflight_step,
            "nccl_uses_p2p": rollback.uses_p2p,
            "unit_with_credential": unit_with_credential,
            "unit_without_credential": unit_without_credential,
            "local_facts": local_facts,
            "status_entry": status_entry,
            "rollback_summary": rollback_summary,
            "history": history,
            "attempt": attempt,
            "host_inputs": host_inputs,
            "origins": origins,
            "playbook_input_problems": playbook_input_problems,
            "input_problems": input_problems,
            "outage": outage,
            "input_value_problem": input_value_problem,
            "confirmed": confirmed,
            "worker_url": worker_url,
            "model_flags": model_flags,
            "metrics_flags": metrics_flags,
            "scrape_targets": scrape_targets,
            "xid_codes": xid_codes,
            "live_query_urls": live_query_urls,
        }
