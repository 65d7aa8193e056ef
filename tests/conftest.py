# pytest puts this directory on sys.path (rootdir conftest, no __init__.py), so tests can import the
# helpers beside it (readiness_module.py).

import contextlib
import os
import resource
import time

import pytest
from figures import print_figures  # tests/figures.py: `figure:` lines
from suite import CPUACCT, suite_job_of  # tests/suite.py: the lab hosts' cgroup counters and their job's label


def pytest_terminal_summary(terminalreporter):
    """The figures tests measured (tests/figures.py), then what each lab test cost."""
    print_figures(terminalreporter)
    if _COSTS:
        terminalreporter.write_sep("-", "what each lab test cost (wall, CPU on the controller, CPU in its lab hosts)")
        per_file: dict[str, list[float]] = {}
        for nodeid, wall, controller, hosts in sorted(_COSTS, key=lambda c: -(c[2] + c[3])):
            terminalreporter.write_line(f"cost: {wall:6.1f} s wall {controller:6.1f} + {hosts:6.1f} CPU-s  {nodeid}")
            totals = per_file.setdefault(nodeid.split("::")[0], [0.0, 0.0, 0.0])
            for i, value in enumerate((wall, controller, hosts)):
                totals[i] += value
        for path, (wall, controller, hosts) in sorted(per_file.items(), key=lambda f: -(f[1][1] + f[1][2])):
            terminalreporter.write_line(f"cost: {wall:6.1f} s wall {controller:6.1f} + {hosts:6.1f} CPU-s  {path} "
                                        "(the file)")


# What each lab test costs: its wall time, the CPU of this pytest process and of the programs it ran and waited
# for (ansible-playbook, ssh, lab.py: the controller), and the CPU its job's lab hosts used meanwhile (their
# containers' cgroup counters; under tests/suite.py only the containers its own job brought up, by their
# moefleet.suite-job label). A module-scoped fixture's set-up counts in its first test. Printed at the end of the
# run, most expensive first (`cost:` lines), so that a lab file's docstring can state what it costs, measured.
_LABELS: dict[str, str] = {}
_COSTS: list[tuple[str, float, float, float]] = []


def _controller_cpu() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _host_counters() -> dict[str, float]:
    job = os.environ.get("MOEFLEET_SUITE_JOB", "")
    found = {}
    for counter in CPUACCT.glob("libpod-*/cpuacct.usage"):
        cid = counter.parent.name.removeprefix("libpod-")
        if cid not in _LABELS:
            _LABELS[cid] = suite_job_of(cid)
        if job and _LABELS[cid] != job:
            continue
        with contextlib.suppress(OSError, ValueError):
            found[cid] = int(counter.read_text()) / 1e9
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("lab") is None or not CPUACCT.is_dir():
        yield
        return
    began, cpu, hosts = time.monotonic(), _controller_cpu(), _host_counters()
    yield
    # A container gone meanwhile (a lab taken down) loses what it used since `began`; one restarted (a reboot) counts
    # from zero again: what it used since.
    after = _host_counters()
    in_hosts = sum(v - hosts.get(cid, 0.0) if v >= hosts.get(cid, 0.0) else v for cid, v in after.items())
    _COSTS.append((item.nodeid, time.monotonic() - began, _controller_cpu() - cpu, in_hosts))
