"""The playbooks' own inputs: what an operator sets for a run (batch sizes, the share of failures a batch may
have, the run's switches), not for a host. One table of them, and the one check of each value, used by
playbooks/validate.yml (the moefleet.serving.playbook_input_problems filter, before any host is contacted), by
the CLI (moefleet rollout, deploy and bench run, before anything runs) and by the tests; and the arithmetic
ansible-core cuts a play's batches with (its PlaybookExecutor._get_serialized_batches and
ansible.utils.helpers.pct_to_int, restated here so that this file stays plain Python), which the report callback
and `moefleet rollout --check` use.

Batch sizes follow Ansible's ``serial``: a whole number of hosts, or a percentage of the play's hosts (after
--limit), rounded down and at least one host. Ansible takes 0, a negative number or an empty list as "every host
in one batch", and "150%" as more than every host; an operator who writes any of these, or a word, gets a
sentence naming the fix instead, here, never a batch of every host.

Run-level inputs are read where Ansible has not read any host's variables yet (the play keywords serial,
max_fail_percentage, any_errors_fatal) or are overridden there by the playbook's own vars (playbooks/rollout.yml),
so a value in the inventory (group_vars, host_vars) would be ignored, in part or whole: they are taken from -e
only, and a value found in the inventory is refused, naming where.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.moefleet.serving.plugins.module_utils.bench_report import OBJECTIVES

# The boolean words the roles' and playbooks' `| bool` reads without a deprecation (ansible-core 2.19's filter:
# true/false, yes/no, on/off, 1/0, any case). Every boolean input is held to these: Ansible's argument specs
# (type: bool) take y/n, t/f and 1.0 too, which `| bool` reads as false.
BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def parse_bool(value: Any) -> bool | None:
    """``value`` as a boolean when it is one of the forms `| bool` reads (true/false, yes/no, on/off, 1/0, any
    case, as strings or as YAML/JSON booleans and 0/1), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return BOOL_WORDS.get(value.strip().lower())
    return None


def bool_problem(name: str, value: Any, host: str | None = None) -> str | None:
    """A sentence naming the variable when ``value`` is not a boolean form, else None."""
    if parse_bool(value) is not None:
        return None
    where = f" for {host}" if host else ""
    return (
        f"{name} is {value!r}{where}, which is not a boolean; set it to true or false "
        f"(yes/no, on/off and 1/0 work too), e.g. -e {name}=true."
    )


# Far above any fleet, far below a count that would keep ansible-core's batch loop (a range() over it) busy.
MAX_BATCH_HOSTS = 100_000


# Why a run-level input found in the inventory would be ignored, at least in part.
BATCH_SIZING = ("Ansible sizes a play's batches (serial, max_fail_percentage, any_errors_fatal) before it reads any "
                "host's variables, and playbooks/rollout.yml's own vars override the inventory's")
BENCH_DEFAULTS = "playbooks/bench.yml's sweep play holds its defaults as play vars, which override the inventory's"


@dataclass(frozen=True)
class Input:
    """One operator input of the playbooks: its kind, whether it is run-level (-e only), and what it does. The kinds
    batch, batches, percent, bool and yes_no are the batch sizes' and switches'; the others, the benchmark sweep's:
    count (a whole number from ``low`` to ``high``), counts (a non-empty list of them), number (any number from
    ``low`` to ``high``), bound (a number above 0 up to ``high``, or null for no bound), choice (one of
    ``choices``), address, pattern (``pattern``, described by ``rule``), env (an environment for the service),
    profiles (profile names, checked against the catalog when there is one). ``example``: a good value for the
    sentence's fix; ``ignored``: why an inventory value of a run-level input would not count."""

    kind: str
    run_level: bool
    what: str
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    pattern: str = ""
    rule: str = ""
    example: Any = None
    ignored: str = BATCH_SIZING


# Every variable an operator sets for a run of the playbooks, besides profile (the resolve_profiles module checks
# it against the catalog) and the per-host ones the roles document. README.md (Variable reference) lists them;
# playbooks/bench.yml's header says what each of the sweep's does.
INPUTS: dict[str, Input] = {
    "moefleet_serial": Input(
        "batches", True, "the rollout's batches without routers (playbooks/rollout.yml: [1, \"25%\", \"100%\"])"),
    "moefleet_max_unavailable": Input(
        "batch", True, "behind routers, the hosts out of the routers at once (default 1)"),
    "moefleet_max_fail_percentage": Input(
        "percent", True, "the share of a batch's hosts that may fail before the run stops (rollout: 0)"),
    "moefleet_any_errors_fatal": Input("bool", True, "a failed host stops every host (rollout: true)"),
    "moefleet_health_gate": Input("bool", True, "after each batch, every host done so far must still serve"),
    "moefleet_through_routers": Input("bool", True, "drain each host out of the routers first (rollout: true)"),
    "moefleet_maintenance_window": Input(
        "bool", True, "behind routers, restart workers without draining or all at once: an announced outage"),
    "confirm": Input("yes_no", False, "restart hosts that serve another profile (rollout, uninstall)"),
    # The benchmark sweep's (playbooks/bench.yml). profiles, apply and apply_objective are read with a default and
    # may come from the inventory too; the others are the sweep play's vars, so a value in the inventory is ignored.
    "apply": Input("bool", False, "serve and keep the benchmark's winner (bench)"),
    "apply_objective": Input("choice", False, "the benchmark objective whose winner -e apply=yes serves",
                             choices=OBJECTIVES, example="throughput"),
    "profiles": Input("profiles", False, "the profiles the sweep measures, in this order (bench)",
                      example=["tp8", "ep8"]),
    "bench_ladder": Input("counts", True, "the concurrency of each level, --max-concurrency", 1, 100_000,
                          example=[1, 64], ignored=BENCH_DEFAULTS),
    "bench_input_len": Input("count", True, "prompt tokens, --random-input-len", 1, 10 << 20, example=1024,
                             ignored=BENCH_DEFAULTS),
    "bench_output_len": Input("count", True, "output tokens, --random-output-len", 1, 10 << 20, example=512,
                              ignored=BENCH_DEFAULTS),
    "bench_prompts_min": Input("count", True, "the fewest --num-prompts of a level", 1, 1_000_000, example=8,
                               ignored=BENCH_DEFAULTS),
    "bench_prompts_per_concurrency": Input("number", True, "--num-prompts per unit of a level's concurrency",
                                           0, 10_000, example=2, ignored=BENCH_DEFAULTS),
    "bench_prompts_max": Input("count", True, "the most --num-prompts of a level", 1, 1_000_000, example=512,
                               ignored=BENCH_DEFAULTS),
    "bench_dataset_name": Input("choice", True, "the prompts' dataset, one that --random-input-len sizes",
                                choices=("random", "random-ids"), example="random-ids", ignored=BENCH_DEFAULTS),
    "bench_tokenize_prompt": Input("bool", True, "--tokenize-prompt: prompts sent as token ids",
                                   ignored=BENCH_DEFAULTS),
    "bench_dataset_path": Input("pattern", True, "--dataset-path, a ShareGPT JSON file on the host",
                                pattern=r"(/[^\n]*)?", rule="an absolute path on the host, or empty",
                                example="/srv/sharegpt.json", ignored=BENCH_DEFAULTS),
    "bench_seed": Input("count", True, "--seed", 0, 999_999_999, example=1, ignored=BENCH_DEFAULTS),
    "bench_server_host": Input("address", True, "the address the client reaches the server at, --host",
                               example="127.0.0.1", ignored=BENCH_DEFAULTS),
    "bench_slo_p99_itl_ms": Input("bound", True, "the slo objective's bound on the p99 inter-token latency, ms",
                                  high=3_600_000, example=100, ignored=BENCH_DEFAULTS),
    "bench_slo_p99_ttft_ms": Input("bound", True, "the slo objective's bound on the p99 time to first token, ms",
                                   high=3_600_000, example=10000, ignored=BENCH_DEFAULTS),
    "bench_report_dir": Input("pattern", True, "the report's directory on the controller", pattern=r".+",
                              rule="a directory, relative to where ansible-playbook runs or absolute",
                              example="reports", ignored=BENCH_DEFAULTS),
    "bench_report_stem": Input("pattern", False,
                               "the report's file name without extension, which moefleet bench run sets",
                               pattern=r"(?!\.\.?$)[^/\n]+", rule="a file name without '/'",
                               example="bench-gpu-07"),
    "bench_service_extra_env": Input("env", True, "service environment added for the sweep's starts only",
                                     example={"NCCL_DEBUG": "INFO"}, ignored=BENCH_DEFAULTS),
    "bench_rollback": Input("bool", True, "the role's rollback during the sweep", ignored=BENCH_DEFAULTS),
    "bench_level_timeout": Input("count", True, "seconds one concurrency level may run", 1, 7 * 86_400,
                                 example=3600, ignored=BENCH_DEFAULTS),
    "bench_apply_vars_file": Input("pattern", False, "the inventory file -e apply=yes writes the winner to",
                                   pattern=r".+\.ya?ml", rule="a YAML file's path (.yml or .yaml)",
                                   example="inventory/prod/group_vars/blackwell.yml"),
}

_COUNT = re.compile(r"[0-9]+")
_PERCENT = re.compile(r"([0-9]+)%")
_SIGNED = re.compile(r"-[0-9]+%?")


def pct_to_int(value: Any, num_items: int, min_value: int = 1) -> int:
    """ansible.utils.helpers.pct_to_int: "x%" of num_items, rounded down (in floating point, as ansible-core
    computes it) and at least min_value; anything else as int()."""
    if isinstance(value, str) and value.endswith("%"):
        value_pct = int(value.replace("%", ""))
        return int((value_pct / 100.0) * num_items) or min_value
    return int(value)


def batches(hosts: Sequence[str], serial: Any) -> list[list[str]]:
    """The hosts cut into batches as ansible-core's PlaybookExecutor._get_serialized_batches cuts a play whose
    serial keyword is ``serial`` (a scalar is a list of one, as the keyword's list type makes it; an empty list
    or a size of 0 or less is every host left in one batch; the last size repeats)."""
    sizes = serial if isinstance(serial, list) else ([] if serial is None else [serial])
    sizes = sizes or [-1]
    left, out, item = list(hosts), [], 0
    while left:
        size = pct_to_int(sizes[item], len(hosts))
        if size <= 0:
            out.append(left)
            break
        out.append(left[:size])
        left = left[size:]
        item = min(item + 1, len(sizes) - 1)
    return out


def play_serial(values: Mapping[str, Any], routers: bool) -> list[Any]:
    """The serial keyword of playbooks/serve.yml's play for these variables (the playbook's own vars with -e over
    them) and whether the inventory has a group routers: behind routers moefleet_max_unavailable hosts at a time,
    else moefleet_serial, else every host at once ([0], deploy.yml). Values pass through unchanged, so that
    Ansible reads them as it reads them here; tests/unit/test_rollout_playbook.py templates the play's own
    expression against this."""
    through = parse_bool(values.get("moefleet_through_routers", False)) is True
    if through and routers:
        return [values.get("moefleet_max_unavailable", 1)]
    serial = values.get("moefleet_serial", [0])
    return serial if isinstance(serial, list) else [serial]


def serve_play_vars(plays: Any) -> dict[str, Any]:
    """The vars a playbook (``plays``: its parsed YAML) gives its import of serve.yml (playbooks/rollout.yml:
    moefleet_serial, moefleet_through_routers, ...; deploy.yml: none): what serve.yml's play reads unless -e says
    otherwise. playbooks/validate.yml (the outage check) and `moefleet rollout`/`deploy` read them here."""
    for play in plays or []:
        if not isinstance(play, Mapping):
            continue
        target = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
        if target == "serve.yml":
            return dict(play.get("vars") or {})
    return {}


MAINTENANCE = "moefleet_maintenance_window"


def outage(values: Mapping[str, Any], workers: Sequence[str], play_hosts: Sequence[str], routers: Sequence[str],
           playbook: str = "this playbook") -> tuple[str | None, str | None]:
    """``(refusal, announcement)`` for a run behind routers that would stop requests through them: serve.yml's
    play for ``values`` (the playbook's vars for it with -e over them) restarting workers the routers still route
    to (not moefleet_through_routers: deploy.yml, every host at once), or draining so many at once
    (moefleet_max_unavailable, of ``play_hosts``: the run's workers after --limit) that none of ``workers`` (every
    worker behind the routers) is left serving. Refused unless moefleet_maintenance_window is true; then the
    announcement says what the outage is. (None, None) without routers, or for a drained run that leaves one
    serving. A batch size that is no batch size is value_problem's to refuse, not this one's."""
    routers, workers = list(routers or []), list(workers or [])
    hosts = [host for host in play_hosts if host in workers]
    if not routers or not hosts:
        return None, None
    maintenance = parse_bool(values.get(MAINTENANCE, False)) is True
    total, gateway = len(workers), ", ".join(routers)
    profile = values.get("profile") if isinstance(values.get("profile"), str) else "NAME"
    if parse_bool(values.get("moefleet_through_routers", False)) is True:
        size = values.get("moefleet_max_unavailable", 1)
        if batch_size_problem(size) is not None:
            return None, None
        out = min(pct_to_int(size, len(hosts)), len(hosts))
        left = total - out
        if left > 0:
            return None, None
        if maintenance:
            return None, (
                f"Maintenance window ({MAINTENANCE}=true): moefleet_max_unavailable={size} takes all {total} "
                f"workers out of the routers ({gateway}) at once; the model is unavailable through them until the "
                "workers serve again (a model load: 10 to 40 minutes).")
        fewer = (f"set it below {total} (e.g. -e moefleet_max_unavailable=1) so that the others keep serving"
                 if total > 1 else "add a second worker behind the routers so that one keeps serving")
        return (
            f"moefleet_max_unavailable={size} would take {out} of the {len(hosts)} workers of this run out of the "
            f"routers ({gateway}) at once, leaving {left} of the {total} workers behind them serving: every request "
            f"through the routers would fail until they serve again. {fewer[0].upper()}{fewer[1:]}; or, in a "
            f"maintenance window, pass -e {MAINTENANCE}=true to take them all out at once, an outage the run "
            "announces."), None
    left = total - len(hosts)
    if maintenance:
        return None, (
            f"Maintenance window ({MAINTENANCE}=true): {len(hosts)} of the {total} workers behind the routers "
            f"({gateway}) restart without being taken out of the routers first, {left} left serving; requests "
            "routed to the restarting workers fail until they serve again (a model load: 10 to 40 minutes).")
    return (
        f"{playbook} would restart {len(hosts)} of the {total} workers behind the routers ({gateway}) without "
        f"taking them out of the routers first (moefleet_through_routers is off), leaving {left} serving: every "
        "request routed to them would fail until they serve again. Roll it out through the routers instead, each "
        f"worker drained first: moefleet rollout -e profile={profile} (or ansible-playbook playbooks/rollout.yml -e "
        f"profile={profile}); or, in a maintenance window or for a fleet that serves nothing yet, pass -e "
        f"{MAINTENANCE}=true to restart them at once, an outage the run announces."), None


# A good value of each kind, for a sentence whose own value is not one.
_EXAMPLES: dict[str, Any] = {"batch": 1, "batches": [1, "25%", "100%"], "percent": 0, "bool": True, "yes_no": "yes"}


def _example(name: str, value: Any) -> str:
    """How to pass ``value`` for ``name`` on the command line: key=value for a plain word, JSON otherwise."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.%-]+", value):
        return f"-e {name}={value}"
    if isinstance(value, bool):
        return f"-e {name}={'true' if value else 'false'}"
    if isinstance(value, int):
        return f"-e {name}={value}"
    return "-e '" + json.dumps({name: value}) + "'"


def batch_size_problem(value: Any) -> str | None:
    """Why ``value`` is not a batch size an operator may ask for (None when it is): a whole number of hosts from 1
    to MAX_BATCH_HOSTS, or a percentage from 1% to 100%, as a number or as the text -e passes."""
    if isinstance(value, bool):
        return "a boolean, not a number of hosts"
    text = str(value) if isinstance(value, int | str) else None
    if text is None:
        return f"a {type(value).__name__}, not a number of hosts or a percentage"
    if _COUNT.fullmatch(text):
        count = int(text)
        if count == 0:
            return "which Ansible takes as every host at once"
        if count > MAX_BATCH_HOSTS:
            return f"more than {MAX_BATCH_HOSTS:,} hosts"
        return None
    match = _PERCENT.fullmatch(text)
    if match:
        percent = int(match.group(1))
        if percent == 0:
            return "which is no host"
        if percent > 100:
            return "more than every host"
        return None
    if _SIGNED.fullmatch(text):
        return "a negative percentage" if text.endswith("%") else "which Ansible takes as every host at once"
    return "not a number of hosts or a percentage"


BATCH_RULE = ("a number of hosts from 1 to 100000, or a percentage of the play's hosts from 1% to 100% (rounded "
              "down, at least one host)")


def value_problem(name: str, value: Any, host: str | None = None,
                  catalog: Mapping[str, Any] | None = None) -> str | None:
    """A sentence naming ``name``, the value and the fix when ``value`` is not usable for that input, else None.
    ``catalog`` (the validated profile catalog, extra profiles included): the profile names and NCCL sets an input
    may name; without it (moefleet bench run, before the run) only their form is checked."""
    spec = INPUTS[name]
    where = f" for {host}" if host else ""
    if spec.kind not in ("batch", "batches", "percent", "yes_no", "bool"):
        return _sweep_problem(name, value, spec, host, catalog)
    if spec.kind == "batch":
        why = batch_size_problem(value)
        if why is None:
            return None
        return (f"{name} is {value!r}{where}, {why}; set it to {BATCH_RULE}, e.g. -e {name}=1 or -e {name}=25%.")
    if spec.kind == "batches":
        sizes = value if isinstance(value, list) else [value]
        if isinstance(value, Mapping) or not sizes:
            why = "no batch size" if not sizes else "a mapping"
            return (f"{name} is {value!r}{where}, {why}; give a list of batch sizes, each {BATCH_RULE}, as JSON: "
                    f"-e '{{\"{name}\": [1, \"25%\", \"100%\"]}}'.")
        for number, size in enumerate(sizes, start=1):
            why = batch_size_problem(size)
            if why is not None:
                which = f"batch size {number} of {name}" if isinstance(value, list) else name
                return (f"{which} is {size!r}{where}, {why}; give each batch size as {BATCH_RULE}, and the list as "
                        f"JSON: -e '{{\"{name}\": [1, \"25%\", \"100%\"]}}'.")
        return None
    if spec.kind == "percent":
        text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
        match = re.fullmatch(r"([0-9]{1,3})%?", text)
        if match and int(match.group(1)) <= 100:
            return None
        return (f"{name} is {value!r}{where}; set it to a whole number from 0 to 100, the percentage of a batch's "
                f"hosts that may fail before the run stops (0: the first failure stops it), e.g. -e {name}=0.")
    if spec.kind == "yes_no":
        # playbooks/rollout.yml's confirmation reads yes and true only: 1/0 are not offered here.
        words = ("yes", "no", "true", "false")
        if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in words):
            return None
        return f"{name} is {value!r}{where}; set it to yes or no (true/false work too), e.g. -e {name}=yes."
    return bool_problem(name, value, host)


_DECIMAL = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")


def _number(value: Any) -> float | None:
    """A number as YAML/JSON or -e's text gives it (digits, one optional fraction), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return float(value)
    return None


def profile_names(value: Any) -> list[str] | None:
    """The profiles a sweep is asked for, as playbooks/bench.yml reads ``profiles`` (bench_asked): a list, or names
    separated by commas in one text ("tp8, ep8"); None for an empty text or anything else."""
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()] or None
    if isinstance(value, list) and value and all(isinstance(n, str) and n.strip() == n and n for n in value):
        return list(value)
    return None


def _sweep_problem(name: str, value: Any, spec: Input, host: str | None,
                   catalog: Mapping[str, Any] | None) -> str | None:
    """value_problem for the benchmark sweep's kinds of input (Input's docstring)."""
    where = f" for {host}" if host else ""
    fix = f"e.g. {_example(name, spec.example)}"
    kind = spec.kind
    if kind == "count":
        _, problem = whole_number(name, value, int(spec.low), int(spec.high), host)
        return None if problem is None else f"{problem[:-1]} ({spec.what}), {fix}."
    if kind == "counts":
        if not isinstance(value, list) or not value:
            return (f"{name} is {value!r}{where}; give a non-empty list of whole numbers from {int(spec.low)} to "
                    f"{int(spec.high)} ({spec.what}), as JSON: {_example(name, spec.example)}.")
        for number, item in enumerate(value, start=1):
            if whole_number(name, item, int(spec.low), int(spec.high))[1] is not None:
                return (f"item {number} of {name} is {item!r}{where}; give each as a whole number from "
                        f"{int(spec.low)} to {int(spec.high)} ({spec.what}), and the list as JSON: "
                        f"{_example(name, spec.example)}.")
        return None
    if kind in ("number", "bound"):
        number = _number(value)
        if kind == "bound" and value is None:
            return None
        low_ok = number is not None and (number > 0 if kind == "bound" else number >= spec.low)
        if low_ok and number <= spec.high:
            return None
        if kind == "number":
            return (f"{name} is {value!r}{where}; set it to a number from {spec.low:.0f} to {spec.high:.0f} "
                    f"({spec.what}), {fix}.")
        return (f"{name} is {value!r}{where}; set it to a number above 0 and at most {spec.high:.0f} ({spec.what}), "
                f"{fix}, or to null for no bound: -e '{json.dumps({name: None})}'.")
    if kind == "choice":
        if isinstance(value, str) and value in spec.choices:
            return None
        return f"{name} is {value!r}{where}; set it to one of {', '.join(spec.choices)} ({spec.what}), {fix}."
    if kind == "address":
        if is_address(value):
            return None
        return f"{name} is {value!r}{where}; set it to an IP address or a host name ({spec.what}), {fix}."
    if kind == "pattern":
        if isinstance(value, str) and re.fullmatch(spec.pattern, value):
            return None
        return f"{name} is {value!r}{where}; set it to {spec.rule} ({spec.what}), {fix}."
    if kind == "env":
        if not isinstance(value, Mapping):
            return (f"{name} is {value!r}{where}, not a mapping; give environment names and their values, as JSON: "
                    f"{_example(name, spec.example)}.")
        found = _env_problems(name, value, host, catalog)
        return " ".join(found) or None
    if kind == "profiles":
        if value is None:
            return None  # bench.yml: every profile that fits the host
        names = profile_names(value)
        if names is None:
            return (f"{name} is {value!r}{where}; give one or more profile names, as a list in JSON "
                    f"({_example(name, spec.example)}) or separated by commas (-e {name}=tp8,ep8).")
        known = list((catalog or {}).get("profiles") or {})
        unknown = [one for one in names if catalog is not None and one not in known]
        if unknown:
            return (f"{name} names {', '.join(unknown)}{where}, which the catalog does not have; name profiles of "
                    f"the catalog ({', '.join(known)}), or add yours under moefleet_extra_profiles.")
        return None
    raise ValueError(f"INPUTS[{name!r}]: unknown kind {kind!r}")


def confirmed(value: Any) -> bool:
    """Whether a boolean input reads as true, as the roles' `| bool` reads it (confirm, apply, and the hosts' booleans
    such as moefleet_allow_unfit); anything that is no boolean reads as false here (validate.yml refuses it)."""
    return parse_bool(value) is True


def outside_extra_vars(extra: Mapping[str, Any] | None, views: Mapping[str, Mapping[str, Any]],
                       play_view: str | None = None) -> dict[str, list[str]]:
    """Run-level inputs set somewhere else than -e: per name, the hosts (of ``views``: each host's variables, as
    Ansible gives them to a task on that host) whose value does not come from -e. With ``extra`` (the run's -e
    values) known, a name a host sees that -e does not set came from the inventory; without it, a host whose
    value differs from ``play_view``'s (the controller's view: -e over the inventory's group all)."""
    found: dict[str, list[str]] = {}
    reference = views.get(play_view, {}) if play_view is not None else {}
    for host, seen in views.items():
        for name, spec in INPUTS.items():
            if not spec.run_level or name not in seen:
                continue
            if extra is not None:
                outside = name not in extra
            else:
                outside = host != play_view and (name not in reference or seen[name] != reference[name])
            if outside:
                found.setdefault(name, []).append(host)
    return found


def problems(
    values: Mapping[str, Any],
    host_values: Mapping[str, Mapping[str, Any]] | None = None,
    outside: Mapping[str, Iterable[str]] | None = None,
    everyone: str | None = None,
    catalog: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every problem of the run's inputs, as sentences: ``values`` (what the run asks: -e, as the controller sees
    them) checked by value_problem; each host's own value that differs from it (``host_values``), naming the
    host; and each run-level input set outside -e (``outside``, from outside_extra_vars), naming the hosts, or
    saying "every host" for ``everyone`` (the controller's own name, which sees the inventory's group all).
    ``catalog``: the validated catalog, for the profile names and NCCL sets an input names (value_problem)."""
    out: list[str] = []
    outside = outside or {}
    for name, value in values.items():
        if name in INPUTS and name not in outside:
            problem = value_problem(name, value, catalog=catalog)
            if problem:
                out.append(problem)
    for host, seen in (host_values or {}).items():
        for name, value in seen.items():
            if name not in INPUTS or INPUTS[name].run_level or (name in values and value == values[name]):
                continue
            problem = value_problem(name, value, host, catalog)
            if problem:
                out.append(problem)
    for name, hosts in outside.items():
        hosts = list(hosts)
        value = next((seen[name] for host, seen in (host_values or {}).items() if host in hosts and name in seen),
                     values.get(name))
        where = ("for every host (group_vars/all or the inventory's all: vars)" if everyone in hosts
                 else "for " + ", ".join(hosts))
        spec = INPUTS[name]
        good = spec.example if spec.example is not None else _EXAMPLES[spec.kind]
        example = _example(name, value if value_problem(name, value, catalog=catalog) is None else good)
        out.append(
            f"{name} is set in the inventory {where}, which the playbooks would ignore, at least in part: "
            f"{spec.ignored}. Remove it from the inventory and pass it for the run instead: {example}."
        )
    return out


def misread_booleans(values: Mapping[str, Any], options: Mapping[str, Any], host: str | None = None) -> list[str]:
    """A sentence for each boolean input (an option of an argument spec with ``type: bool``) that is set to a form
    the spec takes but `| bool` does not read (y/n, t/f, 1.0): the spec check passes it, the roles would read false."""
    problems = []
    for name, option in options.items():
        if (option or {}).get("type") == "bool" and name in values and parse_bool(values[name]) is None:
            try:
                boolean(values[name], strict=True)
            except TypeError:
                continue  # not a boolean to the spec either: validate_argument_spec refuses it, naming it
            problems.append(bool_problem(name, values[name], host))
    return problems


# ---------------------------------------------------------------------------------------------------
# Each host's role inputs: what the roles' meta/argument_specs.yml cannot state, in one table
# ---------------------------------------------------------------------------------------------------
# The argument specs (ansible.builtin.validate_argument_spec in playbooks/validate.yml) check types, booleans and
# choices. They take any value for a str or path option (a mapping, a number) and True for an int, so every option
# is also held to its declared type here (spec_type_problem), a path option to an absolute path, and the names below
# to what their role reads them as (RULES). What playbooks/validate.yml's first play checks with the catalog and the
# roles' defaults (module_utils/profiles.py host_problems: the GPU count, the port, the extra flags, the served
# model, the model's source, repository, revision and token) is not repeated here.


def whole_number(name: str, value: Any, low: int, high: int, host: str | None = None) -> tuple[int | None, str | None]:
    """``(number, None)`` for a whole number (or its digits as -e passes them) within bounds, else
    ``(None, sentence)``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
        number = int(value)
    if number is not None and low <= number <= high:
        return number, None
    where = f" for {host}" if host else ""
    return None, f"{name} is {value!r}{where}; set it to a whole number from {low} to {high}."


@dataclass(frozen=True)
class Rule:
    """What one role input must be beyond its spec's type. ``kind``: count (a whole number from ``low`` to
    ``high``), number (any number within them), address (an IP address or a host name), path (absolute), url
    (http:// or https://; empty too when ``empty``), name (a POSIX user or group name), names (a list of them),
    packages (a list of Debian package names), hosts (a list of host names or addresses, with a port or not),
    pattern (``pattern``, described by ``what``), secret (no whitespace or control character; never echoed),
    nccl_set (a set of the catalog), env (an environment; reserved names refused, with what to set instead)."""

    kind: str
    low: int = 0
    high: int = 0
    pattern: str = ""
    what: str = ""
    empty: bool = False


DAY = 86_400
PORT = Rule("count", 1, 65535)
PACKAGE = r"[a-z0-9][a-z0-9+.-]+"
VERSION = Rule("pattern", pattern=r"[0-9]+\.[0-9]+", what="a MAJOR.MINOR version in quotes, such as '12.9'")
REQUIREMENT = Rule("pattern", pattern=r"[^\s#]+(\s*[=<>!~]=?\s*[^\s#]+)?",
                   what="a pip requirement such as 'sglang[all]==0.5.10'")
# A Prometheus duration (a rule's for:, a range selector, a scrape interval, the retention): units y w d h m s ms in
# that order, each once, not all zero; Prometheus refuses the configuration or the rule file otherwise.
DURATION = Rule("pattern", pattern=r"(?=.*[1-9])([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?"
                r"([0-9]+ms)?", what="a Prometheus duration such as 30s, 5m, 1h30m or 15d")
RULES: dict[str, Rule] = {
    # nvidia_driver
    "nvidia_driver_branch": Rule("count", 570, 999),
    "nvidia_driver_package": Rule("pattern", pattern=PACKAGE, what="a Debian package name such as nvidia-open"),
    "nvidia_driver_repo_distro": Rule("pattern", pattern=r"[a-z]+[0-9]+",
                                      what="NVIDIA's repository name of the release, such as debian12 or ubuntu2404"),
    "nvidia_driver_repo_url": Rule("url"),
    "nvidia_driver_repo_key_url": Rule("url"),
    "nvidia_driver_kernel_release": Rule("pattern", pattern=r"[A-Za-z0-9][A-Za-z0-9._+~-]*",
                                         what="a kernel release as uname -r prints it"),
    "nvidia_driver_kernel_headers_metapackage": Rule(
        "pattern", pattern=f"({PACKAGE})?", what="a Debian package name such as linux-headers-amd64, or empty"),
    "nvidia_driver_reboot_timeout": Rule("count", 1, DAY),
    "nvidia_driver_expected_gpu_name": Rule("pattern", pattern=r"\S(.*\S)?",
                                            what="the GPU's name as nvidia-smi prints it"),
    "nvidia_driver_expected_compute_cap": Rule("pattern", pattern=r"[0-9]+\.[0-9]+",
                                               what="a compute capability in quotes, such as '12.0'"),
    # cuda_toolkit
    "cuda_toolkit_version": VERSION,
    "cuda_toolkit_package": Rule("pattern", pattern=PACKAGE, what="a Debian package name such as cuda-toolkit-12-9"),
    # sglang
    "sglang_user": Rule("name"),
    "sglang_group": Rule("name"),
    "sglang_device_groups": Rule("names"),
    "sglang_build_packages": Rule("packages"),
    "sglang_package_spec": REQUIREMENT,
    "sglang_pip_index_url": Rule("url", empty=True),
    "sglang_pip_extra_index_url": Rule("url", empty=True),
    "sglang_pip_trusted_hosts": Rule("hosts"),
    "sglang_env": Rule("env"),
    "sglang_keep_releases": Rule("count", 1, 100),
    # sglang_model (its path, source, repository, revision and token: host_problems)
    "sglang_model_hf_endpoint": Rule("url", empty=True),
    "sglang_model_download_timeout": Rule("count", 60, 7 * DAY),
    "sglang_model_download_poll": Rule("count", 1, 3600),
    "sglang_model_disk_reserve_bytes": Rule("count", 0, 10**15),
    "sglang_model_hf_token": Rule("secret"),
    # sglang_service (its port, extra flags and served model's parsers: host_problems)
    "sglang_service_nccl_set": Rule("nccl_set"),
    "sglang_service_extra_env": Rule("env"),
    "sglang_service_served_model_name": Rule("pattern", pattern=r"[A-Za-z0-9][A-Za-z0-9._:/-]*",
                                             what="a model name without spaces, such as kimi-k2.6"),
    "sglang_service_answer_timeout": Rule("count", 1, DAY),
    "sglang_service_compare_tolerance": Rule("number", 0, 1, what="a share such as 0.1 for 10 %"),
    "sglang_service_compare_runs": Rule("count", 1, 20),
    "sglang_service_compare_prompts": Rule("count", 1, 10_000),
    "sglang_service_compare_concurrency": Rule("count", 1, 1024),
    "sglang_service_compare_input_tokens": Rule("count", 1, 10 << 20),
    "sglang_service_compare_output_tokens": Rule("count", 1, 1 << 20),
    "sglang_service_context_length": Rule("count", 0, 10 << 20, what="0 serves the model's own"),
    "sglang_service_host": Rule("address"),
    "sglang_service_api_key": Rule("secret"),
    "sglang_service_ready_timeout": Rule("count", 1, 7 * DAY),
    "sglang_service_hang_timeout": Rule("count", 1, DAY),
    # systemd reads TimeoutStopSec=0 as no timeout: a stop that hangs would never be killed
    "sglang_service_stop_timeout": Rule("count", 1, DAY),
    "sglang_service_unit_backups": Rule("count", 0, 100),
    "sglang_service_runtime_oom_limit": Rule("count", 1, 100),
    "sglang_service_p2p_backend": Rule("pattern", pattern=r"torch|(/(?!\.\.?(/|$))[^/]+)+",
                                       what="torch, or the absolute path of a backend file on the host"),
    "sglang_service_p2p_timeout": Rule("count", 1, DAY),
    # fault_watch
    "fault_watch_hang_seconds": Rule("count", 1, DAY),
    "fault_watch_interval": Rule("count", 1, 3600),
    "fault_watch_config_file": Rule("path"),
    "fault_watch_status_port": PORT,
    "fault_watch_state_dir": Rule("path"),
    "fault_watch_retry_window": Rule("count", 0, 30 * DAY),
    "fault_watch_sysfs_pci_devices": Rule("path"),
    "fault_watch_reboot_timeout": Rule("count", 1, DAY),
    # sglang_router (checked on the routers)
    "sglang_router_package_spec": REQUIREMENT,
    "sglang_router_pip_index_url": Rule("url", empty=True),
    "sglang_router_pip_extra_index_url": Rule("url", empty=True),
    "sglang_router_pip_trusted_hosts": Rule("hosts"),
    "sglang_router_user": Rule("name"),
    "sglang_router_group": Rule("name"),
    "sglang_router_home": Rule("path"),
    "sglang_router_venv": Rule("path"),
    "sglang_router_config_dir": Rule("path"),
    "sglang_router_host": Rule("address"),
    "sglang_router_port": PORT,
    "sglang_router_prometheus_host": Rule("address"),
    "sglang_router_prometheus_port": PORT,
    "sglang_router_worker_group": Rule("pattern", pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                                       what="the inventory group of the workers, such as blackwell"),
    "sglang_router_admin_key": Rule("secret"),
    "sglang_router_worker_api_key": Rule("secret"),
    "sglang_router_worker_startup_timeout": Rule("count", 1, DAY),
    "sglang_router_health_check_interval": Rule("count", 1, 3600),
    "sglang_router_health_failure_threshold": Rule("count", 1, 1000),
    "sglang_router_stop_timeout": Rule("count", 1, DAY),
    "sglang_router_ready_timeout": Rule("count", 1, DAY),
    "sglang_router_drain_timeout": Rule("count", 1, DAY),
    "sglang_router_join_timeout": Rule("count", 1, DAY),
    "sglang_router_guard_interval": Rule("count", 1, 3600),
    # node_metrics (checked by playbooks/monitoring.yml's first play, on every host it runs on)
    "node_metrics_port": PORT,
    "node_metrics_textfile_dir": Rule("path"),
    "node_metrics_gpu_interval": Rule("count", 1, 3600),
    "node_metrics_dcgm_port": PORT,
    "node_metrics_facts_dir": Rule("path"),
    # monitoring_server (checked there too, on the hosts of group monitoring; the files are written unchecked by
    # promtool when playbooks/monitoring_files.yml exports them)
    "monitoring_server_config_dir": Rule("path"),
    "monitoring_server_port": PORT,
    "monitoring_server_alertmanager_port": PORT,
    "monitoring_server_scrape_interval": DURATION,
    "monitoring_server_evaluation_interval": DURATION,
    "monitoring_server_retention": DURATION,
    "monitoring_server_alert_webhook_url": Rule("url", empty=True),
    "monitoring_server_worker_group": Rule("pattern", pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                                           what="the inventory group of the workers, such as blackwell"),
    "monitoring_server_router_group": Rule("pattern", pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                                           what="the inventory group of the gateways, such as routers"),
    "monitoring_server_down_for": DURATION,
    "monitoring_server_kv_usage_threshold": Rule("number", 0, 1, what="a fraction of the KV cache in use"),
    "monitoring_server_queue_threshold": Rule("count", 1, 1_000_000),
    "monitoring_server_pressure_for": DURATION,
    # histogram_quantile never goes past the histogram's largest finite bucket (SGLang's ends at 400 s): a bound of
    # 400 or more never fires
    "monitoring_server_ttft_p99_seconds": Rule("count", 1, 399, what="SGLang's first-token histogram ends at 400 s"),
    "monitoring_server_itl_p99_seconds": Rule("number", 0.001, 60, what="a number of seconds"),
    "monitoring_server_latency_for": DURATION,
    "monitoring_server_gpu_temperature_celsius": Rule("count", 1, 120),
    "monitoring_server_xid_window": DURATION,
    "monitoring_server_maintenance_gap": DURATION,
    "monitoring_server_maintenance_max_seconds": Rule("count", 60, 30 * DAY),
    "monitoring_server_runtime_failure_window_seconds": Rule("count", 60, 30 * DAY),
    # the playbooks' own per-host input (moefleet_host_inputs_spec in playbooks/validate.yml)
    "moefleet_gpu_memory_gib": Rule("number", 1, 4096, what="PyTorch's capacity of one GPU in GiB, such as 94.97"),
}

# Environment names the service unit sets itself (roles/sglang_service/vars/main.yml, _sglang_service_env), or that
# another input owns, each with what to set instead; an NCCL set's names are reserved to sglang_service_nccl_set.
RESERVED_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "the profile decides the GPUs a server starts (its tp/ep/pp sizes): pick another profile, "
                            "or correct nvidia_driver_expected_gpu_count",
    "CUDA_DEVICE_ORDER": "the unit sets it to PCI_BUS_ID, so that CUDA numbers the GPUs as nvidia-smi and the fault "
                         "watcher do; remove it",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "the unit sets it to 0 (DeepGEMM has no kernels for these GPUs); remove it",
    "HF_HOME": "the sglang role sets it in sglang.env; set sglang_env instead",
    "TRITON_CACHE_DIR": "the sglang role sets it in sglang.env; set sglang_env instead",
}
# The inputs that end up in the service unit's environment: bench.yml adds bench_service_extra_env to
# sglang_service_extra_env for the sweep's starts.
SERVICE_ENVS = ("sglang_service_extra_env", "bench_service_extra_env")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?")
# Never shown in a sentence: keys, tokens, and a webhook URL (a token in its path; its spec says no_log).
SECRET = re.compile(r".*_(key|token|webhook_url)$")


def _shown(name: str, value: Any) -> str:
    """The value as a sentence shows it: a secret's never."""
    return "(value not shown)" if SECRET.fullmatch(name) else repr(value)


def is_address(value: Any) -> bool:
    """An IP address (IPv6 in brackets or not) or a host name (RFC 1123 labels)."""
    import ipaddress

    if not isinstance(value, str):
        return False
    text = value.strip()
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOST_NAME.fullmatch(text)) and not re.fullmatch(r"[0-9.]+", text)


def is_absolute_path(value: Any) -> bool:
    """An absolute path, normalised (no ., .. or doubled slashes; a trailing slash is fine)."""
    import posixpath

    return isinstance(value, str) and value.startswith("/") and (
        value == "/" or posixpath.normpath(value) == value.rstrip("/"))


def spec_type_problem(name: str, value: Any, option: Mapping[str, Any], host: str | None = None) -> str | None:
    """What the argument spec's type lets through but the role cannot use: a mapping, list, boolean or fraction
    (12.10 reads as 12.1) for text; anything but an absolute path for a path; a boolean for a number; a mapping in a
    list of text. None when fine, or when the spec itself refuses the value (it names it then)."""
    kind = (option or {}).get("type", "str")
    where = f" for {host}" if host else ""
    shown = _shown(name, value)
    if kind in ("str", "path") and (isinstance(value, Mapping | list | bool | float) or value is None):
        if kind == "str" and (option or {}).get("default") is None and value is None:
            return None
        return (f"{name} is {shown}{where}, a {type(value).__name__}, not text; set it to text, quoted in YAML "
                f"(e.g. {name}: \"...\"), or -e {name}=....")
    if kind == "path" and not is_absolute_path(str(value)):
        return f"{name} is {shown}{where}; set it to an absolute path (starting with /, without . or .. parts)."
    if kind in ("int", "float") and isinstance(value, bool):
        return f"{name} is {value!r}{where}, a boolean; set it to a number."
    if kind == "list" and isinstance(value, list) and (option or {}).get("elements") == "str":
        odd = [item for item in value if not isinstance(item, str | int) or isinstance(item, bool)]
        if odd:
            return f"{name} has {odd[0]!r}{where}, which is not text; give a list of text items."
    return None


def _env_problems(name: str, env: Any, host: str | None, catalog: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(env, Mapping):
        return []  # the spec's type: dict refuses it
    where = f" for {host}" if host else ""
    nccl = {}
    for set_name, nccl_set in ((catalog or {}).get("nccl_sets") or {}).items():
        for var in (nccl_set or {}).get("env") or {}:
            nccl.setdefault(var, set_name)
    out = []
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            out.append(f"{name} has the name {key!r}{where}, which is no environment variable name; use letters, "
                       "digits and '_', not starting with a digit.")
        elif isinstance(value, Mapping | list) or value is None:
            out.append(f"{name}.{key} is {value!r}{where}; set it to text (a number or a word).")
        elif name in SERVICE_ENVS and key in RESERVED_ENV:
            out.append(f"{name} sets {key}{where}, which this unit owns: {RESERVED_ENV[key]}.")
        elif name in SERVICE_ENVS and key in nccl:
            out.append(f"{name} sets {key}{where}, which the NCCL set {nccl[key]} defines (and a fallback may switch "
                       "sets): set sglang_service_nccl_set to a set of the catalog instead, or add a set with "
                       "your values under moefleet_extra_profiles' nccl_sets.")
    return out


def rule_problems(name: str, value: Any, host: str | None = None,
                  catalog: Mapping[str, Any] | None = None) -> list[str]:
    """Sentences naming ``name``, the value (never a secret's) and the fix, when ``value`` breaks RULES[name]."""
    rule = RULES.get(name)
    if rule is None:
        return []
    where = f" for {host}" if host else ""
    shown = _shown(name, value)
    kind = rule.kind
    if kind == "number":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return []  # the spec's type: float refuses it
        ok = rule.low <= number <= rule.high
        return [] if ok else [f"{name} is {value!r}{where}; set it to {rule.what}, from {rule.low} to {rule.high}."]
    if kind == "count":
        _, problem = whole_number(name, value, rule.low, rule.high, host)
        return [problem[:-1] + (f" ({rule.what})." if rule.what else ".")] if problem else []
    if kind == "address":
        return [] if is_address(value) else [
            f"{name} is {shown}{where}; set it to an IP address or a host name (0.0.0.0 binds every address)."]
    if kind == "path":
        return [] if is_absolute_path(value) else [
            f"{name} is {shown}{where}; set it to an absolute path (starting with /, without . or .. parts)."]
    if kind == "url":
        if rule.empty and value in ("", None):
            return []
        ok = isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", value)
        return [] if ok else [f"{name} is {shown}{where}; set it to an http:// or https:// URL"
                              + (" (or leave it empty)." if rule.empty else ".")]
    if kind in ("name", "names", "packages", "hosts"):
        items = value if kind != "name" else [value]
        if not isinstance(items, list):
            return []  # the spec's type: list refuses it
        test = {"name": POSIX_NAME.fullmatch, "names": POSIX_NAME.fullmatch,
                "packages": re.compile(PACKAGE).fullmatch,
                "hosts": lambda h: is_address(re.sub(r":[0-9]{1,5}$", "", h))}[kind]
        what = {"name": "a user or group name (lower-case letters, digits, '_' or '-', at most 32)",
                "names": "a list of group names (lower-case letters, digits, '_' or '-')",
                "packages": "a list of Debian package names",
                "hosts": "a list of host names or addresses (HOST or HOST:PORT)"}[kind]
        bad = [item for item in items if not isinstance(item, str) or not test(item)]
        return [f"{name} is {value!r}{where}; set it to {what}."] if bad else []
    if kind == "pattern":
        ok = isinstance(value, str | int) and not isinstance(value, bool) and re.fullmatch(rule.pattern, str(value))
        return [] if ok else [f"{name} is {shown}{where}; set it to {rule.what}."]
    if kind == "secret":
        ok = isinstance(value, str | int) and not isinstance(value, bool) and re.fullmatch(r"[!-~]*", str(value))
        return [] if ok else [f"{name} has a space, a line break or another control character{where}; set it to "
                              "the key alone (printable characters, no whitespace), from vault."]
    if kind == "nccl_set":
        sets = sorted((catalog or {}).get("nccl_sets") or {})
        if value in ("", None) or value in sets:
            return []
        return [f"{name} is {shown}{where}, which is no NCCL set of the catalog; set it to one of: "
                f"{', '.join(sets)} (or leave it empty for the profile's own), or add the set under "
                "moefleet_extra_profiles' nccl_sets."]
    if kind == "env":
        return _env_problems(name, value, host, catalog)
    raise ValueError(f"RULES[{name!r}]: unknown kind {kind!r}")


def input_problems(values: Mapping[str, Any], options: Mapping[str, Any], host: str | None = None,
                   catalog: Mapping[str, Any] | None = None) -> list[str]:
    """Every problem of a host's role inputs ``values`` (what it sets, in the inventory or with -e) that the
    argument spec ``options`` (its roles' main entry points, merged) lets through: misread booleans, each option's
    declared type (spec_type_problem), then RULES; one sentence each."""
    out = misread_booleans(values, options, host)
    for name, option in options.items():
        if name not in values:
            continue
        problem = spec_type_problem(name, values[name], option, host)
        if problem:
            out.append(problem)
            continue
        out.extend(rule_problems(name, values[name], host, catalog))
    return out
