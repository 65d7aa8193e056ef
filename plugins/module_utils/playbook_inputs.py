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
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean

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


@dataclass(frozen=True)
class Input:
    """One operator input of the playbooks: its kind, whether it is run-level (-e only), and what it does."""

    kind: str  # batch, batches, percent, bool, yes_no
    run_level: bool
    what: str


# Every variable an operator sets for a run of the playbooks, besides profile (the resolve_profiles module checks
# it against the catalog) and the per-host ones the roles document. README.md (Variable reference) lists them.
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
    "confirm": Input("yes_no", False, "restart hosts that serve another profile (rollout, uninstall)"),
    "apply": Input("bool", False, "serve and keep the benchmark's winner (bench)"),
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
            return "which Ansible takes as every host at once (say 100% for that)"
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
        return "a negative percentage" if text.endswith("%") else (
            "which Ansible takes as every host at once (say 100% for that)")
    return "not a number of hosts or a percentage"


BATCH_RULE = ("a number of hosts from 1 to 100000, or a percentage of the play's hosts from 1% to 100% (rounded "
              "down, at least one host)")


def value_problem(name: str, value: Any, host: str | None = None) -> str | None:
    """A sentence naming ``name``, the value and the fix when ``value`` is not usable for that input, else None."""
    spec = INPUTS[name]
    where = f" for {host}" if host else ""
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
) -> list[str]:
    """Every problem of the run's inputs, as sentences: ``values`` (what the run asks: -e, as the controller sees
    them) checked by value_problem; each host's own value that differs from it (``host_values``), naming the
    host; and each run-level input set outside -e (``outside``, from outside_extra_vars), naming the hosts, or
    saying "every host" for ``everyone`` (the controller's own name, which sees the inventory's group all)."""
    out: list[str] = []
    outside = outside or {}
    for name, value in values.items():
        if name in INPUTS and name not in outside:
            problem = value_problem(name, value)
            if problem:
                out.append(problem)
    for host, seen in (host_values or {}).items():
        for name, value in seen.items():
            if name not in INPUTS or INPUTS[name].run_level or (name in values and value == values[name]):
                continue
            problem = value_problem(name, value, host)
            if problem:
                out.append(problem)
    for name, hosts in outside.items():
        hosts = list(hosts)
        value = next((seen[name] for host, seen in (host_values or {}).items() if host in hosts and name in seen),
                     values.get(name))
        where = ("for every host (group_vars/all or the inventory's all: vars)" if everyone in hosts
                 else "for " + ", ".join(hosts))
        example = _example(name, value if value_problem(name, value) is None else _EXAMPLES[INPUTS[name].kind])
        out.append(
            f"{name} is set in the inventory {where}, which the playbooks would ignore, at least in part: Ansible "
            "sizes a play's batches (serial, max_fail_percentage, any_errors_fatal) before it reads any host's "
            "variables, and playbooks/rollout.yml's own vars override the inventory's. Remove it from the "
            f"inventory and pass it for the run instead: {example}."
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
