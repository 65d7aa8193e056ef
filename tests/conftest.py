# pytest puts this directory on sys.path (rootdir conftest, no __init__.py), so tests can import the
# helpers beside it (readiness_module.py).


def pytest_terminal_summary(terminalreporter):
    """The figures tests measured, printed at the end of the pytest run. pytest shows a passing test's output nowhere,
    and the suite (tests/suite.py) keeps each job's output in its log, so a test hands its figure over with
    record_property("figure", text) and this prints one line per figure after the run: `figure: <text>`.
    tests/suite.py echoes those lines when the job ends, so they reach CI's output."""
    lines = [value for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for name, value in getattr(report, "user_properties", ()) if name == "figure"]
    if lines:
        terminalreporter.write_sep("-", "figures measured")
        for line in lines:
            terminalreporter.write_line(f"figure: {line}")
