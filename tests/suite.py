"""Runs the parts of `make test` side by side: lint, the unit and oracle tests, the lab's pytest files and each
molecule scenario are independent jobs (each lab job brings up a lab of its own name; sim/lab/lab.py serialises
what labs share), run at most --jobs at a time in the order given (a job that mostly waits, WAITING, starts at once
and takes no slot), each logging to .lab/logs/<job>.log.

A lab job spends most of its time waiting on SSH, systemd and the simulated clock, so two or three of them fit on
this 2-core machine beside one CPU-bound job. The first failure stops the run: jobs not started are skipped, the
running ones are stopped, and the failed job's last lines are printed. A table closes the run: each job's wall time
and the CPU it used, on the controller (the job's processes) and in its lab hosts (their containers' cgroups, sampled
every 2 s; podman labels each host with the job that brought it up). On 2 cores the suite's length is about its
CPU total over two.

    python tests/suite.py [--jobs N] [JOB ...]      (no JOB: every job; a JOB may be a pattern, 'molecule-*';
                                                     `--list` names them)
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from playbook import lab_module  # tests/, beside this file: the lab's own podman settings

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".lab" / "logs"
LAB_PY = ROOT / "sim" / "lab" / "lab.py"
BIN = Path(sys.executable).parent


def _molecule(scenario: str) -> list[str]:
    return [str(BIN / "molecule"), "test", "-s", scenario]


def _pytest(*args: str) -> list[str]:
    return [str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", *args]


# The module payloads Ansible runs on the controller (connection local, delegate_to localhost) keep their bytecode
# between tasks, as the lab hosts' do: a lab speed-up only (sim/lab/controller/sitecustomize.py).
CONTROLLER_BYTECODE = {
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "sim" / "lab" / "controller"), os.environ.get("PYTHONPATH"))
                                  if p),
    "MOEFLEET_LAB_ANSIBALLZ_CACHE": str(ROOT / ".lab" / "ansiballz-controller"),
}
ROUTER_LAB = "tests/integration/test_router_lab.py"
SIM_TESTS = ("tests/sim", "tests/sim_hub", "tests/sim_mirrors", "tests/bench")
SIM_SELECTION = ("-m", "not lab and not oracle", *SIM_TESTS)

# In the order they start, longest first (a fresh-clone run of 2026-12-05, three at a time: lab-router 28 minutes, lab
# 23, molecule-rollback (its recovery tests included) 15, molecule-default 12, fleet 10, unit 6, install 5, oracle 3,
# lint 1.4), so the short ones fill in at the end.
JOBS: dict[str, list[str]] = {
    # the lab jobs' logs list each test's time (what its docstring states as its cost)
    "lab": _pytest("-m", "lab and not upgrade_lab", "--durations=0", "--durations-min=5", "tests",
                   "--ignore", ROUTER_LAB),
    "molecule-default": _molecule("default"),
    "lab-router": _pytest("-m", "lab", "--durations=0", "--durations-min=5", ROUTER_LAB),
    "molecule-rollback": _molecule("rollback"),
    "molecule-fleet": _molecule("fleet"),
    # The tests without a lab, in two jobs: the simulator's (which wait on its clock more than they compute: 1.5
    # CPU-minutes in 6.8 minutes; WAITING below) beside the rest (which compute: 5 CPU-minutes, in two processes
    # (pytest-xdist, a file's tests in one of them), so that it does not run on one core at the end of make check).
    "unit": _pytest("-n", "2", "--dist", "loadfile", "-m", "not lab and not oracle", "tests",
                    *(f"--ignore={d}" for d in SIM_TESTS)),
    "molecule-install": _molecule("install"),
    "oracle": _pytest("-m", "oracle", "tests/oracle"),
    "lint": ["make", "--no-print-directory", "lint"],
    "sim": _pytest(*SIM_SELECTION),
    # make check's: the same tests in two processes (a file's tests in one of them). Alone on 2 cores they take 3.5
    # minutes that way and 6.8 in one process; in make check the one process was its last 3 minutes, with a core idle
    # (2026-12-06: 8.9 of 8.9 minutes). Not in make test, where it would run beside three lab jobs: there, in four
    # processes (CI17), the simulator's timing tests failed at a load average of 15.
    "sim-parallel": _pytest("-n", "2", "--dist", "loadfile", *SIM_SELECTION),
    # make check's lab part: one traced deploy, on a lab of one host (the file's LAB_HOSTS; the "lab" job runs the
    # same file within the whole lab suite, on two).
    "lab-deploy": _pytest("-m", "lab", "-s", "tests/integration/test_deploy_trace_lab.py"),
    # make test-upgrade: moefleet upgrade on a lab of its own (5-6 minutes; not in make test, whose 35 minutes it
    # does not fit: tests/integration/test_upgrade_lab.py says why).
    "lab-upgrade": _pytest("-m", "upgrade_lab", "--durations=0", "tests/integration/test_upgrade_lab.py"),
    # make test-upgrade too: the router lab with its healthy-but-unusual hosts' rollout made the fleet's upgrade to
    # 0.5.23 under load, after a slower and a garbage 0.5.23 stopped at the canary (about 28 minutes alone; the upgrade
    # alone made the router lab 36.7 minutes long in make test).
    "lab-router-upgrade": ["env", "MOEFLEET_ROUTED_UPGRADE=1",
                           *_pytest("-m", "lab", "--durations=0", "--durations-min=5", ROUTER_LAB)],
}
# Jobs that mostly wait take no slot: they start at once beside the others. On 2 cores the suite is as long as its
# CPU over two, except at its end, when fewer jobs run than cores: a waiting job left for the end lengthened it by
# most of its own wall time (the sim job ran alone beside unit for the last 7 minutes of the 2026-12-05 runs).
WAITING = {"sim", "sim-parallel"}
CHECK_ONLY = {"sim-parallel", "lab-deploy", "lab-upgrade", "lab-router-upgrade"}  # not in make test
# A scenario added under molecule/ runs too, after the others, until it is given its place above.
for _scenario in sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")):
    JOBS.setdefault(f"molecule-{_scenario}", _molecule(_scenario))


CPUACCT = Path("/sys/fs/cgroup/cpuacct/libpod_parent")  # cgroup v1, podman's cgroupfs manager (LAB-NOTES)


def suite_job_of(cid: str) -> str:
    """The suite job whose lab brought a container up (its moefleet.suite-job label); "" for none, or when it is gone.
    tests/conftest.py counts each lab test's host CPU by it too."""
    out = subprocess.run(["podman", "inspect", "--format", '{{index .Config.Labels "moefleet.suite-job"}}', cid],
                         env=lab_module().podman_env(), capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


class HostCpu(threading.Thread):
    """CPU seconds used inside each job's lab hosts: every container's cgroup counter, read every 2 s until the
    container is gone, summed by its moefleet.suite-job label (sim/lab/lab.py sets it from MOEFLEET_SUITE_JOB); and
    how many cores the whole machine kept busy in each two minutes."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.last: dict[str, float] = {}  # container id -> its counter when last read
        self.job: dict[str, str] = {}
        self.done = threading.Event()
        self.window = (time.monotonic(), _machine_cpu())
        self.cores: list[float] = []  # cores busy on average in each two minutes of the run

    def sample(self) -> None:
        for counter in CPUACCT.glob("libpod-*/cpuacct.usage"):
            cid = counter.parent.name.removeprefix("libpod-")
            with contextlib.suppress(OSError, ValueError):
                self.last[cid] = int(counter.read_text()) / 1e9
                if cid not in self.job:
                    self.job[cid] = suite_job_of(cid)

    def run(self) -> None:
        while not self.done.wait(2):
            self.sample()
            now = time.monotonic()
            if now - self.window[0] >= 120:  # the machine's use, two minutes at a time
                busy = _machine_cpu()
                self.cores.append((busy - self.window[1]) / (now - self.window[0]))
                self.window = (now, busy)

    def by_job(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for cid, seconds in self.last.items():
            job = self.job.get(cid) or "(no job)"
            totals[job] = totals.get(job, 0.0) + seconds
        return totals


def _machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (not idle or waiting on I/O), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _wait_for(running: dict[str, tuple[subprocess.Popen, float]], seconds: float = 30.0) -> None:
    """Until the stopped jobs' processes are gone (or ``seconds``), so that none starts a container meanwhile."""
    end = time.monotonic() + seconds
    for proc, _ in running.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, end - time.monotonic()))


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _remove_labs_left_behind() -> None:
    """A job stopped with SIGTERM never runs its fixtures' or molecule's teardown: its lab containers would go on
    running (systemd, SGLang's simulator, the mirror), holding mounts under .lab/ and their network's DNS records,
    which a new clone at the same path then trips over. Take down every lab of this clone (its own podman storage)."""
    print("suite: removing the labs the stopped jobs left (sim/lab/lab.py down --all)", flush=True)
    subprocess.run([sys.executable, str(LAB_PY), "down", "--all"], cwd=ROOT, check=False, timeout=600)


def run(names: list[str], slots: int, keep_going: bool = False) -> int:
    LOGS.mkdir(parents=True, exist_ok=True)
    pending = list(names)
    running: dict[str, tuple[subprocess.Popen, float]] = {}

    def stop_all(signum, _frame):  # each job is a session of its own: take them down with this run
        for proc, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        if running:
            _wait_for(running)
            _remove_labs_left_behind()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    took: dict[str, float] = {}
    controller: dict[str, float] = {}
    hosts = HostCpu()
    hosts.start()
    busy = _machine_cpu()
    failed: str | None = None
    failed_too: list[str] = []  # with keep_going: every job that failed, the others left to finish
    stopped: list[str] = []  # jobs stopped because another failed
    started = time.monotonic()
    while (pending and failed is None) or running:
        while pending and failed is None:
            waiting = [n for n in pending if n in WAITING]
            if waiting:
                name = waiting[0]
            elif sum(n not in WAITING for n in running) < slots:
                name = pending[0]
            else:
                break
            pending.remove(name)
            log = LOGS / f"{name}.log"
            print(f"suite: {name} started (log: {log.relative_to(ROOT)})", flush=True)
            figures = LOGS / f"{name}.figures"
            figures.unlink(missing_ok=True)
            with open(log, "w") as out:
                # the venv's tools first on PATH (molecule runs ansible-config by name), as make sets it; the job's
                # pytest runs, a molecule scenario's verify step's too, write their figures to MOEFLEET_FIGURES as well
                # (tests/figures.py)
                env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                           MOEFLEET_SUITE_JOB=name, MOEFLEET_FIGURES=str(figures), **CONTROLLER_BYTECODE)
                proc = subprocess.Popen(JOBS[name], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=env)
            running[name] = (proc, time.monotonic())
        time.sleep(1)
        for name, (proc, since) in list(running.items()):
            # wait4: the job's own CPU and that of every process of it that was waited for (ansible, pytest, ...)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            proc.returncode = os.waitstatus_to_exitcode(status)
            controller[name] = usage.ru_utime + usage.ru_stime
            del running[name]
            took[name] = time.monotonic() - since
            verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"suite: {name} {verdict} in {took[name] / 60:.1f} min", flush=True)
            # A job's log stays on disk; the figures its tests measured (tests/figures.py; the OOM detection
            # p50/p95, the bench parts' smoke rows) are echoed here so that they are in CI's output.
            with contextlib.suppress(FileNotFoundError):
                for line in (LOGS / f"{name}.figures").read_text(errors="replace").splitlines():
                    print(f"suite: {name} figure: {line}", flush=True)
            if proc.returncode != 0 and keep_going:
                failed_too.append(name)
            elif proc.returncode != 0 and failed is None:
                failed = name
                for other, (p, _) in running.items():
                    stopped.append(other)
                    print(f"suite: stopping {other}", flush=True)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGTERM)
    if stopped:
        _remove_labs_left_behind()
    if failed_too and not failed:
        failed = failed_too[0]
    hosts.done.set()
    hosts.sample()
    in_hosts = hosts.by_job()
    outcome = f"failed at {', '.join(failed_too) or failed}" if failed else "all passed"
    print(f"\nsuite: {outcome} after {(time.monotonic() - started) / 60:.1f} min ({slots} at a time); the machine "
          f"was busy {(_machine_cpu() - busy) / 60:.1f} CPU-min")
    # Where the suite left cores idle (on 2 cores its length is about its CPU over two only while both are busy).
    print(f"  cores busy, each two minutes: {' '.join(f'{c:.1f}' for c in hosts.cores)}")
    print(f"  {'job':<20} {'wall':>8} {'CPU: controller':>16} {'lab hosts':>10}")
    for name in names:
        if name not in took:
            print(f"  {name:<20}  not run")
            continue
        print(f"  {name:<20} {took[name] / 60:4.1f} min {controller[name] / 60:11.1f} min "
              f"{in_hosts.get(name, 0.0) / 60:6.1f} min")
    if failed:
        log = LOGS / f"{failed}.log"
        print(f"\nsuite: last lines of {log.relative_to(ROOT)}:\n{_tail(log)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MOEFLEET_SUITE_JOBS", "3")),
                        help="how many jobs run at once (default 3, or $MOEFLEET_SUITE_JOBS)")
    parser.add_argument("--list", action="store_true", help="name the jobs, in the order they start")
    parser.add_argument("--keep-going", action="store_true", help="run every job even after one failed")
    parser.add_argument("job", nargs="*", help="jobs to run (default: all)")
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{j}{' (not in make test)' if j in CHECK_ONLY else ''}"
                        f"{' (starts at once, takes no slot)' if j in WAITING else ''}" for j in JOBS))
        return 0
    chosen = [j for j in JOBS if j not in CHECK_ONLY] if not args.job else []
    for pattern in args.job:  # a name, or a pattern: 'molecule-*'
        matched = [j for j in JOBS if fnmatch.fnmatchcase(j, pattern)]
        if not matched:
            parser.error(f"no job {pattern}; the jobs are: {', '.join(JOBS)}")
        chosen += [j for j in matched if j not in chosen]
    if args.jobs < 1:
        parser.error("--jobs must be 1 or more")
    return run(chosen, args.jobs, args.keep_going)


if __name__ == "__main__":
    sys.exit(main())
