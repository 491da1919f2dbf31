"""A pytest plugin (`tests/conftest.py` loads it): `--cpu-durations=N` lists the N tests that used the most CPU time.

On a 2-core machine the suite's wall time is its CPU work divided among the cores, and a test's wall time says as
much about what ran beside it as about the test (the same gradient test took 82 s and 268 s of wall for 9 s and 25 s
of CPU on one loaded host). CPU seconds, the process's own and those of the subprocesses it waited for (a
`launch.train` run), are what a test costs the suite, whatever the load. Module fixtures count in the first test
that uses them.
"""

from __future__ import annotations

import os

import pytest

_START = pytest.StashKey[float]()
_PROPERTY = "cpu_seconds"
# Per test id, its CPU seconds, as this process (the controller, under xdist) received them.
_totals: dict[str, float] = {}


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that used the most CPU time, subprocesses included (0: none)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "teardown" and _START in item.stash:
        report.user_properties.append((_PROPERTY, cpu_seconds() - item.stash[_START]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist this runs in the controller too, with the workers' reports: their user_properties come along.
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == _PROPERTY:
                _totals[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    count = config.getoption("--cpu-durations")
    if count <= 0 or not _totals:
        return
    terminalreporter.write_sep("=", f"most CPU time, {count} tests (subprocesses included)")
    for nodeid, seconds in sorted(_totals.items(), key=lambda item: -item[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")
    terminalreporter.write_line(f"{sum(_totals.values()):8.1f}s cpu  all {len(_totals)} tests")
