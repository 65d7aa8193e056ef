"""The playbooks' own inputs (plugins/module_utils/playbook_inputs.py): every value an operator may type for a batch
size, the failure percentage and the run's switches is accepted or refused with a sentence naming the fix; the
batch arithmetic is ansible-core's own, checked against ansible-core; a run-level input found in the inventory is
refused; and the filter playbooks/validate.yml calls reads hostvars as Ansible gives them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.executor.playbook_executor import PlaybookExecutor
from ansible.utils.helpers import pct_to_int as ansible_pct_to_int
from ansible_collections.moefleet.serving.plugins.filter import moefleet as filters
from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs as inputs

HOSTS = [f"gpu-{i}" for i in range(1, 9)]


# --- ansible-core's arithmetic, restated -------------------------------------------------------------------


def test_pct_to_int_is_ansible_cores():
    for count in range(0, 130):
        for percent in range(0, 151):
            assert inputs.pct_to_int(f"{percent}%", count) == ansible_pct_to_int(f"{percent}%", count)
        for value in (1, 2, "3", 7, "12"):
            assert inputs.pct_to_int(value, count) == ansible_pct_to_int(value, count)


class _Inventory:
    def __init__(self, hosts):
        self.hosts = hosts

    def get_hosts(self, pattern, order=None):
        return list(self.hosts)


def ansible_batches(hosts, serial):
    """ansible-core's PlaybookExecutor._get_serialized_batches on a play with this (post-validated) serial."""
    play = SimpleNamespace(hosts="blackwell", order=None, serial=serial)
    return PlaybookExecutor._get_serialized_batches(SimpleNamespace(_inventory=_Inventory(hosts)), play)


@pytest.mark.parametrize("serial", [
    [1, "25%", "100%"], [1], [2], ["25%"], ["50%"], ["33%"], ["100%"], [1, 2], [3, "10%"], ["1%"], [0], [], [-1],
    ["2"], [1, "2", "99%"], [100000],
])
@pytest.mark.parametrize("count", [0, 1, 3, 4, 7, 8, 10, 33])
def test_batches_are_ansible_cores(serial, count):
    hosts = [f"h{i}" for i in range(count)]
    assert inputs.batches(hosts, serial) == ansible_batches(hosts, serial)


@pytest.mark.parametrize(("value", "count", "largest"), [
    ("25%", 4, 1), ("25%", 8, 2), ("50%", 4, 2), ("50%", 8, 4), ("10%", 8, 1), ("100%", 8, 8), (1, 8, 1), ("3", 8, 3),
])
def test_an_accepted_batch_size_never_takes_more_hosts_than_asked(value, count, largest):
    assert inputs.value_problem("moefleet_max_unavailable", value) is None
    cut = inputs.batches(HOSTS[:count], [value])
    assert max(len(batch) for batch in cut) == largest and sum(cut, []) == HOSTS[:count]


# --- values: accepted, or refused with a sentence ------------------------------------------------------------


@pytest.mark.parametrize("value", [1, "1", 2, "25%", "50%", "100%", "1%", 100000])
def test_good_batch_sizes(value):
    assert inputs.value_problem("moefleet_max_unavailable", value) is None
    assert inputs.value_problem("moefleet_serial", [1, value]) is None
    assert inputs.value_problem("moefleet_serial", value) is None  # one size, as Ansible's serial takes it


@pytest.mark.parametrize(("value", "why"), [
    (0, "which Ansible takes as every host at once"),
    ("0", "which Ansible takes as every host at once"),
    (-1, "which Ansible takes as every host at once"),
    ("-1", "which Ansible takes as every host at once"),
    ("-25%", "a negative percentage"),
    ("banana", "not a number of hosts or a percentage"),
    ("", "not a number of hosts or a percentage"),
    ("0%", "which is no host"),
    ("150%", "more than every host"),
    (True, "a boolean, not a number of hosts"),
    ("true", "not a number of hosts or a percentage"),
    (2.5, "a float, not a number of hosts or a percentage"),
    ("25.5%", "not a number of hosts or a percentage"),
    (None, "a NoneType, not a number of hosts or a percentage"),
    ([2], "a list, not a number of hosts or a percentage"),
    (10**20, "more than 100,000 hosts"),
])
def test_bad_batch_sizes_are_refused_with_the_fix(value, why):
    sentence = inputs.value_problem("moefleet_max_unavailable", value)
    assert sentence == (
        f"moefleet_max_unavailable is {value!r}, {why}; set it to a number of hosts from 1 to 100000, or a percentage "
        "of the play's hosts from 1% to 100% (rounded down, at least one host), e.g. -e moefleet_max_unavailable=1 "
        "or -e moefleet_max_unavailable=25%."
    )
    in_list = inputs.value_problem("moefleet_serial", [1, value])
    assert in_list.startswith(f"batch size 2 of moefleet_serial is {value!r}, {why}; give each batch size as ")
    assert in_list.endswith("""and the list as JSON: -e '{"moefleet_serial": [1, "25%", "100%"]}'.""")


@pytest.mark.parametrize("value", [[], {}, "1,2", "[1, 2]"])
def test_moefleet_serial_that_is_no_list_of_sizes(value):
    sentence = inputs.value_problem("moefleet_serial", value)
    assert sentence.startswith(f"moefleet_serial is {value!r}, ")
    assert """-e '{"moefleet_serial": [1, "25%", "100%"]}'""" in sentence


@pytest.mark.parametrize(("value", "good"), [
    (0, True), ("0", True), (100, True), ("50%", True), ("25", True),
    (-1, False), (101, False), ("150", False), ("banana", False), (True, False), (12.5, False), ("", False),
])
def test_max_fail_percentage(value, good):
    sentence = inputs.value_problem("moefleet_max_fail_percentage", value)
    assert (sentence is None) is good
    if not good:
        assert sentence.startswith(f"moefleet_max_fail_percentage is {value!r}; set it to a whole number from 0 to 100")


@pytest.mark.parametrize(("value", "good"), [
    ("yes", True), ("no", True), ("YES", True), ("true", True), ("False", True), (True, True), (False, True),
    ("1", False), (1, False), ("maybe", False), ("", False), ("y", False),
])
def test_confirm_takes_the_words_the_rollouts_confirmation_reads(value, good):
    assert (inputs.value_problem("confirm", value) is None) is good
    if not good:
        assert inputs.value_problem("confirm", value) == (
            f"confirm is {value!r}; set it to yes or no (true/false work too), e.g. -e confirm=yes.")


@pytest.mark.parametrize("name", ["apply", "moefleet_health_gate", "moefleet_any_errors_fatal",
                                  "moefleet_through_routers"])
def test_booleans(name):
    for good in ("yes", "no", "true", "False", "on", "OFF", "1", "0", True, False):
        assert inputs.value_problem(name, good) is None
    assert inputs.value_problem(name, "maybe", "gpu-2") == (
        f"{name} is 'maybe' for gpu-2, which is not a boolean; set it to true or false (yes/no, on/off and 1/0 work "
        f"too), e.g. -e {name}=true.")
    assert inputs.value_problem(name, "y") is not None  # `| bool` reads it as false


def test_problems_checks_only_the_tables_names_and_each_once():
    assert inputs.problems({"profile": "ep8", "moefleet_serial": [1, "25%", "100%"], "confirm": "yes"}) == []
    found = inputs.problems({"moefleet_max_unavailable": 0, "confirm": "1", "apply": "maybe", "other": 0})
    assert [p.split(" ", 1)[0] for p in found] == ["moefleet_max_unavailable", "confirm", "apply"]


# --- run-level inputs found in the inventory ----------------------------------------------------------------


def test_a_run_level_input_in_the_inventory_is_refused_naming_the_hosts():
    views = {"localhost": {}, "gpu-1": {"moefleet_max_unavailable": 2}, "gpu-2": {"moefleet_max_unavailable": 2,
                                                                                   "confirm": "yes"}}
    outside = inputs.outside_extra_vars({}, views, play_view="localhost")
    assert outside == {"moefleet_max_unavailable": ["gpu-1", "gpu-2"]}  # confirm is read per host: allowed
    [sentence] = inputs.problems({}, {h: v for h, v in views.items() if h != "localhost"}, outside, "localhost")
    assert sentence.startswith("moefleet_max_unavailable is set in the inventory for gpu-1, gpu-2, which the "
                               "playbooks would ignore, at least in part: Ansible sizes a play's batches")
    assert sentence.endswith("pass it for the run instead: -e moefleet_max_unavailable=2.")


def test_group_all_is_every_host_and_e_wins_everywhere():
    views = {"localhost": {"moefleet_through_routers": True}, "gpu-1": {"moefleet_through_routers": True}}
    outside = inputs.outside_extra_vars({}, views, play_view="localhost")
    [sentence] = inputs.problems(views["localhost"], {"gpu-1": views["gpu-1"]}, outside, "localhost")
    assert "set in the inventory for every host (group_vars/all" in sentence
    assert sentence.endswith("-e moefleet_through_routers=true.")
    # the same value given with -e: -e wins over the inventory everywhere, nothing to refuse
    assert inputs.outside_extra_vars({"moefleet_through_routers": True}, views, play_view="localhost") == {}


def test_without_the_runs_e_values_a_host_that_differs_from_the_controller_is_refused():
    views = {"localhost": {"moefleet_serial": [1]}, "gpu-1": {"moefleet_serial": [1]},
             "gpu-2": {"moefleet_serial": [5]}}
    assert inputs.outside_extra_vars(None, views, play_view="localhost") == {"moefleet_serial": ["gpu-2"]}


class HostVars(dict):
    """hostvars as a filter gets it: host name -> that host's variables."""


def test_the_filter_validate_yml_calls(monkeypatch):
    monkeypatch.setattr(filters, "_extra_vars", lambda: {"moefleet_max_unavailable": "25%", "profile": "ep8"})
    hostvars = HostVars({"localhost": {"moefleet_max_unavailable": "25%", "profile": "ep8"},
                         "gpu-1": {"moefleet_max_unavailable": "25%", "apply": "maybe"},
                         "gpu-2": {"moefleet_max_unavailable": "25%", "moefleet_serial": [0]}})
    problems = filters.playbook_input_problems(hostvars, ["gpu-1", "gpu-2"])
    assert problems[0] == ("apply is 'maybe' for gpu-1, which is not a boolean; set it to true or false (yes/no, "
                           "on/off and 1/0 work too), e.g. -e apply=true.")
    assert problems[1].startswith("moefleet_serial is set in the inventory for gpu-2, ")
    assert problems[1].endswith("""pass it for the run instead: -e '{"moefleet_serial": [1, "25%", "100%"]}'.""")
    assert len(problems) == 2
    monkeypatch.setattr(filters, "_extra_vars", lambda: {"moefleet_max_unavailable": 0})
    hostvars = HostVars({"localhost": {"moefleet_max_unavailable": 0}, "gpu-1": {"moefleet_max_unavailable": 0}})
    assert filters.playbook_input_problems(hostvars, ["gpu-1"]) == [inputs.value_problem("moefleet_max_unavailable",
                                                                                          0)]
