"""The figures tests measured, printed at the end of a pytest run. pytest shows a passing test's output nowhere, and
the suite (tests/suite.py) keeps each job's output in its log, so a test hands its figure over with
record_property("figure", text) and this prints one line per figure after the run: `figure: <text>`. tests/suite.py
echoes those lines when the job ends, so they reach CI's output.

tests/conftest.py prints them for the tests under tests/; molecule's verify step (molecule/common/verify.yml) loads
this file as a plugin (`-p figures`) for the scenarios' testinfra tests. Under tests/suite.py each line also goes to the
file MOEFLEET_FIGURES names (one per job), which the suite echoes when the job ends: a scenario's verify step shows
pytest's output only folded into its task's result."""

import os


def print_figures(terminalreporter) -> None:
    lines = [value for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for name, value in getattr(report, "user_properties", ()) if name == "figure"]
    if lines:
        terminalreporter.write_sep("-", "figures measured")
        for line in lines:
            terminalreporter.write_line(f"figure: {line}")
        # not from a pytest-xdist worker: the run's controller writes what its workers measured, once
        if os.environ.get("MOEFLEET_FIGURES") and not os.environ.get("PYTEST_XDIST_WORKER"):
            with open(os.environ["MOEFLEET_FIGURES"], "a", encoding="utf-8") as out:
                out.writelines(f"{' '.join(line.split())}\n" for line in lines)


def pytest_terminal_summary(terminalreporter):
    print_figures(terminalreporter)
